"""What the agent's own SQLite checkpointer writes, and when (`StelloSqliteSaver`).

A turn without tools is committed in its one step, so its checkpoints are never worth a
write: the saver holds a run's first steps in memory and the agent drops them once the turn
is committed. Whatever has to survive (a turn waiting on an interrupt, a failed turn, the
tool results of a turn in flight) is on disk when the agent's call returns.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.types import interrupt

from stello_graph.checkpoints.saver import StelloSqliteSaver, sqlite_saver
from stello_graph.errors import ModelCallError
from stello_graph.testing import ScriptedChatModel
from tests.orchestration.conftest import AgentsOnFile


@tool
def confirm(what: str) -> str:
    """Ask the user to confirm."""
    return f"confirmed: {interrupt({'confirm': what})}"


@tool
def lookup(query: str) -> str:
    """Look a fact up."""
    return f"fact about {query}"


def _writes(saver: Any) -> list[str]:
    """Every write statement the saver's connection runs from now on."""
    seen: list[str] = []

    def trace(sql: str) -> None:
        if sql.lstrip().upper().startswith(("INSERT", "DELETE", "UPDATE")):
            seen.append(sql)

    saver.conn.set_trace_callback(trace)
    return seen


def _rows(path: Path, table: str) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "agent.db"


def test_a_turn_without_tools_writes_no_checkpoint(on_file: AgentsOnFile, db: Path) -> None:
    agent = on_file(db, ScriptedChatModel(default="ok"))
    sid = agent.main_session_id
    agent.turn(sid, "warm up")
    writes = _writes(agent.checkpointer)
    for n in range(3):
        assert agent.turn(sid, f"question {n}").content == "ok"
    assert writes == []
    assert _rows(db, "checkpoints") == 0 and _rows(db, "writes") == 0


async def test_an_async_turn_without_tools_writes_no_checkpoint(
    on_file: AgentsOnFile, db: Path
) -> None:
    agent = on_file(db, ScriptedChatModel(default="ok"))
    sid = agent.main_session_id
    await agent.aturn(sid, "warm up")
    writes = _writes(agent.checkpointer)
    assert (await agent.aturn(sid, "again")).content == "ok"
    assert [item async for item in agent.astream(sid, "streamed", stream_mode="updates")]
    assert writes == []
    assert agent.storage.get_turn_count(sid) == 3


def test_a_streamed_turn_without_tools_writes_no_checkpoint(
    on_file: AgentsOnFile, db: Path
) -> None:
    agent = on_file(db, ScriptedChatModel(default="ok"))
    sid = agent.main_session_id
    list(agent.stream(sid, "warm up"))
    writes = _writes(agent.checkpointer)
    for mode in ("messages", "updates", "values"):
        assert list(agent.stream(sid, f"in {mode}", stream_mode=mode))
    assert writes == []  # the run ended in memory: the stream does not read it back
    assert _rows(db, "checkpoints") == 0 and agent.storage.get_turn_count(sid) == 4


def test_a_streamed_turn_waiting_on_an_interrupt_is_on_disk(
    on_file: AgentsOnFile, db: Path
) -> None:
    model = ScriptedChatModel([ScriptedChatModel.tool_call("confirm", {"what": "x"}), "Done."])
    first = on_file(db, model, tools=[confirm])
    sid = first.main_session_id
    list(first.stream(sid, "do it", stream_mode="updates"))
    assert _rows(db, "checkpoints") > 0
    other = on_file(db, model, tools=[confirm])
    assert other.resume(sid, "yes").content == "Done."


def test_a_tool_turn_is_written_from_its_first_tool_results(
    on_file: AgentsOnFile, db: Path
) -> None:
    model = ScriptedChatModel(["hi", ScriptedChatModel.tool_call("lookup", {"query": "x"}), "done"])
    agent = on_file(db, model, tools=[lookup])
    agent.turn(agent.main_session_id, "warm up")
    writes = _writes(agent.checkpointer)
    result = agent.turn(agent.main_session_id, "look it up")
    assert result.content == "done" and result.tool_rounds == 1
    assert any("INTO writes" in sql for sql in writes)  # the tool results reached the disk
    # the first steps went out with the tool results, then the thread was pruned: its rows
    # go with the saver's next write (or when it closes)
    agent.close()
    assert _rows(db, "checkpoints") == 0 and _rows(db, "writes") == 0


