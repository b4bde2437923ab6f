"""Turns through the graph: tools, round limit, interrupts, crash-resume, archive, streaming."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.types import interrupt

from stello_graph import (
    InvalidInputError,
    ModelCallError,
    Session,
    SessionArchivedError,
    SessionNotFoundError,
    ToolRoundLimitError,
)
from stello_graph.testing import ScriptedChatModel
from tests.orchestration.conftest import AgentFactory, lose_last_checkpoint


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool
def explode(reason: str) -> str:
    """A tool that always fails."""
    raise RuntimeError(f"boom: {reason}")


def test_turn_with_parallel_tools_one_failing(make_agent: AgentFactory) -> None:
    model = ScriptedChatModel(
        [
            ScriptedChatModel.tool_calls(
                [("add", {"a": 2, "b": 3}), ("explode", {"reason": "disk"})]
            ),
            "2+3 is 5; the other tool failed.",
        ]
    )
    agent = make_agent(model=model, tools=[add, explode])
    branch = agent.fork(agent.main_session_id, "Math")
    result = agent.turn(branch.id, "compute")
    assert result.content == "2+3 is 5; the other tool failed."
    assert result.tool_rounds == 1
    assert [c["name"] for c in result.tool_calls] == ["add", "explode"]
    # the second model call saw both results, the failure as an error result
    second = model.prompts[1]
    results = [m for m in second if isinstance(m, ToolMessage)]
    assert results[0].content == "5"
    assert "boom: disk" in str(results[1].content) and results[1].status == "error"
    records = agent.session(branch.id).messages()
    assert [type(m).__name__ for m in records] == [
        "HumanMessage", "AIMessage", "ToolMessage", "ToolMessage", "AIMessage",
    ]  # fmt: skip
    assert model.calls[0].tools == ["add", "explode", "create_session"]


def test_turn_usage_sums_every_model_call_of_the_turn(make_agent: AgentFactory) -> None:
    model = ScriptedChatModel([ScriptedChatModel.tool_call("add", {"a": 2, "b": 3}), "5"])
    agent = make_agent(model=model, tools=[add])
    branch = agent.fork(agent.main_session_id, "Math")
    result = agent.turn(branch.id, "compute")
    replies = [m for m in agent.session(branch.id).messages() if isinstance(m, AIMessage)]
    usages = [m.usage_metadata for m in replies]
    assert len(usages) == 2 and all(u is not None and u["input_tokens"] > 0 for u in usages)
    assert result.usage is not None
    for key in ("input_tokens", "output_tokens", "total_tokens"):
        assert result.usage[key] == sum(u[key] for u in usages if u is not None)
    silent = make_agent(model=ScriptedChatModel(default="ok", usage=False))
    assert silent.turn(silent.main_session_id, "hi").usage is None


def test_tool_round_limit_leaves_l3_clean(make_agent: AgentFactory) -> None:
    model = ScriptedChatModel(
        respond=lambda msgs: ScriptedChatModel.tool_call("add", {"a": 1, "b": 1})
    )
    agent = make_agent(model=model, tools=[add], max_tool_rounds=2)
    sid = agent.main_session_id
    with pytest.raises(ToolRoundLimitError, match="max_tool_rounds=2"):
        agent.turn(sid, "loop forever")
    assert model.call_count == 3
    assert agent.session(sid).messages() == []
    assert agent.storage.get_turn_count(sid) == 0


def test_model_error_leaves_l3_clean_and_keeps_insight(make_agent: AgentFactory) -> None:
    model = ScriptedChatModel([RuntimeError("503"), "fine"])
    agent = make_agent(model=model)
    branch = agent.fork(agent.main_session_id, "B")
    agent.storage.put_insight(branch.id, "an insight")
    with pytest.raises(ModelCallError, match="503"):
        agent.turn(branch.id, "hi")
    assert agent.session(branch.id).messages() == []
    assert agent.storage.get_insight(branch.id) == "an insight"
    assert agent.turn(branch.id, "hi").content == "fine"
    assert agent.storage.get_insight(branch.id) is None


def test_interrupt_and_resume(make_agent: AgentFactory) -> None:
    approvals: list[Any] = []

    @tool
    def delete_everything(target: str) -> str:
        """Dangerous: needs a human's approval."""
        answer = interrupt({"action": "delete", "target": target})
        approvals.append(answer)
        return "deleted" if answer == "yes" else "cancelled"

    model = ScriptedChatModel(
        [ScriptedChatModel.tool_call("delete_everything", {"target": "/tmp/x"}), "Done."]
    )
    agent = make_agent(model=model, tools=[delete_everything])
    sid = agent.main_session_id
    paused = agent.turn(sid, "clean up")
    assert paused.interrupted
    assert paused.interrupts[0].value == {"action": "delete", "target": "/tmp/x"}
    assert agent.session(sid).messages() == []  # nothing committed while waiting
    done = agent.resume(sid, "yes")
    assert not done.interrupted
    assert done.content == "Done."
    assert approvals == ["yes"]
    kinds = [type(m).__name__ for m in agent.session(sid).messages()]
    assert kinds == ["HumanMessage", "AIMessage", "ToolMessage", "AIMessage"]
    assert agent.session(sid).messages()[2].content == "deleted"


