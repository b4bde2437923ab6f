"""A `tool_choice` naming no tool of the session is refused before anything is written."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.tools import tool

from stello_graph import InvalidInputError, Session, StelloAgent
from stello_graph.checkpoints import InMemoryMainStorage
from stello_graph.testing import ScriptedChatModel
from tests._helpers import settle


@tool
def lookup(query: str) -> str:
    """Look something up."""
    return query


class LenientModel(ScriptedChatModel):
    """A chat model that, like many providers' clients, binds any `tool_choice` unchecked
    (the provider would refuse it only once the request is sent)."""

    def bind_tools(self, tools: Any, *, tool_choice: Any = None, **kwargs: Any) -> Any:
        return super().bind_tools(tools, **kwargs)


def dump(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[StelloAgent]:
    with StelloAgent(
        model=LenientModel(default="ok"), storage=tmp_path / "a.db", tools=[lookup]
    ) as made:
        made.turn(made.main_session_id, "warm up")  # the checkpoint tables exist now
        yield made


TURNS: dict[str, Callable[..., Any]] = {
    "turn": lambda a, sid, choice: a.turn(sid, "hi", tool_choice=choice),
    "aturn": lambda a, sid, choice: a.aturn(sid, "hi", tool_choice=choice),
    "stream": lambda a, sid, choice: a.stream(sid, "hi", tool_choice=choice),
    "astream": lambda a, sid, choice: a.astream(sid, "hi", tool_choice=choice),
}
UNKNOWN = ["nope", {"type": "function", "function": {"name": "nope"}}]


@pytest.mark.parametrize("choice", UNKNOWN, ids=["name", "dict"])
@pytest.mark.parametrize("run", TURNS.values(), ids=TURNS.keys())
async def test_unknown_tool_is_refused_before_the_graph_runs(
    agent: StelloAgent, tmp_path: Path, run: Callable[..., Any], choice: Any
) -> None:
    child = agent.fork(agent.main_session_id, "Child").id
    before = dump(tmp_path / "a.db")
    with pytest.raises(InvalidInputError, match="'nope' names no tool of session") as caught:
        await settle(run(agent, child, choice))
    assert "'lookup'" in str(caught.value) and "'create_session'" in str(caught.value)
    assert dump(tmp_path / "a.db") == before


DEEP: Any = []
for _ in range(100_000):
    DEEP = [DEEP]

MALFORMED: dict[str, tuple[Any, str]] = {
    "name not a string": (
        {"type": "function", "function": {"name": 5}},
        "must name its tool with a non-empty string",
    ),
    "empty name": ({"type": "function", "function": {"name": " "}}, "non-empty string"),
    "function not a dict": ({"type": "function", "function": "lookup"}, "non-empty string"),
    "no function": ({"type": "function"}, "non-empty string and nothing else"),
    "extra key": (
        {"type": "function", "function": {"name": "lookup"}, "strict": [1]},
        "nothing else",
    ),
    "extra function key": (
        {"type": "function", "function": {"name": "lookup", "arguments": {}}},
        "nothing else",
    ),
    "type not a string": ({"type": 5, "name": "lookup"}, "'type' must be a non-empty string"),
    "anthropic name not a string": ({"type": "tool", "name": None}, "non-empty string"),
    "key not a string": ({1: "lookup"}, "needs string keys"),
    "empty dict": ({}, "needs string keys"),
    "deep": ({"type": "any", "x": DEEP}, "more than 64 levels deep"),
    "not a choice": (3.5, "tool_choice must be 'auto', 'required', 'any', a tool name"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(MALFORMED))
@pytest.mark.parametrize("run", TURNS.values(), ids=TURNS.keys())
async def test_a_malformed_tool_choice_is_refused_before_the_graph_runs(
    agent: StelloAgent, tmp_path: Path, run: Callable[..., Any], case: str
) -> None:
    choice, message = MALFORMED[case]
    before = dump(tmp_path / "a.db")
    with pytest.raises(InvalidInputError, match="tool_choice") as caught:
        await settle(run(agent, agent.main_session_id, choice))
    assert message in str(caught.value)
    assert dump(tmp_path / "a.db") == before


@pytest.mark.parametrize(
    "choice",
    [
        {"type": "function", "name": "lookup"},  # the OpenAI Responses API's form
        {"type": "tool", "name": "lookup"},  # Anthropic's
        {"type": "any"},
        {"tool": {"name": "lookup"}},  # Bedrock's
    ],
)
def test_other_providers_dicts_pass(choice: Any) -> None:
    storage = InMemoryMainStorage()
    session = Session.create(storage, model=LenientModel(default="ok"), tools=[lookup])
    assert session.send("hi", tool_choice=choice).content == "ok"


@pytest.mark.parametrize("run", TURNS.values(), ids=TURNS.keys())
async def test_known_tools_and_modes_still_run(agent: StelloAgent, run: Callable[..., Any]) -> None:
    sid = agent.main_session_id
    for choice in (
        "lookup",
        "auto",
        "required",
        {"type": "function", "function": {"name": "lookup"}},
    ):
        await settle(run(agent, sid, choice))


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_session_checks_it_too(mode: str) -> None:
    """The check inside the turn, for graphs and sessions driven directly."""
    storage = InMemoryMainStorage()
    session = Session.create(storage, model=LenientModel(default="ok"), tools=[lookup])
    send = session.send if mode == "sync" else session.asend
    with pytest.raises(InvalidInputError, match="'nope' names no tool of session"):
        await settle(send("hi", tool_choice="nope"))
    assert storage.list_records(session.id) == []
    reply: Any = await settle(send("hi", tool_choice="lookup"))
    assert reply.content == "ok"
    records: list[BaseMessage] = storage.list_records(session.id)
    assert isinstance(records[-1], AIMessage)
