"""A turn's opening checkpoint read, answered from memory when the thread is surely empty.

The agent prunes a session's checkpoint thread once a turn is committed; a turn without tools
never wrote it at all. The next turn's run still asks the saver for the thread's latest
checkpoint. When the agent's own last turn on the session pruned it in memory and nobody
else has taken the session's lease since (its fencing token moved by one at most), the run
carries `EmptyThread` and the saver answers `None` without a statement. Anything else (a
turn of another agent in between, a tool round that reached the disk, a saver that holds or
wrote the thread) reads the database as before.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import tool
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.sqlite import SqliteSaver

from stello_graph.checkpoints._threaded_saver import EMPTY_THREAD_KEY, EmptyThread
from stello_graph.checkpoints.saver import StelloSqliteSaver, sqlite_saver
from stello_graph.testing import ScriptedChatModel
from tests.orchestration.conftest import AgentsOnFile, count_reads


@tool
def lookup(query: str) -> str:
    """Look a fact up."""
    return f"fact about {query}"


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The threads LangGraph's `SqliteSaver.get_tuple` reads from the database."""
    return count_reads(monkeypatch, SqliteSaver)


def test_turns_after_one_pruned_in_memory_read_no_checkpoint(
    on_file: AgentsOnFile, tmp_path: Path, reads: list[str]
) -> None:
    agent = on_file(tmp_path / "a.db", ScriptedChatModel(default="ok"))
    sid = agent.main_session_id
    agent.turn(sid, "first")
    count = len(reads)
    assert count > 0  # the first turn of this agent reads the thread
    for n in range(3):
        assert agent.turn(sid, f"question {n}").content == "ok"
    assert len(reads) == count
    assert agent.storage.get_turn_count(sid) == 4


async def test_async_turns_and_streams_read_no_checkpoint_after_a_pruned_turn(
    on_file: AgentsOnFile, tmp_path: Path, reads: list[str]
) -> None:
    agent = on_file(tmp_path / "a.db", ScriptedChatModel(default="ok"))
    sid = agent.main_session_id
    await agent.aturn(sid, "first")
    count = len(reads)
    await agent.aturn(sid, "second")
    assert len(reads) == count
    async for _ in agent.astream(sid, "third", stream_mode="updates"):
        pass
    assert len(reads) == count  # a stream that ended in memory is not read back either
    assert agent.storage.get_turn_count(sid) == 3


def test_another_agents_turn_in_between_makes_the_next_turn_read(
    on_file: AgentsOnFile, tmp_path: Path, reads: list[str]
) -> None:
    db = tmp_path / "shared.db"
    mine = on_file(db, ScriptedChatModel(default="mine"))
    sid = mine.main_session_id
    mine.turn(sid, "one")
    mine.turn(sid, "two")
    before = len(reads)
    theirs = on_file(db, ScriptedChatModel(default="theirs"))  # another process, say
    theirs.turn(sid, "between")
    after_theirs = len(reads)
    assert after_theirs > before
    assert mine.turn(sid, "three").content == "mine"
    assert len(reads) == after_theirs + 1  # the session's lease was taken by another since
    mine.turn(sid, "four")
    assert len(reads) == after_theirs + 1  # and now it was not
    texts = [m.text for m in mine.session(sid).messages()]
    assert texts[-4:] == ["three", "mine", "four", "mine"]


def test_a_turn_after_a_tool_round_reads_its_thread(
    on_file: AgentsOnFile, tmp_path: Path, reads: list[str]
) -> None:
    model = ScriptedChatModel(
        ["hi", ScriptedChatModel.tool_call("lookup", {"query": "x"}), "done", "plain", "again"]
    )
    agent = on_file(tmp_path / "a.db", model, tools=[lookup])
    sid = agent.main_session_id
    agent.turn(sid, "warm up")
    assert agent.turn(sid, "look it up").tool_rounds == 1  # its steps reached the disk
    count = len(reads)
    assert agent.turn(sid, "then").content == "plain"
    assert len(reads) == count + 1
    assert agent.turn(sid, "and").content == "again"
    assert len(reads) == count + 1


