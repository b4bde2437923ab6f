"""The agent's SQLite checkpointer on a full disk or a file gone read-only: its failures reach
the caller as `StorageError`, the original as `__cause__`, and the agent recovers afterwards.
A turn that fails stored nothing; one whose checkpoints fail only after its commit is
returned (it is stored)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.tools import tool

from stello_graph import StelloAgent
from stello_graph.checkpoints import SqliteMainStorage, StelloSqliteSaver
from stello_graph.errors import StorageError
from stello_graph.testing import ScriptedChatModel


@tool
def lookup(query: str) -> str:
    """Look a fact up."""
    return f"fact about {query}"


def _respond(messages: list[BaseMessage]) -> AIMessage | str:
    """A tool round (the checkpointer writes its steps), then the answer."""
    if messages[-1].type == "human":
        return ScriptedChatModel.tool_call("lookup", {"query": messages[-1].text[:20]})
    return "done"


def _turn(agent: StelloAgent, sid: str, text: str, mode: str) -> str:
    if mode == "sync":
        return agent.turn(sid, text).content
    return asyncio.run(agent.aturn(sid, text)).content


def _full(conn: sqlite3.Connection) -> None:
    """The disk is full for `conn`: the file cannot grow by a page."""
    size = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {size}")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_full_disk_fails_the_turn_with_storage_error(tmp_path: Path, mode: str) -> None:
    db = tmp_path / "tree.db"
    conn = sqlite3.connect(db, check_same_thread=False, isolation_level=None)
    with (
        SqliteMainStorage(conn) as storage,
        StelloAgent(
            model=ScriptedChatModel(respond=_respond),
            storage=storage,
            tools=[lookup],
            durability="sync",  # each step is written before the next: the disk fills first
        ) as agent,
    ):
        saver = agent.checkpointer
        assert isinstance(saver, StelloSqliteSaver)
        sid = agent.main_session_id
        assert agent.turn(sid, "first").content == "done"
        _full(saver.conn)
        big = "x" * 50_000
        with pytest.raises(StorageError, match="database or disk is full") as caught:
            _turn(agent, sid, big, mode)
        assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
        assert str(db) in str(caught.value)
        assert agent.storage.get_turn_count(sid) == 1  # nothing of it stored
        saver.conn.execute("PRAGMA max_page_count = 1073741823")  # room again
        assert _turn(agent, sid, big, mode) == "done"  # the same turn again, stored once
        assert agent.storage.get_turn_count(sid) == 2


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_full_disk_met_after_the_commit_returns_the_stored_turn(
    tmp_path: Path, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "tree.db"
    conn = sqlite3.connect(db, check_same_thread=False, isolation_level=None)
    filling: list[sqlite3.Connection] = []

    @tool("lookup")
    def filling_lookup(query: str) -> str:
        """Look a fact up (the checkpointer's disk fills up meanwhile)."""
        for full in filling:
            _full(full)
        return f"fact about {query}"

    with (
        SqliteMainStorage(conn) as storage,
        StelloAgent(
            model=ScriptedChatModel(respond=_respond), storage=storage, tools=[filling_lookup]
        ) as agent,
    ):
        saver = agent.checkpointer
        assert isinstance(saver, StelloSqliteSaver)
        sid = agent.main_session_id
        assert agent.turn(sid, "first").content == "done"
        filling.append(saver.conn)  # once the turn is on its thread, in its tool round
        # the default durability writes the run's checkpoints behind its steps: their
        # failure is known when the run ends, after the commit stored the turn
        assert _turn(agent, sid, "x" * 50_000, mode) == "done"
        assert "database or disk is full" in caplog.text
        assert agent.storage.get_turn_count(sid) == 2
        filling.clear()
        saver.conn.execute("PRAGMA max_page_count = 1073741823")  # room again
        assert agent.turn(sid, "after").content == "done"
        assert agent.storage.get_turn_count(sid) == 3
