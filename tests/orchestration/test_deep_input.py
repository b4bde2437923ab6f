"""Nesting depth is bounded where structured input enters: metadata, tags, profile variables
and the arguments of a model's tool calls. Deeper input is refused with a typed error before
anything is written (it used to raise `RecursionError`, or fail in the checkpoint serializer
after the model call)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.tools import tool

from stello_graph import (
    ForkProfile,
    InvalidInputError,
    ModelCallError,
    Session,
    StelloAgent,
)
from stello_graph._validate import MAX_DEPTH, too_deep
from stello_graph.checkpoints import InMemoryMainStorage
from stello_graph.export import export_tree
from stello_graph.testing import ScriptedChatModel
from tests._helpers import settle
from tests.orchestration.conftest import AgentFactory


def nested(levels: int) -> Any:
    """A value of `levels` dicts inside each other (built without recursion)."""
    value: Any = "leaf"
    for _ in range(levels):
        value = {"k": value}
    return value


def nested_list(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = [value]
    return value


@tool
def lookup(query: Any) -> str:
    """Look something up."""
    return "found"


PROFILE = ForkProfile(name="reviewer", system_prompt="You review {topic}.")


def stored(agent: StelloAgent) -> Any:
    return export_tree(agent.storage, records=True)


def test_depth_is_measured_without_recursion() -> None:
    assert not too_deep(nested(MAX_DEPTH))
    assert too_deep(nested(MAX_DEPTH + 1))
    assert too_deep(nested(1_000_000))
    assert too_deep(nested_list(MAX_DEPTH + 1)) and not too_deep(nested_list(MAX_DEPTH))
    loop: dict[str, Any] = {}
    loop["self"] = loop
    assert too_deep(loop)  # a cycle is infinitely deep
    assert not too_deep("x" * 10) and not too_deep({"a": [1, {"b": (2, 3)}]})


DEEP_FORKS: dict[str, tuple[dict[str, Any], str]] = {
    "metadata": ({"metadata": nested(100_000)}, "metadata nests"),
    "metadata one level too deep": ({"metadata": nested(MAX_DEPTH + 1)}, "metadata nests"),
    "metadata list": ({"metadata": {"k": nested_list(100_000)}}, "metadata nests"),
    "tags": ({"tags": nested_list(100_000)}, "tags nests"),
    "profile_vars": ({"profile": "reviewer", "profile_vars": nested(100_000)}, "profile_vars"),
    "profile_vars value": (
        {"profile": "reviewer", "profile_vars": {"topic": nested(100_000)}},
        "profile_vars nests",
    ),
    "profile_vars without a profile": ({"profile_vars": nested(100_000)}, "profile_vars nests"),
}


@pytest.mark.parametrize("case", list(DEEP_FORKS))
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_deep_fork_options_are_refused_and_change_nothing(
    make_agent: AgentFactory, case: str, mode: str
) -> None:
    agent = make_agent(model=ScriptedChatModel(default="ok"), profiles=[PROFILE])
    agent.turn(agent.main_session_id, "hello")
    before = stored(agent)
    options, message = DEEP_FORKS[case]
    fork = agent.fork if mode == "sync" else agent.afork
    with pytest.raises(InvalidInputError, match=f"more than {MAX_DEPTH} levels deep") as caught:
        await settle(fork(agent.main_session_id, "Deep", **options))
    assert message in str(caught.value)
    assert stored(agent) == before


def test_metadata_at_the_limit_is_kept(make_agent: AgentFactory) -> None:
    agent = make_agent(model=ScriptedChatModel(default="ok"))
    child = agent.fork(agent.main_session_id, "Deep enough", metadata=nested(MAX_DEPTH))
    meta = agent.storage.get_session(child.id)
    assert meta is not None and meta.metadata == nested(MAX_DEPTH)


def test_deep_values_are_refused_at_the_storage_and_session_too(make_agent: AgentFactory) -> None:
    agent = make_agent(model=ScriptedChatModel(default="ok"))
    child = agent.fork(agent.main_session_id, "Child").id
    before = stored(agent)
    session = agent.session(child)
    assert isinstance(session, Session)
    calls: list[Callable[[], object]] = [
        lambda: session.update_meta(metadata=nested(100_000)),
        lambda: session.update_meta(tags=nested_list(100_000)),
        lambda: agent.storage.put_global("k", nested(100_000)),
        lambda: agent.storage.list_sessions(tags=nested(100_000)),
    ]
    for call in calls:
        with pytest.raises(InvalidInputError, match="levels deep"):
            call()
    assert stored(agent) == before
    assert agent.storage.get_global("k") is None


# -- the arguments of a model's tool calls ---------------------------------------------------
def deep_call_model() -> ScriptedChatModel:
    return ScriptedChatModel(
        [ScriptedChatModel.tool_call("lookup", {"query": nested(400)})], default="done"
    )


TURNS = {
    "turn": lambda a, sid: a.turn(sid, "look it up"),
    "aturn": lambda a, sid: a.aturn(sid, "look it up"),
    "stream": lambda a, sid: a.stream(sid, "look it up"),
    "astream": lambda a, sid: a.astream(sid, "look it up"),
}


@pytest.mark.parametrize("run", list(TURNS))
async def test_a_reply_with_deep_tool_arguments_is_refused_and_stores_nothing(
    make_agent: AgentFactory, run: str
) -> None:
    agent = make_agent(model=deep_call_model(), tools=[lookup])
    child = agent.fork(agent.main_session_id, "Child").id
    session = agent.session(child)
    assert isinstance(session, Session)
    session.set_insight("keep me")
    before = stored(agent)
    saver = agent.checkpointer
    assert saver is not None
    with pytest.raises(ModelCallError, match="nested more than 64 levels deep") as caught:
        await settle(TURNS[run](agent, child))
    assert caught.value.session_id == child and "'lookup'" in str(caught.value)
    assert stored(agent) == before  # no record, the insight kept
    for kept in saver.list(agent.config(child)):  # no checkpoint holds the reply
        assert "pending" not in kept.checkpoint["channel_values"]
        assert "pending" not in {write[1] for write in kept.pending_writes or ()}
    # the session goes on: the next reply is an ordinary one
    assert (await settle(agent.aturn(child, "again"))).content == "done"


@pytest.mark.parametrize("mode", ["send", "asend", "stream", "astream"])
async def test_a_session_refuses_deep_tool_arguments_too(mode: str) -> None:
    storage = InMemoryMainStorage()
    session = Session.create(storage, model=deep_call_model(), tools=[lookup])
    with pytest.raises(ModelCallError, match="levels deep"):
        await settle(getattr(session, mode)("look it up"))
    assert storage.list_records(session.id) == []