def _traced(saver: StelloSqliteSaver) -> list[str]:
    seen: list[str] = []
    saver.conn.set_trace_callback(seen.append)
    return seen


def _read(thread: str, vouched: str | None = None, **conf: Any) -> Any:
    configurable: dict[str, Any] = {"thread_id": thread, **conf}
    if vouched is not None:
        configurable[EMPTY_THREAD_KEY] = EmptyThread(vouched)
    return {"configurable": configurable}


def _put(saver: StelloSqliteSaver, thread: str, source: str = "loop") -> str:
    checkpoint = empty_checkpoint()
    config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    metadata: Any = {"source": source, "step": -1}
    saver.put(config, checkpoint, metadata, {})
    return str(checkpoint["id"])


@pytest.fixture
def saver(tmp_path: Path) -> Iterator[StelloSqliteSaver]:
    made = sqlite_saver(tmp_path / "s.db", hold_first_steps=True)
    made.setup()
    yield made
    made.close()


def test_the_saver_answers_a_vouched_read_without_a_statement(saver: StelloSqliteSaver) -> None:
    statements = _traced(saver)
    assert saver.get_tuple(_read("t", vouched="t")) is None
    assert statements == []
    assert saver.get_tuple(_read("t")) is None  # unvouched: the database is asked
    assert any("checkpoints" in sql for sql in statements)


async def test_an_async_vouched_read_needs_no_thread(saver: StelloSqliteSaver) -> None:
    statements = _traced(saver)

    async def no_thread(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("went to a worker thread")

    saver._in_thread = no_thread  # type: ignore[method-assign]
    assert await saver.aget_tuple(_read("t", vouched="t")) is None
    assert statements == []


def test_a_vouch_for_another_thread_or_an_older_checkpoint_is_ignored(
    saver: StelloSqliteSaver,
) -> None:
    other = sqlite_saver(Path(saver.conn.execute("PRAGMA database_list").fetchone()[2]))
    try:
        written = _put(other, "t")  # rows this saver knows nothing of
    finally:
        other.close()
    statements = _traced(saver)
    found = saver.get_tuple(_read("t", vouched="u"))
    assert found is not None and found.config["configurable"]["checkpoint_id"] == written
    assert saver.get_tuple(_read("t", vouched="t", checkpoint_id=written)) is not None
    assert saver.get_tuple(_read("t", vouched="t", checkpoint_ns="sub")) is None
    assert len([sql for sql in statements if "checkpoints" in sql]) == 3


def test_a_vouch_never_hides_what_the_saver_holds_or_wrote(saver: StelloSqliteSaver) -> None:
    held = _put(saver, "h", source="input")  # a run's input: held in memory
    found = saver.get_tuple(_read("h", vouched="h"))
    assert found is not None and found.config["configurable"]["checkpoint_id"] == held
    written = _put(saver, "w")  # not a run's input: written at once
    found = saver.get_tuple(_read("w", vouched="w"))
    assert found is not None and found.config["configurable"]["checkpoint_id"] == written


def test_a_saver_that_holds_nothing_never_takes_a_vouch(tmp_path: Path) -> None:
    plain = sqlite_saver(tmp_path / "p.db")
    try:
        plain.setup()
        statements = _traced(plain)
        assert plain.get_tuple(_read("t", vouched="t")) is None
        assert any("checkpoints" in sql for sql in statements)
    finally:
        plain.close()


def test_the_vouch_is_not_checkpointed(
    on_file: AgentsOnFile, tmp_path: Path, reads: list[str]
) -> None:
    db = tmp_path / "a.db"
    model = ScriptedChatModel(["hi", ScriptedChatModel.tool_call("lookup", {"query": "x"}), "ok"])
    agent = on_file(db, model, tools=[lookup])
    sid = agent.main_session_id
    agent.turn(sid, "warm up")
    count = len(reads)
    agent.turn(sid, "look it up")  # vouched for, and written from its tool results
    assert len(reads) == count
    with sqlite3.connect(db) as conn:  # pruned, its rows go with the saver's next write
        metadata = [row[0] for row in conn.execute("SELECT metadata FROM checkpoints")]
    assert metadata and not any(EMPTY_THREAD_KEY.encode() in blob for blob in metadata)
