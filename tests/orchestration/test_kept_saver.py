"""A saver of the user's that keeps every checkpoint: one checkpoint per finished turn.

With the default `"async"` durability the agent runs its turns on such a saver through a
`KeptTurnSaver`: a run's first steps are held in memory, and a turn that ends in its first
model step keeps only its last checkpoint, a child of the one before it. What has to survive
(a turn waiting on an interrupt, a failed turn, a tool round) is written as LangGraph asked.
"""

from __future__ import annotations

import sqlite3
from enum import StrEnum
from pathlib import Path
from typing import Any, cast

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.base import Checkpoint, empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import interrupt

from stello_graph import StelloAgent
from stello_graph.checkpoints import InMemoryMainStorage
from stello_graph.checkpoints._kept_saver import KeptTurnSaver
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


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_each_turn_keeps_one_checkpoint(tmp_path: Path, kind: str) -> None:
    conn = sqlite3.connect(tmp_path / "saver.db", check_same_thread=False)
    saver = InMemorySaver() if kind == "memory" else SqliteSaver(conn)
    agent = StelloAgent(
        model=ScriptedChatModel(default="ok"), storage=InMemoryMainStorage(), checkpointer=saver
    )
    sid = agent.fork(agent.main_session_id, "Notes").id
    for n in range(4):
        agent.turn(sid, f"message {n}")
    found = _history(agent, sid)
    assert len(found) == 4 and _chained(found)
    assert [c.metadata.get("source") for c in found] == ["loop"] * 4
    # the newest checkpoint is the finished turn's whole state: every channel the run set
    # (the session id only in its input) is there, the committed `pending` empty
    state = agent._turn_graph.get_state(agent.config(sid))
    assert state.values["session_id"] == sid
    assert [m.text for m in state.values["messages"]] == ["message 3", "ok"]
    assert state.values["content"] == "ok" and state.values["turn_count"] == 4
    assert state.values["pending"] == [] and not state.next
    assert agent.checkpointer is saver  # the user's own object, not the wrapper
    agent.close()
    conn.close()


async def test_async_turns_keep_one_checkpoint_each() -> None:
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


def test_a_tool_round_is_kept_as_langgraph_wrote_it() -> None:
    model = ScriptedChatModel([_tool_call("lookup", {"query": "tea"}), "tea it is"])
    saver = InMemorySaver()
    agent = StelloAgent(
        model=model, storage=InMemoryMainStorage(), checkpointer=saver, tools=[lookup]
    )
    sid = agent.main_session_id
    agent.turn(sid, "tea?")
    with_tools = len(_history(agent, sid))
    assert with_tools > 1  # its first steps were written once the tool round began
    model.extend(["plain"])
    agent.turn(sid, "and now?")
    found = _history(agent, sid)
    assert len(found) == with_tools + 1 and _chained(found)
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
    history = _history(agent, sid)  # the run's input and its START step, on disk, with the
    assert [c.metadata["source"] for c in history] == ["loop", "input"]  # model step's error
    assert history[0].pending_writes
    result = agent.resume(sid)
    assert result.content == "back"
    assert [m.text for m in agent.session(sid).messages()] == ["hello", "back"]
    agent.close()


def test_an_interrupted_turn_is_written_and_resumes() -> None:
    model = ScriptedChatModel([_tool_call("confirm", {"what": "order"}), "ordered"])
    saver = InMemorySaver()
    agent = StelloAgent(
        model=model, storage=InMemoryMainStorage(), checkpointer=saver, tools=[confirm]
    )
    sid = agent.main_session_id
    waiting = agent.turn(sid, "order tea")
    assert waiting.interrupted
    other = StelloAgent(model=model, storage=agent.storage, checkpointer=saver, tools=[confirm])
    assert other._turn_graph.get_state(other.config(sid)).next  # on the saver, for anyone
    other.close()
    done = agent.resume(sid, "yes")
    assert done.content == "ordered"
    messages = agent.session(sid).messages()
    assert isinstance(messages[-2], ToolMessage) and messages[-2].text == "confirmed: yes"
    agent.close()


@pytest.mark.parametrize("durability", ["sync", "exit"])
def test_other_durabilities_are_langgraphs(durability: str) -> None:
    saver = InMemorySaver()
    agent = StelloAgent(
        model=ScriptedChatModel(default="ok"),
        storage=InMemoryMainStorage(),
        checkpointer=saver,
        durability=durability,  # type: ignore[arg-type]
    )
    assert not isinstance(agent._turn_graph.checkpointer, KeptTurnSaver)
    sid = agent.main_session_id
    agent.turn(sid, "one")
    agent.turn(sid, "two")
    # "sync": LangGraph's every checkpoint, three a turn (its input, its START step, its model
    # step); "exit": the last of each run
    assert len(_history(agent, sid)) == (6 if durability == "sync" else 2)
    agent.close()


def test_pruned_and_direct_runs_are_not_wrapped() -> None:
    saver = InMemorySaver()
    pruned = StelloAgent(
        model=ScriptedChatModel(default="ok"),
        storage=InMemoryMainStorage(),
        checkpointer=saver,
        prune_checkpoints=True,
    )
    assert pruned._turn_graph.checkpointer is saver
    pruned.close()
    kept = StelloAgent(
        model=ScriptedChatModel(default="ok"), storage=InMemoryMainStorage(), checkpointer=saver
    )
    assert kept.graph.checkpointer is saver  # `agent.graph` runs as LangGraph runs it
    config: RunnableConfig = {"configurable": {"thread_id": "direct"}}
    kept.graph.invoke({"session_id": kept.main_session_id, "input": "hi"}, config)
    assert len(list(saver.list(config))) == 3
    kept.close()


