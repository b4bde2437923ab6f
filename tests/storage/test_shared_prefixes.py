"""Shared L3 prefixes: a fork's inherited records read exactly as a copy would, whatever
later happens to its source (appends, trims, removal), through several generations, on
every backend and through the sync and async methods."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from stello_graph import Session
from stello_graph.checkpoints import SqliteMainStorage, _schema, _shared_l3
from stello_graph.models import SessionMeta, TopologyNode
from tests.conftest import Api
from tests.storage._old_files import file_at_version


async def _session(api: Api, sid: str, turns: int = 0, start: int = 0) -> None:
    await api("put_session", SessionMeta(id=sid, label=sid))
    await api("put_node", TopologyNode(id=sid, parent_id=None, label=sid))
    await _turns(api, sid, turns, start)


async def _turns(api: Api, sid: str, turns: int, start: int = 0) -> None:
    for n in range(start, start + turns):
        pair = [HumanMessage(f"{sid}-q{n}"), AIMessage(f"{sid}-a{n}")]
        await api("append_records", sid, pair, user_turn=True)


async def _view(api: Api, sid: str) -> tuple[list[Any], list[Any], int]:
    """What a session's L3 reads as: texts, turns, count."""
    texts = [m.content for m in await api("list_records", sid)]
    turns = await api("list_record_turns", sid)
    count = await api("count_records", sid)
    assert count == len(texts) == len(turns)
    return texts, turns, count


async def _fork(api: Api, source: str, target: str, count: int) -> None:
    await _session(api, target)
    assert await api("copy_records", source, target, count=count) == count


async def test_a_fork_reads_its_prefix_whatever_the_source_does_next(api: Api) -> None:
    await _session(api, "src", turns=4)
    await _fork(api, "src", "kid", 6)
    inherited = await _view(api, "kid")
    src_turns = await api("list_record_turns", "src")
    assert inherited == (
        [m.content for m in await api("list_records", "src")][:6],
        src_turns[:6],
        6,
    )
    await _turns(api, "src", 2, start=4)  # the source keeps turning
    assert await _view(api, "kid") == inherited
    assert await api("trim_records", "src", keep_last=3) == 9  # and trims below the cut
    assert await _view(api, "kid") == inherited
    assert await api("count_records", "src") == 3
    await _turns(api, "kid", 1, start=9)  # the child's own turn goes after its prefix
    texts, turns, count = await _view(api, "kid")
    assert (texts[:6], turns[:6], count) == (inherited[0], inherited[1], 8)
    assert texts[6:] == ["kid-q9", "kid-a9"]
    assert await api("has_turn", "kid", src_turns[0][0])
    assert not await api("has_turn", "kid", src_turns[6][0])  # after the cut: not inherited
    assert await api("get_turn_count", "kid") == 1


async def test_a_removed_source_leaves_its_forks_whole(api: Api) -> None:
    await _session(api, "src", turns=3)
    await _fork(api, "src", "kid", 4)
    await _fork(api, "kid", "grandkid", 3)  # inside kid's shared prefix
    await _turns(api, "kid", 1, start=7)
    await _fork(api, "kid", "late", 6)  # beyond it: kid's prefix and one own turn
    views = {sid: await _view(api, sid) for sid in ("kid", "grandkid", "late")}
    assert views["late"][0] == [*views["kid"][0][:4], "kid-q7", "kid-a7"]
    assert await api("remove_node", "src") == ["src"]
    assert await api("get_session", "src") is None
    for sid, view in views.items():
        assert await _view(api, sid) == view, sid
    assert await api("remove_node", "kid") == ["kid"]  # a session between two generations
    for sid in ("grandkid", "late"):
        assert await _view(api, sid) == views[sid], sid


async def test_prefixes_through_several_generations(api: Api) -> None:
    await _session(api, "a", turns=3)
    await _fork(api, "a", "b", 6)
    await _turns(api, "b", 2, start=10)
    await _fork(api, "b", "c", 10)
    await _turns(api, "c", 1, start=20)
    await _fork(api, "c", "d", 12)
    expected = [f"a-{k}{n}" for n in range(3) for k in "qa"]
    expected += [f"b-{k}{n}" for n in (10, 11) for k in "qa"]
    expected += ["c-q20", "c-a20"]
    assert (await _view(api, "d"))[0] == expected
    await api("put_memory", "d", "d L2", through=3)  # inside a's rows, two generations up
    stats = {s.id: s for s in await api("list_session_stats")}
    assert (stats["d"].records, stats["d"].turns_since_memory) == (12, 4)
    assert (stats["c"].records, stats["c"].turns_since_memory) == (12, 6)
    digests = {d.id: d for d in await api("list_session_digests")}
    assert (digests["d"].stale_turns, digests["c"].stale_turns) == (4, 6)
    before = {sid: await _view(api, sid) for sid in "bcd"}
    await api("trim_records", "b", keep_last=2)  # a middle generation trims its own prefix
    await api("trim_records", "a", keep_last=1)
    for sid in "cd":
        assert await _view(api, sid) == before[sid], sid
    assert (await _view(api, "b"))[0] == ["b-q11", "b-a11"]
    await api("trim_records", "d", keep_last=5)  # the newest one trims inside inherited rows
    assert (await _view(api, "d"))[0] == expected[-5:]


