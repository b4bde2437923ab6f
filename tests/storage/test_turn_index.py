"""The turn-id index (schema version 9) is keyed by the turn id alone: a file made before
keeps its turns, and the commit's idempotency check finds them through the index."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from langchain_core.messages import AIMessage, HumanMessage

from stello_graph.checkpoints import SqliteMainStorage, _schema
from stello_graph.models import SessionMeta
from tests.storage._old_files import file_at_version


def _index_sql(path: Path) -> str:
    with sqlite3.connect(path) as conn:
        (sql,) = conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'stello_records_turns'"
        ).fetchone()
    return str(sql)


def _v8_file(path: Path) -> None:
    """A new file at version 8 (the index keyed by tree, session and turn)."""
    file_at_version(path, 8).close()
    assert "(tree_id, session_id, turn_id)" in _index_sql(path)


def test_a_version_8_file_keeps_its_turns(tmp_path: Path) -> None:
    path = tmp_path / "v8.db"
    _v8_file(path)
    with SqliteMainStorage(path) as storage:
        assert _schema.read_version(storage._conn) == _schema.SCHEMA_VERSION
        for sid in ("a", "b"):
            storage.put_session(SessionMeta(id=sid, label=sid))
        reply = [HumanMessage("q", id="m1"), AIMessage("r")]
        storage.append_records("a", reply, user_turn=True, turn_id="t-1")
        assert storage.has_turn("a", "t-1")
        assert not storage.has_turn("b", "t-1")  # the same id in another session is not its
        storage.append_records("b", reply, user_turn=True, turn_id="t-1")
        assert storage.has_turn("b", "t-1") and not storage.has_turn("b", "t-2")
    assert _index_sql(path).endswith("(turn_id) WHERE turn_id IS NOT NULL")


def test_the_idempotency_check_uses_the_index(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    SqliteMainStorage(path).close()
    with sqlite3.connect(path) as conn:
        plan = conn.execute(
            "EXPLAIN QUERY PLAN SELECT 1 FROM stello_record_rows WHERE l3_key = ? AND turn_id = ?",
            (1, "t-1"),
        ).fetchall()
    assert any("USING INDEX stello_records_turns (turn_id=?)" in row[-1] for row in plan), plan
