"""Removing sessions from a SQLite file removes their turn threads' checkpoint rows in the
same transaction, and `open_sqlite`'s saver writes nothing of a thread whose session is
gone: no step of the removal can be cut off from the other (a kill between them left the
rows for good), and a turn that runs on while its session is removed stores none of its text.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint

from stello_graph._ids import legacy_thread_id, thread_id
from stello_graph.checkpoints import StelloSqliteSaver, open_sqlite
from stello_graph.models import SessionMeta, TopologyNode


def _rows(db: Path, thread: str) -> int:
    conn = sqlite3.connect(db)
    try:
        found = conn.execute(
            "SELECT (SELECT count(*) FROM checkpoints WHERE thread_id = ?)"
            " + (SELECT count(*) FROM writes WHERE thread_id = ?)",
            (thread, thread),
        ).fetchone()[0]
    finally:
        conn.close()
    return int(found)


def _put(saver: StelloSqliteSaver, thread: str) -> None:
    config: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    stored = saver.put(config, empty_checkpoint(), {"source": "loop", "step": 0}, {})
    saver.put_writes(stored, [("messages", "the secret plan")], "task-1")


def _sessions(path: Path, *ids: str) -> None:
    storage, saver = open_sqlite(path)
    storage.put_session(SessionMeta(id="main", label="main", role="main"))
    storage.put_node(TopologyNode(id="main", parent_id=None, label="main"))
    for sid in ids:
        storage.put_session(SessionMeta(id=sid, label=sid, role="standard"))
        storage.put_node(TopologyNode(id=sid, parent_id="main", label=sid))
    storage.close()
    saver.close()


def test_removing_sessions_deletes_their_threads_in_its_transaction(tmp_path: Path) -> None:
    db = tmp_path / "tree.db"
    _sessions(db, "a", "b")
    storage, saver = open_sqlite(db)
    threads = [thread_id("default", "a"), legacy_thread_id("default", "a")]
    for thread in [*threads, thread_id("default", "b"), "someone-else's"]:
        _put(saver, thread)
    assert [_rows(db, thread) for thread in threads] == [2, 2]
    assert storage.remove_node("a") == ["a"]  # the storage alone: no saver call after it
    assert [_rows(db, thread) for thread in threads] == [0, 0]
    assert _rows(db, thread_id("default", "b")) == 2
    assert _rows(db, "someone-else's") == 2
    storage.close()
    saver.close()


def test_the_saver_writes_nothing_of_a_removed_sessions_thread(tmp_path: Path) -> None:
    db = tmp_path / "tree.db"
    _sessions(db, "a", "b")
    storage, saver = open_sqlite(db)
    storage.remove_node("a")
    _put(saver, thread_id("default", "a"))
    _put(saver, thread_id("default", "b"))
    _put(saver, thread_id("other-tree", "b"))  # a tree stored elsewhere: written
    _put(saver, "someone-else's")
    assert _rows(db, thread_id("default", "a")) == 0
    assert _rows(db, thread_id("default", "b")) == 2
    assert _rows(db, thread_id("other-tree", "b")) == 2
    assert _rows(db, "someone-else's") == 2
    storage.close()
    saver.close()


def test_a_saver_on_a_file_without_the_storage_writes_every_thread(tmp_path: Path) -> None:
    db = tmp_path / "plain.db"
    saver = StelloSqliteSaver(sqlite3.connect(db, check_same_thread=False))
    _put(saver, thread_id("default", "a"))
    saver.close()
    assert _rows(db, thread_id("default", "a")) == 2
