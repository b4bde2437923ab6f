"""A checkpointer of the user's that the agent does not prune: the agent's turns run on it as
LangGraph runs any graph, with the durability `"exit"` unless another is asked for, so a
finished turn keeps one checkpoint (its last, the child of the turn's before it), the
thread's history is readable, and a failed or interrupted turn resumes from it (from another
agent on the same files too).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import interrupt

from stello_graph import StelloAgent
from stello_graph.checkpoints import InMemoryMainStorage, SqliteMainStorage
from stello_graph.errors import ModelCallError
from stello_graph.nodes._channels import _PACKED, _STALE, RunAggregate, RunValue, ThreadMessages
from stello_graph.testing import ScriptedChatModel


@tool
def lookup(query: str) -> str:
    """Look a fact up."""
    return f"fact about {query}"


@tool
def confirm(what: str) -> str:
    """Ask the user to confirm."""
    return f"confirmed: {interrupt({'confirm': what})}"


def _tool_call(name: str, args: dict[str, Any]) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"c-{name}"}])


def _history(agent: StelloAgent, sid: str) -> list[Any]:
    assert agent.checkpointer is not None
    return list(agent.checkpointer.list(agent.config(sid)))


def _chained(found: list[Any]) -> bool:
    """Whether the checkpoints (newest first) form one chain, each the child of the next."""
    ids = [c.config["configurable"]["checkpoint_id"] for c in found]
    parents = [(c.parent_config or {}).get("configurable", {}).get("checkpoint_id") for c in found]
    return parents[:-1] == ids[1:] and parents[-1] is None


@pytest.fixture
def sqlite_conns(tmp_path: Path) -> Iterator[list[sqlite3.Connection]]:
    conns: list[sqlite3.Connection] = []
    yield conns
    for conn in conns:
        conn.close()


def _sqlite_saver(path: Path, conns: list[sqlite3.Connection]) -> SqliteSaver:
    conn = sqlite3.connect(path, check_same_thread=False)
    conns.append(conn)
    return SqliteSaver(conn)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_users_saver_keeps_the_threads_history(
    tmp_path: Path, kind: str, sqlite_conns: list[sqlite3.Connection]
) -> None:
    saver = InMemorySaver() if kind == "memory" else _sqlite_saver(tmp_path / "s.db", sqlite_conns)
    agent = StelloAgent(
        model=ScriptedChatModel(default="ok"), storage=InMemoryMainStorage(), checkpointer=saver
    )
    assert agent.checkpointer is saver and agent._turn_graph.checkpointer is saver
    sid = agent.fork(agent.main_session_id, "Notes").id
    for n in range(4):
        agent.turn(sid, f"message {n}")
    found = _history(agent, sid)
    assert len(found) == 4 and _chained(found)  # one checkpoint a turn
    # the newest checkpoint is the finished turn's state, the committed `pending` empty
    state = agent._turn_graph.get_state(agent.config(sid))
    assert state.values["session_id"] == sid and not state.next
    assert [m.text for m in state.values["messages"]][-2:] == ["message 3", "ok"]
    assert state.values["content"] == "ok" and state.values["turn_count"] == 4
    assert state.values["pending"] == []
    agent.close()


async def test_async_turns_keep_the_threads_history() -> None:
    saver = InMemorySaver()
    agent = StelloAgent(
        model=ScriptedChatModel(default="ok"), storage=InMemoryMainStorage(), checkpointer=saver
    )
    sid = agent.main_session_id
    for n in range(3):
        await agent.aturn(sid, f"message {n}")
    found = [c async for c in saver.alist(agent.config(sid))]
    assert len(found) == 3 and _chained(found)
    state = await agent._turn_graph.aget_state(agent.config(sid))
    assert state.values["session_id"] == sid and state.values["content"] == "ok"
    await agent.aclose()


def test_a_tool_round_and_the_turn_after_it() -> None:
    model = ScriptedChatModel([_tool_call("lookup", {"query": "tea"}), "tea it is"])
    saver = InMemorySaver()
    agent = StelloAgent(
        model=model, storage=InMemoryMainStorage(), checkpointer=saver, tools=[lookup]
    )
    sid = agent.main_session_id
    agent.turn(sid, "tea?")
    model.extend(["plain"])
    agent.turn(sid, "and now?")
    assert _chained(_history(agent, sid))
    assert [m.text for m in agent.session(sid).messages()][-2:] == ["and now?", "plain"]
    agent.close()


def test_a_failed_turn_is_written_and_resumes() -> None:
    model = ScriptedChatModel([RuntimeError("down"), "back"])
    saver = InMemorySaver()
    agent = StelloAgent(
        model=model, storage=InMemoryMainStorage(), checkpointer=saver, model_retry=None
    )
    sid = agent.main_session_id
    with pytest.raises(ModelCallError):
        agent.turn(sid, "hello")
    history = _history(agent, sid)  # the run's input, on the saver, with the step's error
    assert history and any(c.pending_writes for c in history)
    result = agent.resume(sid)
    assert result.content == "back"
    assert [m.text for m in agent.session(sid).messages()] == ["hello", "back"]
    agent.close()


def test_an_interrupted_turn_resumes_from_another_agent_on_the_same_files(
    tmp_path: Path, sqlite_conns: list[sqlite3.Connection]
) -> None:
    model = ScriptedChatModel([_tool_call("confirm", {"what": "order"}), "ordered"])
    stello, saved = tmp_path / "stello.db", tmp_path / "saver.db"
    storage = SqliteMainStorage(stello)
    agent = StelloAgent(
        model=model,
        storage=storage,
        checkpointer=_sqlite_saver(saved, sqlite_conns),
        tools=[confirm],
    )
    sid = agent.main_session_id
    waiting = agent.turn(sid, "order tea")
    assert waiting.interrupted
    agent.close()
    storage.close()
    # as a new process would: its own connections to both files
    other_storage = SqliteMainStorage(stello)
    other = StelloAgent(
        model=model,
        storage=other_storage,
        checkpointer=_sqlite_saver(saved, sqlite_conns),
        tools=[confirm],
    )
    assert other._turn_graph.get_state(other.config(sid)).next
    done = other.resume(sid, "yes")
    assert done.content == "ordered"
    messages = other.session(sid).messages()
    assert isinstance(messages[-2], ToolMessage) and messages[-2].text == "confirmed: yes"
    other.close()
    other_storage.close()


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_a_durability_asked_for_is_langgraphs(durability: str) -> None:
    saver = InMemorySaver()
    agent = StelloAgent(
        model=ScriptedChatModel(default="ok"),
        storage=InMemoryMainStorage(),
        checkpointer=saver,
        durability=durability,  # type: ignore[arg-type]
    )
    sid = agent.main_session_id
    agent.turn(sid, "one")
    agent.turn(sid, "two")
    # "sync" and "async": LangGraph's every checkpoint, three a turn (its input, its START
    # step, its model step); "exit": the last of each run
    assert len(_history(agent, sid)) == (2 if durability == "exit" else 6)
    agent.close()


def test_a_streamed_turn_ends_and_frees_its_session() -> None:
    saver = InMemorySaver()
    agent = StelloAgent(
        model=ScriptedChatModel(default="ok"), storage=InMemoryMainStorage(), checkpointer=saver
    )
    sid = agent.main_session_id
    agent.turn(sid, "one")
    list(agent.stream(sid, "two"))
    assert agent.storage.get_lease(sid) is None
    assert _chained(_history(agent, sid))
    state = agent._turn_graph.get_state(agent.config(sid))
    assert [m.text for m in state.values["messages"]][-2:] == ["two", "ok"] and not state.next
    agent.close()


async def test_an_async_streamed_turn_ends_and_frees_its_session() -> None:
    saver = InMemorySaver()
    agent = StelloAgent(
        model=ScriptedChatModel(default="ok"), storage=InMemoryMainStorage(), checkpointer=saver
    )
    sid = agent.main_session_id
    async for _ in agent.astream(sid, "one"):
        pass
    assert agent.storage.get_lease(sid) is None
    assert not (await agent._turn_graph.aget_state(agent.config(sid))).next
    await agent.aclose()


# -- the channels' checkpointed forms ---------------------------------------------------------
class _Reason(StrEnum):
    STOP = "stop"


def test_a_threads_messages_are_packed_and_read_back_equal() -> None:
    records = [
        HumanMessage("hi", id="u-1"),
        AIMessage(
            "hello",
            id="a-1",
            response_metadata={"model_name": "m", "finish_reason": "stop"},
            usage_metadata={"input_tokens": 3, "output_tokens": 1, "total_tokens": 4},
        ),
    ]
    stored = ThreadMessages(list).from_checkpoint(records).checkpoint()
    assert set(stored) == {_PACKED}
    read = ThreadMessages(list).from_checkpoint(stored)
    assert read.get() == records
    assert read.checkpoint() == stored
    # the conversation lasts: a new run that does not write it keeps it, its input adds to it
    assert not read.update([]) and read.get() == records
    assert read.update([[HumanMessage("more", id="u-2")]])
    assert [m.id for m in read.get()] == ["u-1", "a-1", "u-2"]
    # what an earlier version left, a finished run's messages marked as such, is read too
    assert ThreadMessages(list).from_checkpoint({_STALE: records}).get() == records


def test_messages_that_would_not_come_back_equal_stay_as_they_are() -> None:
    class Custom(HumanMessage):
        pass

    marked = AIMessage("x", id="a", response_metadata={"stello_turn_id": "t", "stello_turn_seq": 0})
    keys = ToolMessage("x", tool_call_id="t", artifact={1: "a"})
    role = AIMessage("x", response_metadata={"finish": _Reason.STOP})
    cases = ([Custom(content="hi", id="c")], [marked], [keys], [role], [("user", "hi")])
    for value in cases:
        stored = ThreadMessages(list).from_checkpoint(value).checkpoint()
        assert stored == value
        assert ThreadMessages(list).from_checkpoint(stored).get() == value


def test_a_finished_runs_pending_is_not_checkpointed() -> None:
    from langgraph.graph.message import add_messages

    channel: RunAggregate[list[Any]] = RunAggregate(list, add_messages)
    channel.update([[HumanMessage("hi", id="u")]])
    assert channel.checkpoint()  # in flight: kept for a resume
    assert channel.finish()
    assert channel.get()  # the run's output still has it
    assert channel.checkpoint() == []  # stored empty: absent, LangGraph would rebuild it


def test_checkpoints_of_earlier_versions_still_read() -> None:
    before = {"__stello_previous_run__": "old reply"}
    read: RunValue[str] = RunValue(str).from_checkpoint(before)
    assert read.get() == "old reply" and read.stale
    assert read.checkpoint() == {_STALE: "old reply"}
    from langgraph.graph.message import add_messages

    pending: RunAggregate[list[Any]] = RunAggregate(list, add_messages).from_checkpoint(
        {"__stello_previous_run__": [HumanMessage("hi", id="u")]}
    )
    assert pending.stale