def test_reading_a_held_thread_writes_it_first() -> None:
    inner = InMemorySaver()
    agent = StelloAgent(
        model=ScriptedChatModel(default="ok"), storage=InMemoryMainStorage(), checkpointer=inner
    )
    sid = agent.main_session_id
    config = agent.config(sid)
    saver = agent._turn_graph.checkpointer
    assert isinstance(saver, KeptTurnSaver) and saver.inner is inner
    agent.turn(sid, "hi")
    assert len(list(inner.list(config))) == 1
    latest = inner.get_tuple(config)
    assert latest is not None
    later = cast(Checkpoint, {**latest.checkpoint, "id": f"{latest.checkpoint['id'][:-1]}z"})
    saver.put(latest.config, later, {"source": "input", "step": -1, "parents": {}}, {})
    assert len(list(inner.list(config))) == 1  # a new run's input: held
    assert saver.get_tuple(config) is not None
    assert len(list(inner.list(config))) == 2  # written before the read
    again = StelloAgent(model=ScriptedChatModel(), storage=agent.storage, checkpointer=saver)
    assert again._turn_graph.checkpointer is saver  # never wrapped twice
    again.close()
    agent.close()


# -- the channels' checkpointed forms ---------------------------------------------------------
class _Reason(StrEnum):
    STOP = "stop"


def _finished(channel: Any, value: Any) -> Any:
    channel = channel.from_checkpoint(value)
    assert channel.finish()
    return channel


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


def test_a_streamed_turn_keeps_one_checkpoint_too() -> None:
    saver = InMemorySaver()
    agent = StelloAgent(
        model=ScriptedChatModel(default="ok"), storage=InMemoryMainStorage(), checkpointer=saver
    )
    sid = agent.main_session_id
    agent.turn(sid, "one")
    list(agent.stream(sid, "two"))
    found = _history(agent, sid)
    assert len(found) == 2 and _chained(found)
    assert agent.storage.get_lease(sid) is None
    agent.close()


async def test_an_async_streamed_turn_keeps_one_checkpoint_too() -> None:
    saver = InMemorySaver()
    agent = StelloAgent(
        model=ScriptedChatModel(default="ok"), storage=InMemoryMainStorage(), checkpointer=saver
    )
    sid = agent.main_session_id
    async for _ in agent.astream(sid, "one"):
        pass
    assert len(_history(agent, sid)) == 1
    await agent.aclose()


# -- the wrapper on its own ----------------------------------------------------------------------
def _conf(thread: str, checkpoint_id: str | None = None) -> RunnableConfig:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def _input(saver: KeptTurnSaver, thread: str) -> str:
    checkpoint = empty_checkpoint()
    saver.put(_conf(thread), checkpoint, {"source": "input", "step": -1, "parents": {}}, {})
    return str(checkpoint["id"])


def _written(inner: InMemorySaver, thread: str) -> tuple[int, int]:
    found = list(inner.list(_conf(thread)))
    return len(found), sum(len(c.pending_writes or []) for c in found)


def test_a_write_that_comes_before_its_checkpoint_waits_for_it() -> None:
    inner = InMemorySaver()
    saver = KeptTurnSaver(inner)
    assert saver.get_tuple(_conf("t")) is None  # a run reads its thread first
    checkpoint = empty_checkpoint()
    saver.put_writes(_conf("t", checkpoint["id"]), [("input", "hi")], "task-1")
    assert _written(inner, "t") == (0, 0)  # kept: its checkpoint has not come yet
    saver.put(_conf("t"), checkpoint, {"source": "input", "step": -1, "parents": {}}, {})
    assert _written(inner, "t") == (0, 0)  # both held now, as one run
    saver.flush("t")
    assert _written(inner, "t") == (1, 1)


def test_a_flush_of_one_thread_leaves_the_others_held() -> None:
    inner = InMemorySaver()
    saver = KeptTurnSaver(inner)
    _input(saver, "a")
    _input(saver, "b")
    saver.flush("a")
    assert _written(inner, "a") == (1, 0) and _written(inner, "b") == (0, 0)
    saver.flush()
    assert _written(inner, "b") == (1, 0)


def test_a_last_checkpoint_that_fails_to_write_stays_held() -> None:
    inner = InMemorySaver()
    saver = KeptTurnSaver(inner)
    _input(saver, "t")
    real_put, calls = inner.put, []

    def failing(*args: Any) -> Any:
        calls.append(args)
        if len(calls) == 1:
            raise OSError("disk full")
        return real_put(*args)

    setattr(inner, "put", failing)  # noqa: B010
    with pytest.raises(OSError, match="disk full"):
        saver.end_run("t")
    saver.flush("t")
    assert _written(inner, "t") == (1, 0)


def test_strict_msgpack_reaches_the_users_saver() -> None:
    inner, strict = InMemorySaver(), InMemorySaver()
    asked: list[Any] = []

    def with_allowlist(extra: Any) -> InMemorySaver:
        asked.append(extra)
        return strict

    setattr(inner, "with_allowlist", with_allowlist)  # noqa: B010
    saver = KeptTurnSaver(inner)
    twin = saver.with_allowlist([("mymodule", "MyType")])
    assert asked == [[("mymodule", "MyType")]]
    assert isinstance(twin, KeptTurnSaver) and twin._held is saver._held
    assert twin.inner is strict and twin.serde is strict.serde and saver.inner is inner