def test_tool_results_are_on_disk_before_the_next_model_call(
    on_file: AgentsOnFile, db: Path
) -> None:
    seen: list[int] = []

    def answer(messages: Any) -> str:  # the model call after the tool round
        # `"async"`: LangGraph writes the round's results in the background while this call
        # runs; they are not held until the turn's next step
        deadline = time.monotonic() + 5
        while _rows(db, "writes") == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        seen.append(_rows(db, "writes"))
        return "done"

    model = ScriptedChatModel(["hi", ScriptedChatModel.tool_call("lookup", {"query": "x"}), answer])
    agent = on_file(db, model, tools=[lookup])
    agent.turn(agent.main_session_id, "warm up")
    assert _rows(db, "writes") == 0
    assert agent.turn(agent.main_session_id, "look it up").content == "done"
    assert seen and seen[0] > 0  # a crash during that call would not run the tool again


def test_an_interrupted_turn_is_on_disk_when_turn_returns(on_file: AgentsOnFile, db: Path) -> None:
    model = ScriptedChatModel([ScriptedChatModel.tool_call("confirm", {"what": "x"}), "Done."])
    first = on_file(db, model, tools=[confirm])
    sid = first.main_session_id
    assert first.turn(sid, "do it").interrupted
    # another process (here: agent) on the same file sees the turn waiting, and resumes it
    other = on_file(db, model, tools=[confirm])
    done = other.resume(sid, "yes")
    assert done.content == "Done."
    assert [m.text for m in other.session(sid).messages()][-2:] == ["confirmed: yes", "Done."]


def test_a_failed_turn_is_on_disk_and_resumes(on_file: AgentsOnFile, db: Path) -> None:
    model = ScriptedChatModel([RuntimeError("provider down"), "Back."])
    agent = on_file(db, model)
    sid = agent.main_session_id
    with pytest.raises(ModelCallError, match="provider down"):
        agent.turn(sid, "hello")
    assert _rows(db, "checkpoints") > 0  # the turn's input, written when the run failed
    other = on_file(db, model)
    assert other.resume(sid).content == "Back."
    assert [m.text for m in other.session(sid).messages()] == ["hello", "Back."]


def test_a_saver_that_keeps_everything_holds_nothing(on_file: AgentsOnFile, db: Path) -> None:
    agent = on_file(db, ScriptedChatModel(default="ok"), prune_checkpoints=False)
    saver = agent.checkpointer
    assert isinstance(saver, StelloSqliteSaver) and not saver.hold_first_steps
    agent.turn(agent.main_session_id, "hello")
    # the default durability of a kept saver ("exit"): the finished turn is kept as
    # its last checkpoint only
    assert _rows(db, "checkpoints") == 1 and _rows(db, "writes") == 0
    agent.turn(agent.main_session_id, "again")
    assert _rows(db, "checkpoints") == 2


def _put(saver: StelloSqliteSaver, thread: str) -> str:
    checkpoint = empty_checkpoint()
    config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    saver.put(config, checkpoint, {"source": "loop", "step": 1}, {})
    return str(checkpoint["id"])


def test_a_deleted_thread_is_gone_at_once_and_its_rows_with_the_next_write(db: Path) -> None:
    saver = sqlite_saver(db)
    try:
        _put(saver, "a")
        saver.delete_thread("a")
        assert saver.get_tuple({"configurable": {"thread_id": "a"}}) is None
        assert list(saver.list({"configurable": {"thread_id": "a"}})) == []
        assert _rows(db, "checkpoints") == 1  # not deleted yet: no transaction of its own
        _put(saver, "b")  # the next write deletes it
        assert _rows(db, "checkpoints") == 1
        assert saver.get_tuple({"configurable": {"thread_id": "b"}}) is not None
    finally:
        saver.close()


