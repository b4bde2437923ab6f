"""What the agent's own SQLite checkpointer writes, and when (`StelloSqliteSaver`).

A turn without tools is committed in its one step, so its checkpoints are never worth a
write: the agent runs a turn's first model round without the checkpointer. Whatever has to
survive (a turn waiting on an interrupt, a failed turn, the tool results of a turn in
flight) is on disk when the agent's call returns.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
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
    assert _rows(db, "checkpoints") == 0 and _rows(db, "writes") == 0  # then pruned


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


def _fail(agent: Any, how: str, sid: str, text: str) -> None:
    if how == "turn":
        agent.turn(sid, text)
    elif how == "aturn":
        asyncio.run(agent.aturn(sid, text))
    elif how == "stream":
        list(agent.stream(sid, text, "updates"))
    else:

        async def read() -> None:
            async for _ in agent.astream(sid, text, "updates"):
                pass

        asyncio.run(read())


def test_a_turn_right_after_one_of_its_own_reads_no_checkpoint(
    on_file: AgentsOnFile, db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = on_file(db, ScriptedChatModel(default="ok"))
    sid = agent.main_session_id
    agent.turn(sid, "warm up")  # its thread read once: nothing in flight
    saver, reads = agent.checkpointer, []
    for name in ("get_tuple", "aget_tuple"):
        method = getattr(saver, name)

        def counted(*args: Any, _method: Any = method, **kwargs: Any) -> Any:
            reads.append(args)
            return _method(*args, **kwargs)

        monkeypatch.setattr(saver, name, counted)
    agent.turn(sid, "again")
    asyncio.run(agent.aturn(sid, "and again"))
    assert reads == []  # nobody took the session's lease in between: its thread is still empty


def test_a_turn_right_after_a_tool_turn_of_its_own_reads_no_checkpoint(
    on_file: AgentsOnFile, db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = ScriptedChatModel(
        ["hi", ScriptedChatModel.tool_call("lookup", {"query": "x"}), "done"], default="ok"
    )
    agent = on_file(db, model, tools=[lookup])
    sid = agent.main_session_id
    agent.turn(sid, "warm up")
    assert agent.turn(sid, "look it up").tool_rounds == 1  # on its thread, pruned at its end
    saver, reads = agent.checkpointer, []
    monkeypatch.setattr(saver, "get_tuple", lambda *a, **k: reads.append(a))
    assert agent.turn(sid, "again").content == "ok"
    assert reads == []


def test_a_turn_in_flight_left_by_another_agent_is_found_after_a_turn_of_its_own(
    on_file: AgentsOnFile, db: Path
) -> None:
    agent = on_file(db, ScriptedChatModel(default="ok"))
    sid = agent.main_session_id
    agent.turn(sid, "warm up")
    other = on_file(db, ScriptedChatModel([RuntimeError("provider down")]))
    with pytest.raises(ModelCallError):
        other.turn(sid, "lost")  # its input stays on the thread, for resume
    assert _rows(db, "checkpoints") > 0
    assert agent.turn(sid, "next").content == "ok"  # run on the thread: it replaces the turn
    assert _rows(db, "checkpoints") == 0
    assert [m.text for m in agent.session(sid).messages()][-2:] == ["next", "ok"]


@pytest.mark.parametrize("how", ["turn", "aturn", "stream", "astream"])
def test_a_failed_turn_is_on_disk_and_resumes(on_file: AgentsOnFile, db: Path, how: str) -> None:
    model = ScriptedChatModel([RuntimeError("provider down"), "Back."])
    agent = on_file(db, model)
    sid = agent.main_session_id
    with pytest.raises(ModelCallError, match="provider down"):
        _fail(agent, how, sid, "hello")
    assert _rows(db, "checkpoints") > 0  # the turn's input, written when the run failed
    other = on_file(db, model)
    assert other.resume(sid).content == "Back."
    assert [m.text for m in other.session(sid).messages()] == ["hello", "Back."]


def test_a_tool_round_that_fails_resumes_without_asking_the_model_again(
    on_file: AgentsOnFile, db: Path
) -> None:
    calls: list[str] = []

    @tool
    def flaky(query: str) -> str:
        """Fails the first time."""
        calls.append(query)
        if len(calls) == 1:
            raise KeyboardInterrupt  # not a tool error: the run stops here
        return "found"

    model = ScriptedChatModel([ScriptedChatModel.tool_call("flaky", {"query": "x"}), "done"])
    agent = on_file(db, model, tools=[flaky])
    sid = agent.main_session_id
    with pytest.raises(KeyboardInterrupt):
        agent.turn(sid, "look")
    # the first reply was written with the input before the tools ran
    assert agent.resume(sid).content == "done"
    assert model.call_count == 2 and calls == ["x", "x"]


def test_a_saver_that_keeps_everything_holds_nothing(on_file: AgentsOnFile, db: Path) -> None:
    agent = on_file(db, ScriptedChatModel(default="ok"), prune_checkpoints=False)
    saver = agent.checkpointer
    assert isinstance(saver, StelloSqliteSaver)
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


async def test_an_async_put_never_waits_on_the_event_loop_for_the_saver_lock(db: Path) -> None:
    """While a thread holds the saver's lock (as `cursor()` does while it writes, possibly
    waiting for a database lock that a task of this very loop holds), an async put waits in
    a worker thread, not on the loop."""
    saver = sqlite_saver(db)
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
    assert _rows(db, "checkpoints") == 1  # written by the worker thread
    saver.close()