def test_resumed_commit_never_duplicates(make_agent: AgentFactory) -> None:
    model = ScriptedChatModel(["reply"])
    # every step on disk: kept, the default ("exit") keeps a turn's last checkpoint only
    agent = make_agent(model=model, prune_checkpoints=False, durability="sync")
    sid = agent.main_session_id
    agent.turn(sid, "question")
    config = agent.config(sid)
    lose_last_checkpoint(agent, sid)  # a crash between the step's commit and its checkpoint
    assert agent.graph.get_state(config).next == ("model",)  # the turn looks in flight
    # resuming runs the turn's step (model call and commit) again: it finds its turn stored
    # and calls no model
    out = agent.graph.invoke(None, config)
    assert out["content"] == "reply"
    assert model.call_count == 1
    assert [m.content for m in agent.session(sid).messages()] == ["question", "reply"]
    assert agent.storage.get_turn_count(sid) == 1


def test_a_turn_stopped_before_its_step_resumes_with_its_input(make_agent: AgentFactory) -> None:
    model = ScriptedChatModel(["the answer"])
    agent = make_agent(model=model)
    sid = agent.main_session_id
    config = agent.config(sid)
    agent.graph.invoke(
        {"session_id": sid, "input": "q"}, config, interrupt_before=["model"], durability="sync"
    )
    assert agent.session(sid).messages() == []  # the in-flight turn lives in the checkpoint
    assert model.call_count == 0
    result = agent.resume(sid)
    assert result.content == "the answer"
    assert model.call_count == 1
    assert [m.content for m in agent.session(sid).messages()] == ["q", "the answer"]


def test_archive_then_turn_is_refused(make_agent: AgentFactory) -> None:
    agent = make_agent(model=ScriptedChatModel(default="ok"))
    branch = agent.fork(agent.main_session_id, "B")
    agent.turn(branch.id, "hi")
    agent.archive(branch.id)
    with pytest.raises(SessionArchivedError, match=branch.id):
        agent.turn(branch.id, "again")
    with pytest.raises(SessionArchivedError):
        agent.session(branch.id).send("direct")  # enforced by the session itself
    with pytest.raises(InvalidInputError, match="main session cannot be archived"):
        agent.archive(agent.main_session_id)


def test_bad_turn_input(make_agent: AgentFactory) -> None:
    model = ScriptedChatModel(default="ok")
    agent = make_agent(model=model)
    with pytest.raises(SessionNotFoundError):
        agent.turn("no-such-session", "hi")
    for bad in ("", "  ", None, 3):
        with pytest.raises(InvalidInputError):
            agent.turn(agent.main_session_id, bad)  # type: ignore[arg-type]
    assert model.call_count == 0


def test_stream_modes(make_agent: AgentFactory) -> None:
    model = ScriptedChatModel(
        [ScriptedChatModel.tool_call("add", {"a": 1, "b": 2}), "One plus two is three."]
    )
    agent = make_agent(model=model, tools=[add])
    sid = agent.main_session_id
    items = list(agent.stream(sid, "1+2", stream_mode=["messages", "custom", "updates"]))
    tokens = [data[0] for mode, data in items if mode == "messages"]
    assert all(isinstance(t, AIMessageChunk) for t in tokens)
    assert "".join(t.text for t in tokens) == "One plus two is three."
    events = [data["event"] for mode, data in items if mode == "custom"]
    assert events == ["turn_started", "tool_call", "tool_result", "turn_committed"]
    updates = [next(iter(data)) for mode, data in items if mode == "updates"]
    assert updates == ["model", "tools", "model"]  # the first round opens, the last commits
    assert len(agent.session(sid).messages()) == 4


def test_messages_stream_excludes_consolidation_tokens(make_agent: AgentFactory) -> None:
    summariser = ScriptedChatModel(default="SUMMARY TOKENS")
    from stello_graph import llm_consolidator

    branch_of: dict[str, str] = {}

    @tool
    def consolidate_now() -> str:
        """Consolidate the branch (a model call inside the turn)."""
        return agent.consolidate(branch_of["B"]) or ""

    agent = make_agent(
        model=ScriptedChatModel(
            ["reply words", ScriptedChatModel.tool_call("consolidate_now", {}), "done now"]
        ),
        tools=[consolidate_now],
        consolidate_fn=llm_consolidator(summariser),
    )
    branch = agent.fork(agent.main_session_id, "B")
    branch_of["B"] = branch.id
    agent.turn(branch.id, "first")
    text = "".join(chunk.text for chunk, _ in agent.stream(agent.main_session_id, "go"))
    assert text == "done now"
    assert summariser.call_count == 1