def test_a_thread_deleted_while_its_write_commits_is_deleted_whole(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `delete_thread` that runs the moment a write's transaction commits, before `put`
    returns, covers the checkpoint just written."""
    saver = sqlite_saver(db)
    _put(saver, "a")
    cursor = saver.cursor
    once: list[str] = []

    @contextmanager
    def deleting_after(transaction: bool = True) -> Iterator[Any]:
        with cursor(transaction) as cur:
            yield cur
        if transaction and not once:
            once.append("a")
            saver.delete_thread("a")  # another thread's delete, between commit and return

    monkeypatch.setattr(saver, "cursor", deleting_after)
    try:
        _put(saver, "a")
        assert once == ["a"]
        assert saver.get_tuple({"configurable": {"thread_id": "a"}}) is None
    finally:
        saver.close()


def test_a_deferred_delete_spares_a_later_run_of_another_process(db: Path) -> None:
    mine, theirs = sqlite_saver(db), sqlite_saver(db)
    try:
        _put(mine, "t")
        mine.delete_thread("t")
        later = _put(theirs, "t")  # another process's new run on the thread
        _put(mine, "other")  # my next write deletes only what I had deleted
        found = theirs.get_tuple({"configurable": {"thread_id": "t"}})
        assert found is not None and found.config["configurable"]["checkpoint_id"] == later
        assert mine.get_tuple({"configurable": {"thread_id": "t"}}) is not None
    finally:
        mine.close()
        theirs.close()


def test_closing_writes_what_is_held(db: Path) -> None:
    saver = sqlite_saver(db, hold_first_steps=True)
    saver.setup()
    checkpoint = empty_checkpoint()
    config: Any = {"configurable": {"thread_id": "h", "checkpoint_ns": ""}}
    saver.put(config, checkpoint, {"source": "input", "step": -1}, {})
    assert _rows(db, "checkpoints") == 0  # held
    saver.close()
    assert _rows(db, "checkpoints") == 1


async def test_an_async_put_never_waits_on_the_event_loop_for_the_saver_lock(db: Path) -> None:
    """While a thread holds the saver's lock (as `cursor()` does while it writes, possibly
    waiting for a database lock that a task of this very loop holds), an async put that the
    saver would hold in memory goes through a worker thread instead of waiting on the loop."""
    saver = sqlite_saver(db, hold_first_steps=True)
    saver.setup()
    holding, loop_ran, seen = threading.Event(), threading.Event(), list[bool]()

    def hold() -> None:
        with saver.lock:
            holding.set()
            seen.append(loop_ran.wait(10))  # released once the loop has run on (a guard)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(10)
    config: Any = {"configurable": {"thread_id": "h", "checkpoint_ns": ""}}
    put = asyncio.create_task(saver.aput(config, empty_checkpoint(), {"source": "input"}, {}))
    for _ in range(3):  # the put's task runs first; a blocked loop would not come back here
        await asyncio.sleep(0)
    loop_ran.set()
    done = await put
    holder.join()
    assert seen == [True]
    assert done["configurable"]["thread_id"] == "h"
    assert _rows(db, "checkpoints") == 0  # held all the same, by the worker thread
    saver.close()


def test_asking_whether_a_thread_is_unwritten_never_waits_for_the_saver_lock(db: Path) -> None:
    """`unwritten` is asked as a turn commits, on the event loop of an async turn: while
    another thread holds the saver's lock (writing, possibly waiting for a database lock a
    task of that loop holds) it answers `False` (keep the session held) at once."""
    saver = sqlite_saver(db, hold_first_steps=True)
    saver.setup()
    config: Any = {"configurable": {"thread_id": "u", "checkpoint_ns": ""}}
    saver.put(config, empty_checkpoint(), {"source": "input"}, {})
    assert saver.unwritten("u")  # its first step, held in memory
    holding, answered, seen = threading.Event(), threading.Event(), list[bool]()

    def hold() -> None:
        with saver.lock:
            holding.set()
            seen.append(answered.wait(10))  # released once `unwritten` answered (a guard)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(10)
    busy = saver.unwritten("u")
    answered.set()
    holder.join()
    assert seen == [True] and busy is False
    assert saver.unwritten("u")  # the lock free again: the real answer
    saver.close()


def test_held_steps_that_fail_to_be_written_leave_nothing_half_written(db: Path) -> None:
    # a checkpoint that cannot be serialized, held with the run's first steps: their
    # write fails, and none of them reaches the file (the input checkpoint and its writes
    # alone would make a resumed run start its START step over)
    saver = sqlite_saver(db, hold_first_steps=True)
    thread: RunnableConfig = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    at_input = saver.put(thread, empty_checkpoint(), {"source": "input", "step": -1}, {})
    saver.put_writes(at_input, [("x", 1)], "task-1")
    bad = empty_checkpoint()
    bad["channel_values"] = {"x": threading.Lock()}
    after_bad = saver.put(at_input, bad, {"source": "loop", "step": 0}, {})
    with pytest.raises(TypeError, match="not msgpack serializable"):
        saver.put(after_bad, empty_checkpoint(), {"source": "loop", "step": 1}, {})
    assert saver.get_tuple(thread) is None
    assert sqlite3.connect(db).execute("SELECT count(*) FROM writes").fetchone() == (0,)
    saver.conn.close()
