"""What one turn without tools sends to its storage and its checkpointer, counted.

The fixed cost of a turn is its statements (on PostgreSQL each is a round trip): take the
lease and read the session (`lease_session`, which refuses a missing or archived session
before writing; one statement on PostgreSQL when the session's records are cached), commit
and free the lease in one transaction (`commit_records`). The turn's
checkpoint thread is not read: the agent's own last turn left it empty under the lease token
just before this one. A change that adds a statement to every turn fails here.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest
from langchain_core.tools import tool

from stello_graph import StelloAgent
from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.testing import ScriptedChatModel


@tool
def lookup(query: str) -> str:
    """Look a fact up."""
    return f"fact about {query}"


def _warm(agent: StelloAgent) -> str:
    sid = agent.fork(agent.main_session_id, "Topic").id
    for n in range(5):
        agent.turn(sid, f"question {n}")
    return sid


def _trace(conn: sqlite3.Connection, seen: list[str]) -> None:
    conn.set_trace_callback(lambda sql: seen.append(" ".join(sql.split())))


def _own(statements: list[str]) -> list[str]:
    """The statements the code sent (a trigger's body is traced too: left out)."""
    return [s for s in statements if not s.startswith("INSERT INTO stello_changes")]


def test_a_sqlite_turn_takes_two_write_transactions(tmp_path: Path) -> None:
    agent = StelloAgent(model=ScriptedChatModel(default="ok"), storage=tmp_path / "a.db")
    try:
        sid = _warm(agent)
        storage: list[str] = []
        saver: list[str] = []
        _trace(agent.storage._conn, storage)  # type: ignore[attr-defined]
        _trace(agent.checkpointer.conn, saver)  # type: ignore[union-attr]
        agent.turn(sid, "counted")
        _trace(agent.storage._conn, [])  # type: ignore[attr-defined]
    finally:
        agent.close()
    begins = [s for s in storage if s.startswith("BEGIN")]
    assert len(begins) == 2  # the lease taken; the commit, which frees it
    reads = [s for s in storage if s.startswith("SELECT") and "FROM stello_sessions" in s]
    # the session read with its lease (one statement: the check, the lease's fields and
    # the turn's read), the commit's read, next_seq
    assert len(reads) <= 3, reads
    # the record cache is checked once per write transaction, when it begins
    assert [s for s in storage if "data_version" in s] == ["PRAGMA data_version"] * 2, storage
    assert len(_own(storage)) <= 19, storage
    assert saver == []  # the thread is known empty: the agent's own last turn left it so


def test_a_turn_with_its_records_not_cached_counts_none(tmp_path: Path) -> None:
    """A session whose records left the cache (or a cache of size 0) reads them once, with
    its lease: the commit appends without counting them again."""
    storage = SqliteMainStorage(tmp_path / "a.db", record_cache_size=0)
    agent = StelloAgent(model=ScriptedChatModel(default="ok"), storage=storage)
    try:
        sid = _warm(agent)
        seen: list[str] = []
        _trace(storage._conn, seen)
        agent.turn(sid, "counted")
        _trace(storage._conn, [])
    finally:
        agent.close()
    assert not [s for s in seen if "COUNT(" in s.upper()], seen
    assert len([s for s in seen if "FROM stello_records" in s]) == 1, seen


def test_a_tool_turn_still_prunes_its_checkpoints(tmp_path: Path) -> None:
    model = ScriptedChatModel(default="done")
    agent = StelloAgent(model=model, storage=tmp_path / "a.db", tools=[lookup])
    try:
        sid = _warm(agent)
        model.extend([ScriptedChatModel.tool_call("lookup", {"query": "x"}), "found"])
        result = agent.turn(sid, "look it up")
        assert result.content == "found" and result.tool_rounds == 1
        assert agent.storage.get_lease(sid) is None
    finally:
        agent.close()
    with sqlite3.connect(tmp_path / "a.db") as conn:
        assert conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0] == 0


def test_a_postgres_turn_is_two_round_trips(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    execute, executemany = psycopg.Cursor.execute, psycopg.Cursor.executemany
    on = [False]

    def traced(method: Any) -> Any:
        def call(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            if on[0]:
                seen.append(" ".join(str(query).split()))
            return method(self, query, *args, **kwargs)

        return call

    monkeypatch.setattr(psycopg.Cursor, "execute", traced(execute))
    monkeypatch.setattr(psycopg.Cursor, "executemany", traced(executemany))
    with StelloAgent(model=ScriptedChatModel(default="ok"), storage=postgres_dsn) as agent:
        sid = _warm(agent)
        on[0] = True
        agent.turn(sid, "counted")
        on[0] = False
    assert [s for s in seen if "checkpoint" in s] == []  # the thread is known empty
    storage = [s for s in seen if "checkpoint" not in s]
    transactions = [s for s in storage if s.startswith("BEGIN")]
    assert len(transactions) == 2  # the lease taken; the commit, freeing it (one script each)
    # the lease (refusing a missing or archived session without writing) returning the
    # session's read (its records cached), the commit: two round trips
    assert len(storage) == 2, storage


async def test_an_async_postgres_turn_is_two_round_trips(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    on = [False]

    def traced(method: Any) -> Any:
        async def call(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            if on[0]:
                seen.append(" ".join(str(query).split()))
            return await method(self, query, *args, **kwargs)

        return call

    for name in ("execute", "executemany"):
        monkeypatch.setattr(psycopg.AsyncCursor, name, traced(getattr(psycopg.AsyncCursor, name)))
    saver: list[str] = []  # the saver's calls run its sync methods in a worker thread
    for name in ("execute", "executemany"):
        real = getattr(psycopg.Cursor, name)

        def sync(self: Any, query: Any, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            if on[0]:
                saver.append(" ".join(str(query).split()))
            return _real(self, query, *args, **kwargs)

        monkeypatch.setattr(psycopg.Cursor, name, sync)
    agent = StelloAgent(model=ScriptedChatModel(default="ok"), storage=postgres_dsn)
    try:
        sid = (await agent.afork(agent.main_session_id, "Topic")).id
        for n in range(5):
            await agent.aturn(sid, f"question {n}")
        on[0] = True
        await agent.aturn(sid, "counted")
        on[0] = False
    finally:
        await agent.aclose()
    assert [s for s in saver if "checkpoint" in s] == []  # the thread is known empty
    storage = [s for s in seen if "checkpoint" not in s]
    assert len([s for s in storage if s.startswith("BEGIN")]) == 2, storage
    # the lease (refusing a missing or archived session without writing) returning the
    # session's read (its records cached), the commit: two round trips
    assert len(storage) == 2, storage
