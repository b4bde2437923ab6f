"""Schema version 10 keys the records by a compact session key (`stello_sessions.l3_key`)
in `stello_record_rows`; `stello_records` is a view with the old table's columns, which
writes through. A file made before keeps every record, turn and shared prefix."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from stello_graph.checkpoints import SqliteMainStorage, _schema
from stello_graph.checkpoints._serde import encode_message
from stello_graph.models import SessionMeta
from tests.storage._old_files import file_at_version, put_old_session

_COLUMNS = ["tree_id", "session_id", "seq", "type", "data", "created_at", "turn_id", "turn_seq"]


def _records(conn: sqlite3.Connection) -> list[tuple[object, ...]]:
    sql = "SELECT * FROM stello_records ORDER BY tree_id, session_id, seq"
    return [tuple(row) for row in conn.execute(sql)]


def _v9_file(path: Path) -> list[tuple[object, ...]]:
    """A version 9 file: the same session id in two trees, turns with and without ids, and
    a fork that shares its source's first two records; its records as that version read."""
    conn = file_at_version(path, 9)
    for tree in ("default", "other"):
        put_old_session(conn, "s1", tree, tree)
    put_old_session(conn, "fork")
    turns = [(HumanMessage("q1", id="h1"), "h1", 0), (AIMessage("a1"), None, 1),
             (HumanMessage("q2", id="h2"), "h2", 0), (AIMessage("a2"), None, 1)]  # fmt: skip
    for tree, count in (("default", 4), ("other", 2)):
        for seq, (message, turn_id, turn_seq) in enumerate(turns[:count]):
            conn.execute(
                "INSERT INTO stello_records VALUES (?, 's1', ?, ?, ?, '2026-01-01', ?, ?)",
                (tree, seq, *encode_message(message), turn_id, turn_seq),
            )
        conn.execute("UPDATE stello_sessions SET next_seq = ?, turn_count = ? "
                     "WHERE tree_id = ? AND id = 's1'", (count, count // 2, tree))  # fmt: skip
    conn.execute(
        "UPDATE stello_sessions SET base_id = 's1', base_count = 2 "
        "WHERE tree_id = 'default' AND id = 'fork'"
    )
    conn.execute(  # one record of the fork's own after the shared prefix
        "INSERT INTO stello_records VALUES ('default', 'fork', 0, ?, ?, '2026-01-02', 'h9', 0)",
        encode_message(HumanMessage("own", id="h9")),
    )
    conn.execute("UPDATE stello_sessions SET next_seq = 1 WHERE id = 'fork'")
    before = _records(conn)
    conn.close()
    return before


def _contents(storage: SqliteMainStorage, session_id: str) -> list[str]:
    return [str(message.content) for message in storage.list_records(session_id)]


def test_a_version_9_file_keeps_its_records_turns_and_prefixes(tmp_path: Path) -> None:
    path = tmp_path / "v9.db"
    before = _v9_file(path)
    with SqliteMainStorage(path) as storage:
        assert _schema.read_version(storage._conn) == _schema.SCHEMA_VERSION
        assert _records(storage._conn) == before  # the view reads what the table held
        assert _contents(storage, "s1") == ["q1", "a1", "q2", "a2"]
        assert _contents(storage, "fork") == ["q1", "a1", "own"]
        assert [t for t, _ in storage.list_record_turns("s1")] == ["h1", "h1", "h2", "h2"]
        assert storage.has_turn("s1", "h2") and storage.has_turn("fork", "h9")
        assert not storage.has_turn("fork", "h2")  # past the fork's shared prefix
        storage.put_session(SessionMeta(id="s2", label="new"))
        storage.append_records("s2", [HumanMessage("fresh")], user_turn=True, turn_id="t")
        assert _contents(storage, "s2") == ["fresh"]
    with SqliteMainStorage(path, tree_id="other") as other:
        assert _contents(other, "s1") == ["q1", "a1"]
        assert not other.has_turn("s1", "h2")  # the same session id in another tree
    with sqlite3.connect(path) as conn:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(stello_records)")]
        assert columns == _COLUMNS
        keys = conn.execute("SELECT l3_key FROM stello_sessions ORDER BY l3_key").fetchall()
        assert len({key for (key,) in keys}) == len(keys) == 4


def test_the_view_writes_through_and_deletions_count_as_changes(tmp_path: Path) -> None:
    path = tmp_path / "v9.db"
    _v9_file(path)
    SqliteMainStorage(path).close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")

    def version() -> int:
        row = conn.execute("SELECT version FROM stello_changes WHERE tree_id = 'default'")
        return int(row.fetchone()[0])

    start = version()
    conn.execute(
        "INSERT INTO stello_records (tree_id, session_id, seq, type, data, created_at) "
        "VALUES ('default', 's1', 4, 'human', ?, 'now')",
        (encode_message(HumanMessage("via the view"))[1],),
    )
    conn.execute(
        "UPDATE stello_records SET turn_id = 'h5' WHERE tree_id = 'default' "
        "AND session_id = 's1' AND seq = 4"
    )
    assert version() == start + 3  # an update counts for the old row and the new, as before
    row = conn.execute(
        "SELECT turn_id FROM stello_record_rows r JOIN stello_sessions s USING (l3_key) "
        "WHERE s.tree_id = 'default' AND s.id = 's1' AND r.seq = 4"
    ).fetchone()
    assert row == ("h5",)
    conn.execute("DELETE FROM stello_records WHERE tree_id = 'default' AND session_id = 's1' "
                 "AND seq = 4")  # fmt: skip
    assert version() == start + 4
    other = conn.execute("SELECT COUNT(*) FROM stello_records WHERE tree_id = 'other'")
    conn.execute("DELETE FROM stello_sessions WHERE tree_id = 'other' AND id = 's1'")
    assert other.fetchone() == (2,)
    left = conn.execute("SELECT COUNT(*) FROM stello_record_rows").fetchone()
    assert left == (5,)  # s1's four and the fork's own; the other tree's went with it
    changed = conn.execute("SELECT version FROM stello_changes WHERE tree_id = 'other'")
    assert changed.fetchone() is not None  # a cascade counts as a change of that tree
    conn.close()


def test_keys_survive_vacuum_and_are_never_given_twice(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    with SqliteMainStorage(path) as storage:
        for sid in ("a", "b", "c"):
            storage.put_session(SessionMeta(id=sid, label=sid))
            storage.append_records(sid, [HumanMessage(sid)])
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("DELETE FROM stello_sessions WHERE id IN ('a', 'c')")  # c held the top key
    conn.execute("VACUUM")
    conn.close()
    with SqliteMainStorage(path) as storage:
        storage.put_session(SessionMeta(id="d", label="d"))
        storage.append_records("d", [HumanMessage("d")])
        assert [_contents(storage, sid) for sid in ("b", "c", "d")] == [["b"], [], ["d"]]
        keys = storage._conn.execute("SELECT id, l3_key FROM stello_sessions ORDER BY id")
        assert [sid for sid, _ in keys.fetchall()] == ["b", "d"]


@pytest.mark.parametrize("session_id", ["s1", "fork"])
def test_a_session_read_goes_through_the_key(tmp_path: Path, session_id: str) -> None:
    path = tmp_path / "new.db"
    _v9_file(path)
    SqliteMainStorage(path).close()
    with sqlite3.connect(path) as conn:
        plan = conn.execute(
            "EXPLAIN QUERY PLAN SELECT data FROM stello_records "
            "WHERE tree_id = ? AND session_id = ? ORDER BY seq",
            ("default", session_id),
        ).fetchall()
    details = [row[-1] for row in plan]
    assert any("sqlite_autoindex_stello_record_rows_1 (l3_key=?)" in d for d in details), plan
    assert not any("SCAN" in d or "TEMP B-TREE" in d for d in details), plan


def test_a_session_deleted_without_foreign_keys_takes_its_records(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    with SqliteMainStorage(path, tree_id="alice") as alice:
        alice.put_session(SessionMeta(id="note", label="N"))
        alice.append_records("note", [HumanMessage("alice's private note")])
    conn = sqlite3.connect(path, isolation_level=None)  # the sqlite3 shell's default: no FKs
    conn.execute("DELETE FROM stello_sessions WHERE tree_id = 'alice'")
    assert conn.execute("SELECT COUNT(*) FROM stello_record_rows").fetchone() == (0,)
    conn.close()
    with SqliteMainStorage(path, tree_id="bob") as bob:  # it gets the freed key
        bob.put_session(SessionMeta(id="new", label="New"))
        assert bob.list_records("new") == []


def test_a_session_row_without_a_key_gets_one_when_it_is_written(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    SqliteMainStorage(path).close()
    conn = sqlite3.connect(path, isolation_level=None)
    put_old_session(conn, "outside")  # written by a tool that knows nothing of the key
    conn.close()
    with SqliteMainStorage(path) as storage:
        storage.put_session(SessionMeta(id="outside", label="Outside"))
        storage.append_records("outside", [HumanMessage("q")])
        assert [m.content for m in storage.list_records("outside")] == ["q"]
