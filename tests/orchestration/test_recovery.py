"""Turns that run again after a crash or fail half-way: nothing duplicated, nothing half-stored.

Each test here pins a defect the reliability suites (`tests/reliability`) found.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.messages.tool import ToolCall
from langchain_core.runnables import RunnableConfig
from langgraph.types import StateSnapshot

from stello_graph import SessionArchivedError
from stello_graph._compiled import allow_replay
from stello_graph.testing import ScriptedChatModel
from tests.orchestration.conftest import AgentFactory, lose_last_checkpoint


def _in_turn(messages: list[BaseMessage]) -> list[BaseMessage]:
    """The messages of the turn in flight (from its user message on)."""
    last = max(i for i, m in enumerate(messages) if m.type == "human")
    return messages[last:]


def _before(history: Iterable[StateSnapshot], node: str) -> RunnableConfig:
    """The config of the checkpoint taken just before `node` ran."""
    for snapshot in history:
        if snapshot.next == (node,):
            return snapshot.config
    raise AssertionError(f"no checkpoint before {node!r}")


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_rerun_tool_round_does_not_fork_twice(make_agent: AgentFactory, mode: str) -> None:
    def fork_once(messages: list[BaseMessage]) -> Any:
        if any(m.type == "tool" for m in _in_turn(messages)):
            return "Branched."
        return ScriptedChatModel.tool_call("create_session", {"label": "Deep dive"}, id="c1")

    model = ScriptedChatModel(respond=fork_once)
    # every step on disk (kept, the default "exit" keeps a turn's last checkpoint only)
    agent = make_agent(model=model, prune_checkpoints=False, durability="sync")
    parent = agent.fork(agent.main_session_id, "Parent")
    agent.turn(parent.id, "let's branch")
    config = agent.config(parent.id)
    before_tools = _before(agent.graph.get_state_history(config), "tools")
    # the tool round runs again, as after a crash between the fork and the round's checkpoint
    if mode == "sync":
        agent.graph.invoke(None, allow_replay(before_tools))
    else:
        await agent.graph.ainvoke(None, allow_replay(before_tools))
    children = agent.storage.get_children(parent.id)
    assert [c.label for c in children] == ["Deep dive"]
    assert len(agent.session(parent.id).messages()) == 4  # the turn, committed once
    # another turn asking for the same label gets a session of its own
    agent.turn(parent.id, "again")
    assert [c.label for c in agent.storage.get_children(parent.id)] == ["Deep dive"] * 2


async def test_reply_reusing_an_id_does_not_replace_a_record(make_agent: AgentFactory) -> None:
    # Providers (and a turn resumed in a new process) can hand out an id already used in
    # the turn; the reply must be added, not replace the earlier record with that id.
    model = ScriptedChatModel(
        [
            AIMessage(content="", id="same", tool_calls=[_call("create_session", label="B")]),
            AIMessage(content="done", id="same"),
        ]
        * 2
    )
    agent = make_agent(model=model)
    sid = agent.main_session_id
    assert agent.turn(sid, "first").content == "done"
    assert (await agent.aturn(sid, "second")).content == "done"
    kinds = [m.type for m in agent.session(sid).messages()]
    assert kinds == ["human", "ai", "tool", "ai"] * 2
    assert agent.storage.get_turn_count(sid) == 2


def _call(name: str, **args: Any) -> ToolCall:
    return {"name": name, "args": args, "id": f"call-{name}", "type": "tool_call"}


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_turn_resumed_after_archive_is_refused(make_agent: AgentFactory, mode: str) -> None:
    model = ScriptedChatModel(["the answer"])
    agent = make_agent(model=model)
    branch = agent.fork(agent.main_session_id, "B")
    agent.storage.put_insight(branch.id, "an insight")
    config = agent.config(branch.id)
    # a turn that crashed before its step (the model call and the commit) ...
    agent.graph.invoke({"session_id": branch.id, "input": "q"}, config, interrupt_before=["model"])
    agent.archive(branch.id)  # ... and the session archived before it is resumed
    # the step itself refuses (a graph resumed directly, another process archiving) ...
    run = agent.graph.invoke if mode == "sync" else agent.graph.ainvoke
    with pytest.raises(SessionArchivedError, match="archived"):
        await _maybe_await(run(None, config))
    # ... and the agent refuses before the graph runs
    resume = agent.resume if mode == "sync" else agent.aresume
    with pytest.raises(SessionArchivedError, match="archived"):
        await _maybe_await(resume(branch.id))
    assert agent.session(branch.id).messages() == []
    assert agent.storage.get_turn_count(branch.id) == 0
    assert agent.storage.get_insight(branch.id) == "an insight"


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_resumed_commit_after_another_writer_never_duplicates(
    make_agent: AgentFactory, mode: str
) -> None:
    agent = make_agent(  # every step on disk (kept, "exit": only its last step)
        model=ScriptedChatModel(["reply"]), prune_checkpoints=False, durability="sync"
    )
    sid = agent.main_session_id
    agent.turn(sid, "question")
    # another process appends a turn of its own to the same session ...
    agent.storage.append_records(sid, [HumanMessage("other"), AIMessage("x")], user_turn=True)
    # ... before this turn is resumed from just before its step (a crash right after its
    # commit, before the step's checkpoint was written)
    lose_last_checkpoint(agent, sid)
    before_commit = agent.config(sid)
    run = agent.graph.invoke if mode == "sync" else agent.graph.ainvoke
    await _maybe_await(run(None, allow_replay(before_commit)))
    contents = [m.content for m in agent.session(sid).messages()]
    assert contents == ["question", "reply", "other", "x"]
    assert agent.storage.get_turn_count(sid) == 2


def _back_to_input(agent: Any, sid: str) -> None:
    """What a crash leaves when only the turn's input checkpoint had reached the disk (the
    START step's writes and every later step still on their way): a resume runs the START
    step again, and LangGraph gives every step after it new checkpoint ids."""
    assert agent.checkpointer is not None
    while agent.checkpointer.get_tuple(agent.config(sid)).metadata.get("source") != "input":
        lose_last_checkpoint(agent, sid)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_turn_resumed_from_its_input_forks_and_commits_once(
    make_agent: AgentFactory, mode: str
) -> None:
    failed: list[bool] = []

    def fork_then_fail_once(messages: list[BaseMessage]) -> Any:
        if not any(m.type == "tool" for m in _in_turn(messages)):
            return ScriptedChatModel.tool_call("create_session", {"label": "Deep dive"}, id="c1")
        if not failed:  # the process dies after the fork, before the turn's commit
            failed.append(True)
            raise RuntimeError("killed")
        return "Branched."

    agent = make_agent(
        model=ScriptedChatModel(respond=fork_then_fail_once),
        prune_checkpoints=False,
        durability="sync",
    )
    parent = agent.fork(agent.main_session_id, "Parent").id
    with pytest.raises(Exception, match="killed"):
        agent.turn(parent, "let's branch")
    _back_to_input(agent, parent)
    resume = agent.resume if mode == "sync" else agent.aresume
    assert (await _maybe_await(resume(parent))).content == "Branched."
    assert [c.label for c in agent.storage.get_children(parent)] == ["Deep dive"]
    assert [m.type for m in agent.session(parent).messages()] == ["human", "ai", "tool", "ai"]
    # the committed turn resumed again from its input is returned, not stored twice
    _back_to_input(agent, parent)
    assert (await _maybe_await(resume(parent))).content == "Branched."
    assert len(agent.session(parent).messages()) == 4
    assert agent.storage.get_turn_count(parent) == 1
