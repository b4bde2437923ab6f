"""The storage side of branching: `copy_records` (rows copied inside the database), the
lineage fields, the whole-tree reads of lineage and texts, and the v6 migration."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from stello_graph import ForkPoint, Session
from stello_graph.checkpoints import SqliteMainStorage, _schema
from stello_graph.errors import InvalidInputError, SessionNotFoundError
from stello_graph.models import SessionMeta
from stello_graph.storage import MainStorage
from tests.conftest import Api
from tests.storage._old_files import file_at_version


async def _two(api: Api, turns: int = 3) -> None:
    await api("put_session", SessionMeta(id="src", label="Source"))
    await api("put_session", SessionMeta(id="dst", label="Target"))
    for n in range(turns):
        pair = [HumanMessage(f"q{n}"), AIMessage(f"a{n}")]
        await api("append_records", "src", pair, user_turn=True)


async def test_copy_records_appends_a_prefix_with_its_turns(api: Api) -> None:
    await _two(api)
    await api("append_records", "dst", [AIMessage("hello")])
    assert await api("copy_records", "src", "dst", count=4) == 5
    copied = await api("list_records", "dst")
    assert [m.content for m in copied] == ["hello", "q0", "a0", "q1", "a1"]
    source_turns = await api("list_record_turns", "src")
    assert (await api("list_record_turns", "dst"))[1:] == source_turns[:4]
    assert await api("has_turn", "dst", source_turns[0][0])
    # the counts the target keeps are its own: the copy is no user turn of the target
    assert await api("get_turn_count", "dst") == 0
    assert await api("count_records", "src") == 6
    # appending after a copy goes on from the copied records
    assert await api("append_records", "dst", [HumanMessage("next")]) == 6
    assert [m.content for m in await api("list_records", "dst")][-1] == "next"


async def test_copy_records_of_nothing_changes_nothing(api: Api) -> None:
    await _two(api)
    assert await api("copy_records", "src", "dst", count=0) == 0
    assert await api("list_records", "dst") == []


@pytest.mark.parametrize(
    ("source", "target", "count", "error", "message"),
    [
        ("missing", "dst", 1, SessionNotFoundError, "'missing' does not exist"),
        ("src", "missing", 1, SessionNotFoundError, "'missing' does not exist"),
        ("src", "dst", 7, InvalidInputError, "count=7 is beyond the 6 record"),
        ("src", "dst", -1, InvalidInputError, "count must be zero or more"),
        ("src", "dst", True, InvalidInputError, "count must be an int"),
        ("src", "src", 1, InvalidInputError, "into another session"),
        ("", "dst", 1, InvalidInputError, "session_id"),
    ],
)
async def test_copy_records_refuses_bad_calls(
    api: Api, source: str, target: str, count: object, error: type[Exception], message: str
) -> None:
    await _two(api)
    with pytest.raises(error, match=message):
        await api("copy_records", source, target, count=count)
    assert await api("count_records", "dst") == 0


async def test_a_copy_rolled_back_leaves_the_target_as_it_was(api: Api) -> None:
    await _two(api)
    await api("list_records", "src")  # the source's records are cached where there is a cache
    seen: list[int] = []

    async def copy_then_fail() -> None:
        async with api.transaction():
            await api("copy_records", "src", "dst", count=6)
            seen.append(await api("count_records", "dst"))
            raise RuntimeError("undo")

    with pytest.raises(RuntimeError):
        await copy_then_fail()
    assert seen == [6]
    assert await api("count_records", "dst") == 0
    assert await api("list_records", "dst") == []
    assert await api("copy_records", "src", "dst", count=2) == 2


async def test_lineage_round_trips_and_lists_in_one_read(api: Api) -> None:
    await _two(api)
    assert await api("get_lineage", "dst") is None
    await api("put_lineage", "dst", "src", 2)
    assert await api("get_lineage", "dst") == ForkPoint("dst", "src", 2)
    await api("put_session", SessionMeta(id="other", label="Other"))
    await api("put_lineage", "other", "dst", None)
    assert await api("list_lineage") == {
        "dst": ForkPoint("dst", "src", 2),
        "other": ForkPoint("other", "dst", None),
    }
    assert await api("get_lineage", "missing") is None


@pytest.mark.parametrize(
    ("session_id", "source_id", "at_turn", "error"),
    [
        ("missing", "src", 1, SessionNotFoundError),
        ("dst", "", 1, InvalidInputError),
        ("dst", "src", 0, InvalidInputError),
        ("dst", "src", -2, InvalidInputError),
        ("dst", "src", "3", InvalidInputError),
    ],
)
async def test_put_lineage_refuses_bad_values(
    api: Api, session_id: str, source_id: str, at_turn: object, error: type[Exception]
) -> None:
    await _two(api)
    with pytest.raises(error):
        await api("put_lineage", session_id, source_id, at_turn)
    assert await api("get_lineage", "dst") is None


async def test_digests_are_read_for_the_whole_tree(api: Api) -> None:
    await _two(api)
    await api("put_memory", "src", "source L2", through=2)
    await api("put_insight", "dst", "look here")
    src, dst = await api("list_session_digests")
    assert (src.id, src.label, src.role, src.status) == ("src", "Source", "standard", "active")
    assert (src.turns, src.l2, src.stale_turns, src.insight) == (3, "source L2", 2, None)
    assert (dst.turns, dst.l2, dst.stale_turns, dst.insight) == (0, None, 0, "look here")
    assert src.parent_id is None
    assert src.last_activity == (await api("get_session", "src")).updated_at


def test_an_inheriting_fork_shares_the_stored_rows(tmp_path: Path) -> None:
    path = tmp_path / "stello.db"
    with SqliteMainStorage(path) as storage:
        source = Session.create(storage, label="Source")
        for n in range(3):
            storage.append_records(source.id, [HumanMessage(f"q{n}"), AIMessage(f"a{n}")])
        child = source.fork("Child", context="inherit", at_turn=2)
    with sqlite3.connect(path) as conn:
        sql = "SELECT COUNT(*) FROM stello_records WHERE session_id = ?"
        assert conn.execute(sql, (child.id,)).fetchone() == (0,)  # no row written
        sql = "SELECT base_id, base_count, next_seq FROM stello_sessions WHERE id = ?"
        assert conn.execute(sql, (child.id,)).fetchone() == (source.id, 4, 4)
    with SqliteMainStorage(path) as storage:  # read back on a fresh connection
        assert [m.content for m in storage.list_records(child.id)] == ["q0", "a0", "q1", "a1"]


def _v5_file(path: Path) -> None:
    conn = file_at_version(path, 5)
    conn.execute(
        "INSERT INTO stello_sessions (tree_id, id, label, role, status, created_at, updated_at,"
        " created_seq) VALUES ('default', 's1', 'Old', 'standard', 'active', "
        "'2025-01-01T00:00:00+00:00', '2025-01-01T00:00:00+00:00', 1)"
    )
    conn.close()


def test_a_v5_file_gets_the_lineage_columns(tmp_path: Path) -> None:
    path = tmp_path / "v5.db"
    _v5_file(path)
    with SqliteMainStorage(path) as storage:
        assert _schema.read_version(storage._conn) == _schema.SCHEMA_VERSION
        assert storage.get_lineage("s1") is None
        storage.put_session(SessionMeta(id="s2", label="New"))
        storage.put_lineage("s2", "s1", None)
        assert storage.list_lineage() == {"s2": ForkPoint("s2", "s1", None)}


def test_the_reference_storages_hold_lineage_as_fields(main_storage: MainStorage) -> None:
    storage = main_storage
    storage.put_session(SessionMeta(id="s1", label=""))
    storage.put_session(SessionMeta(id="s2", label=""))
    storage.put_lineage("s2", "s1", 4)
    backend = storage._backend
    with storage.transaction():
        found = backend.op_read_session("s2", ("forked_from", "forked_at_turn"), False)
        assert found is not None and found[1] == ("s1", 4)
