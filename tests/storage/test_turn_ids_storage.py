"""The storage side of turn ids: columns, the idempotency lookup, trims and the v5 migration."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from stello_graph.checkpoints import SqliteMainStorage, _schema
from stello_graph.checkpoints._serde import encode_message
from stello_graph.models import SessionMeta
from stello_graph.storage import MainStorage
from tests.conftest import Api
from tests.storage._old_files import file_at_version, put_old_session


async def test_append_records_numbers_the_turn(api: Api) -> None:
    await api("put_session", SessionMeta(id="s1", label=""))
    await api("append_records", "s1", [HumanMessage("q"), AIMessage("a")], turn_id="t1")
    await api("append_records", "s1", [HumanMessage("q2"), AIMessage("a2")])
    found = await api("list_record_turns", "s1")
    assert found[:2] == [("t1", 0), ("t1", 1)]
    assert [seq for _, seq in found[2:]] == [0, 1] and found[2][0] == found[3][0] != "t1"
    assert await api("list_record_turns", "s1", role="ai", offset=1) == [found[3]]
    assert await api("has_turn", "s1", "t1")
    assert not await api("has_turn", "s1", "t2")
    assert not await api("has_turn", "missing", "t1")


def test_a_trim_keeps_the_turn_of_the_first_kept_record(main_storage: MainStorage) -> None:
    storage = main_storage
    storage.put_session(SessionMeta(id="s1", label=""))
    records = [HumanMessage("q"), AIMessage("a"), HumanMessage("q2")]
    storage.append_records("s1", records, turn_id="t1")
    storage.trim_records("s1", 2)
    assert storage.list_record_turns("s1") == [("t1", 1), ("t1", 2)]
    assert storage.has_turn("s1", "t1")


def _v4_file(path: Path) -> None:
    file_at_version(path, 4).close()
    rows = [
        AIMessage("a greeting before any user message"),
        HumanMessage("q1", id="h1"),
        AIMessage("", tool_calls=[{"name": "f", "args": {}, "id": "c1"}]),
        ToolMessage("r", tool_call_id="c1"),
        AIMessage("a1"),
        HumanMessage("q2"),
        AIMessage("a2"),
    ]
    conn = sqlite3.connect(path, isolation_level=None)
    put_old_session(conn, "s1")

    for seq, message in enumerate(rows):
        role, data = encode_message(message)
        conn.execute(
            "INSERT INTO stello_records VALUES ('default', 's1', ?, ?, ?, '2026-01-01')",
            (seq, role, data),
        )
    conn.execute("UPDATE stello_sessions SET next_seq = ?", (len(rows),))
    conn.close()


def test_records_of_a_v4_file_get_turns_by_user_turn(tmp_path: Path) -> None:
    path = tmp_path / "v4.db"
    _v4_file(path)
    with SqliteMainStorage(path) as storage:
        found = storage.list_record_turns("s1")
        assert [seq for _, seq in found] == [0, 0, 1, 2, 3, 0, 1]
        assert found[1] == ("h1", 0)  # a user message's id is its turn's
        assert len({tid for tid, _ in found}) == 3
        assert storage.has_turn("s1", "h1")
        storage.append_records("s1", [HumanMessage("q3")], turn_id="t3")
        assert storage.list_record_turns("s1")[-1] == ("t3", 0)
    versions = sqlite3.connect(path).execute("SELECT MAX(version) FROM stello_schema").fetchone()
    assert versions == (_schema.SCHEMA_VERSION,)