async def test_async_turns_and_stream(make_agent: AgentFactory) -> None:
    model = ScriptedChatModel(default="async reply")
    agent = make_agent(model=model)
    branch = await agent.afork(agent.main_session_id, "A")
    result = await agent.aturn(branch.id, "hello")
    assert result.content == "async reply"
    chunks = [c async for c, _ in agent.astream(branch.id, "again")]
    assert "".join(c.text for c in chunks) == "async reply"
    assert len(await agent.session(branch.id).amessages()) == 4


def test_model_initiated_fork_has_no_orphans(make_agent: AgentFactory) -> None:
    model = ScriptedChatModel(
        [
            ScriptedChatModel.tool_call(
                "create_session", {"label": "Deep dive", "context": "inherit"}
            ),
            "Branched.",
            "Child reply",
        ]
    )
    agent = make_agent(model=model)
    parent = agent.fork(agent.main_session_id, "Parent")
    agent.turn(parent.id, "let's branch")
    (child,) = agent.storage.get_children(parent.id)
    assert child.label == "Deep dive"
    tool_result = agent.session(parent.id).messages()[2]
    assert isinstance(tool_result, ToolMessage)
    assert f'"session_id": "{child.id}"' in str(tool_result.content)
    # the child inherited the parent's history as it was when forked (before this turn)
    assert agent.session(child.id).messages() == []
    assert agent.turn(child.id, "hi").content == "Child reply"
    for node in agent.storage.get_tree():
        assert agent.storage.get_session(node.id) is not None


def test_one_session_is_serialised_many_run_in_parallel(make_agent: AgentFactory) -> None:
    active: dict[str, int] = {}
    overlap = {"same": 0, "max_total": 0}
    guard = threading.Lock()

    def reply(messages: list[Any]) -> str:
        sid = next(m.text for m in messages if isinstance(m, HumanMessage)).split(":")[0]
        with guard:
            active[sid] = active.get(sid, 0) + 1
            overlap["same"] = max(overlap["same"], active[sid])
            overlap["max_total"] = max(overlap["max_total"], sum(active.values()))
        time.sleep(0.02)
        with guard:
            active[sid] -= 1
        return "ok"

    agent = make_agent(model=ScriptedChatModel(respond=reply))
    ids = [agent.fork(agent.main_session_id, f"S{i}").id for i in range(4)]
    threads = [
        threading.Thread(target=agent.turn, args=(sid, f"{sid}: turn {n}"))
        for sid in ids
        for n in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlap["same"] == 1
    assert overlap["max_total"] > 1
    for sid in ids:
        assert agent.storage.get_turn_count(sid) == 3
        assert len(agent.session(sid).messages()) == 6


async def test_asyncio_concurrency(make_agent: AgentFactory) -> None:
    agent = make_agent(model=ScriptedChatModel(default="ok", latency=0.01))
    ids = [(await agent.afork(agent.main_session_id, f"S{i}")).id for i in range(5)]
    await asyncio.gather(*(agent.aturn(sid, f"t{n}") for sid in ids for n in range(4)))
    for sid in ids:
        texts = [m.text for m in await agent.session(sid).amessages(role="user")]
        assert sorted(texts) == ["t0", "t1", "t2", "t3"]
        assert await agent.storage.aget_turn_count(sid) == 4


def test_reply_records_keep_tool_calls(make_agent: AgentFactory) -> None:
    model = ScriptedChatModel([ScriptedChatModel.tool_call("add", {"a": 1, "b": 1}), "2"])
    agent = make_agent(model=model, tools=[add])
    agent.turn(agent.main_session_id, "1+1")
    stored = agent.session(agent.main_session_id).messages()[1]
    assert isinstance(stored, AIMessage) and stored.tool_calls[0]["name"] == "add"


def test_tool_choice_forces_only_the_first_call_of_a_turn(make_agent: AgentFactory) -> None:
    model = ScriptedChatModel(
        [ScriptedChatModel.tool_call("add", {"a": 1, "b": 2}), "3", "plain answer"]
    )
    agent = make_agent(model=model, tools=[add])
    sid = agent.main_session_id
    assert agent.turn(sid, "1+2", tool_choice="add").content == "3"
    assert [c.tool_choice for c in model.calls] == ["add", None]
    agent.turn(sid, "no force this time")
    assert model.calls[-1].tool_choice is None  # a turn's choice does not leak into the next
    with pytest.raises(InvalidInputError, match="tool_choice"):
        agent.turn(sid, "x", tool_choice="")
    assert model.call_count == 3


def test_session_send_with_tool_choice(make_agent: AgentFactory) -> None:
    model = ScriptedChatModel([ScriptedChatModel.tool_call("add", {"a": 1, "b": 1})])
    agent = make_agent(model=model, tools=[add])
    session = agent.session(agent.main_session_id)
    assert session.send("1+1", tool_choice="required").tool_calls[0]["name"] == "add"
    assert model.calls[0].tool_choice == "required"
    bare = Session.create(agent.storage, model=model)  # a session with no tools at all
    with pytest.raises(InvalidInputError, match="has no tools"):
        bare.send("hi", tool_choice="required")
    assert model.call_count == 1