async def test_counts_and_digests_cover_the_inherited_records(api: Api) -> None:
    await _session(api, "src", turns=3)
    await _fork(api, "src", "kid", 6)
    await _turns(api, "kid", 2, start=3)
    await api("put_memory", "kid", "kid L2", through=4)  # a cursor inside the prefix
    stats = {s.id: s for s in await api("list_session_stats")}
    assert (stats["kid"].records, stats["kid"].turns, stats["kid"].turns_since_memory) == (
        10,
        2,
        3,
    )
    digests = {d.id: d for d in await api("list_session_digests")}
    assert (digests["kid"].turns, digests["kid"].stale_turns) == (2, 3)
    await api("put_memory", "kid", "kid L2", through=8)  # a cursor after it
    digests = {d.id: d for d in await api("list_session_digests")}
    assert digests["kid"].stale_turns == 1


async def test_copying_into_a_target_with_records_goes_through_the_prefix(api: Api) -> None:
    await _session(api, "src", turns=2)
    await _fork(api, "src", "kid", 4)
    await _turns(api, "kid", 1, start=5)
    await _session(api, "other")
    await api("append_records", "other", [AIMessage("hello")])
    assert await api("copy_records", "kid", "other", count=5) == 6
    texts = (await _view(api, "other"))[0]
    assert texts == ["hello", "src-q0", "src-a0", "src-q1", "src-a1", "kid-q5"]


async def test_a_shared_fork_rolled_back_leaves_nothing(api: Api) -> None:
    await _session(api, "src", turns=2)
    await _session(api, "kid")
    await api("list_records", "src")  # the source's records are cached where there is a cache

    async def share_then_fail() -> None:
        async with api.transaction():
            await api("copy_records", "src", "kid", count=4)
            assert (await _view(api, "kid"))[2] == 4
            raise RuntimeError("undo")

    with pytest.raises(RuntimeError):
        await share_then_fail()
    assert await _view(api, "kid") == ([], [], 0)
    await _turns(api, "kid", 1, start=7)  # its own records start from the first again
    assert (await _view(api, "kid"))[0] == ["kid-q7", "kid-a7"]


def test_a_session_forked_through_the_api_shares_on_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "stello.db"
    with SqliteMainStorage(path) as storage:
        a = Session.create(storage, label="A")
        for n in range(3):
            storage.append_records(a.id, [HumanMessage(f"q{n}"), AIMessage(f"r{n}")])
        b = a.fork("B", context="inherit")
        storage.append_records(b.id, [HumanMessage("b"), AIMessage("rb")])
        c = b.fork("C", context="inherit", at_turn=2)  # inside b's shared prefix
        d = b.fork("D", context="inherit")
    with sqlite3.connect(path) as conn:
        sql = "SELECT id, base_id, base_count FROM stello_sessions WHERE base_id IS NOT NULL"
        bases = {row[0]: row[1:] for row in conn.execute(sql)}
        # C points at A itself (the rows' holder), D at B (A's rows and one turn of B's)
        assert bases == {b.id: (a.id, 6), c.id: (a.id, 4), d.id: (b.id, 8)}
        assert conn.execute("SELECT COUNT(*) FROM stello_records").fetchone() == (8,)


def test_a_v7_file_keeps_its_copied_forks(tmp_path: Path) -> None:
    path = tmp_path / "v7.db"
    conn = file_at_version(path, 7)
    for sid, seq in (("src", 1), ("kid", 2)):
        conn.execute(
            "INSERT INTO stello_sessions (tree_id, id, label, role, status, tags, metadata, "
            "created_at, updated_at, created_seq, next_seq) VALUES ('default', ?, ?, "
            "'standard', 'active', '[]', '{}', '2025-01-01T00:00:00+00:00', "
            "'2025-01-01T00:00:00+00:00', ?, 2)",
            (sid, sid, seq),
        )
        for n, (kind, text) in enumerate((("human", "q"), ("ai", "a"))):
            data = f'{{"type":"{kind}","data":{{"content":"{text}"}}}}'
            conn.execute(
                "INSERT INTO stello_records (tree_id, session_id, seq, type, data, created_at,"
                " turn_id, turn_seq) VALUES ('default', ?, ?, ?, ?, "
                "'2025-01-01T00:00:00+00:00', ?, ?)",
                (sid, n, kind, data, "t1" if n == 0 else None, n),
            )
    conn.close()
    with SqliteMainStorage(path) as storage:
        assert _schema.read_version(storage._conn) == _schema.SCHEMA_VERSION
        storage.trim_records("src", keep_last=0)
        assert [m.content for m in storage.list_records("kid")] == ["q", "a"]
        assert storage.list_record_turns("kid") == [("t1", 0), ("t1", 1)]


async def test_a_removal_finds_dependents_in_bounded_statements(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_shared_l3, "_CHUNK", 1)  # one id per statement
    await _session(api, "top")
    for sid in ("a", "b"):
        await api("put_session", SessionMeta(id=sid, label=sid))
        await api("put_node", TopologyNode(id=sid, parent_id="top", label=sid))
        await _turns(api, sid, 1)
    await _fork(api, "b", "kid", 2)  # outside the removed subtree, sharing b's rows
    await _fork(api, "a", "inside", 2)
    await api("put_node", TopologyNode(id="inside", parent_id="a", label="inside"))
    assert sorted(await api("remove_node", "top", cascade=True)) == ["a", "b", "inside", "top"]
    assert (await _view(api, "kid"))[0] == ["b-q0", "b-a0"]
