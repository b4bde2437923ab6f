"""The primitives of `PostgresMainStorage` on a real PostgreSQL: the async ones against the
sync ones, transactions and the tree lock, the event log and its notifications."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from langchain_core.messages import AIMessage, HumanMessage

from stello_graph.checkpoints import PostgresMainStorage
from stello_graph.checkpoints._serde import encode_message, meta_to_row
from stello_graph.checkpoints.postgres import EVENTS_CHANNEL
from stello_graph.errors import SessionNotFoundError
from stello_graph.models import SessionMeta, TopologyNode


@pytest.fixture
def storages(postgres_dsn: str) -> Iterator[tuple[PostgresMainStorage, PostgresMainStorage]]:
    """Two trees of one database: the sync primitives run on one, the async on the other."""
    with (
        PostgresMainStorage(postgres_dsn, tree_id="sync") as one,
        PostgresMainStorage(postgres_dsn, tree_id="async") as other,
    ):
        yield one, other


def _row(sid: str, label: str, role: str = "standard") -> tuple[str, ...]:
    meta = SessionMeta(id=sid, label=label, role=role)
    return meta_to_row(meta.model_copy(update={"created_at": _AT, "updated_at": _AT}))


_AT = SessionMeta(id="x", label="x").created_at
_RECORDS = [encode_message(HumanMessage("hi")), encode_message(AIMessage("hello"))]

SCRIPT: list[tuple[str, tuple[Any, ...]]] = [
    ("op_put_session", (_row("main", "Main", "main"),)),
    ("op_put_session", (_row("a", "A"),)),
    ("op_put_session", (_row("b", "B\x00nul"),)),
    ("op_put_node", (TopologyNode(id="main", parent_id=None, label="Main"),)),
    ("op_put_node", (TopologyNode(id="a", parent_id="main", label="A"),)),
    ("op_put_node", (TopologyNode(id="b", parent_id="a", label="B\x00nul"),)),
    ("op_append", ("a", _RECORDS, "2024-01-01T00:00:00+00:00", True, [("t1", 0), ("t1", 1)])),
    ("op_append", ("a", _RECORDS[:1], "2024-01-02T00:00:00+00:00", True, [("t2", 0)])),
    ("op_set_fields", ("a", {"memory": "L2 of a", "memory_through": 2, "insight": "\x01x"})),
    ("op_read_session", ("a", ("memory", "memory_through", "insight", "forked_from"), False)),
    ("op_read_session", ("missing", ("memory",), False)),
    ("op_read_session", ("a", (), False)),
    ("op_read_session", ("missing", (), False)),
    ("op_read_session", ("b", (), False)),
    ("op_list_sessions", (None, None)),
    ("op_list_sessions", ("active", "standard")),
    ("op_l2s_after", (0, 100)),
    ("op_session_stats", ()),
    ("op_records", ("a",)),
    ("op_turns", ("a",)),
    ("op_has_turn", ("a", "t2")),
    ("op_has_turn", ("a", "t9")),
    ("op_count", ("a",)),
    ("op_copy_records", ("a", "b", 2)),
    ("op_turns", ("b",)),
    ("op_drop_oldest", ("a", 1)),
    ("op_turns", ("a",)),
    ("op_nodes", ("b", None)),
    ("op_nodes", (None, "main")),
    ("op_nodes", (None, None)),
    ("op_put_global", ("k", '{"v":1}')),
    ("op_get_global", ("k",)),
    ("op_get_global", ("none",)),
    ("op_append_event", ("fork", "a", '{"x":1}', "2024-01-03T00:00:00+00:00")),
    ("op_append_event", ("failure", None, "{}", "2024-01-04T00:00:00+00:00")),
    ("op_events_after", (0, 10)),
    ("op_events_after", (1, 10)),
    ("op_delete_sessions", (["b"],)),
    ("op_nodes", (None, None)),
]
"""Every primitive, each once or more, in an order that makes each one's result telling."""


def _comparable(value: Any) -> Any:
    """Results made comparable across trees (messages compared by their JSON)."""
    if isinstance(value, list | tuple):
        return [_comparable(item) for item in value]
    if hasattr(value, "model_dump"):
        return value.model_dump()
    return value


async def test_async_primitives_return_what_the_sync_ones_do(
    storages: tuple[PostgresMainStorage, PostgresMainStorage],
) -> None:
    sync, native = storages
    hooks, ahooks = sync.transaction_hooks, native.async_transaction_hooks
    for name, args in SCRIPT:
        hooks.begin(wait=True)
        expected = getattr(sync, name)(*args)
        hooks.commit()
        assert await ahooks.begin(wait=True)
        found = await getattr(native, f"a{name}")(*args)
        await ahooks.commit()
        assert _comparable(found) == _comparable(expected), name
    assert sync.get_session("b") is None  # the script's delete ran on each tree alone
    assert native.get_node("a") == TopologyNode(id="a", parent_id="main", label="A")
    assert sync.op_turns("a") == [("t1", 1), ("t2", 0)]
    assert sync.get_session("main") is not None and native.get_session("main") is not None


async def test_the_sync_script_reads_as_expected(
    storages: tuple[PostgresMainStorage, PostgresMainStorage],
) -> None:
    """The script's key results, stated (so the comparison above compares something)."""
    sync, _ = storages
    results = {}
    for index, (name, args) in enumerate(SCRIPT):
        with sync.transaction():
            results[index] = getattr(sync, name)(*args)
    by_name = {f"{name}#{i}": results[i] for i, (name, _) in enumerate(SCRIPT)}
    assert by_name["op_read_session#9"][1] == ("L2 of a", 2, "\x01x", None)
    assert by_name["op_read_session#10"] is None
    assert by_name["op_read_session#12"] is None
    assert by_name["op_read_session#13"][0].label == "B\x00nul"
    assert by_name["op_copy_records#23"] == 2
    assert by_name["op_turns#24"] == [("t1", 0), ("t1", 1)]
    assert [row[0] for row in by_name["op_events_after#35"]] == [1, 2]
    assert by_name["op_events_after#36"] == [
        (2, "failure", None, "{}", "2024-01-04T00:00:00+00:00")
    ]
    assert [row[1] for row in by_name["op_l2s_after#16"]] == ["a"]


async def test_an_async_savepoint_rolls_back_its_block_only(postgres_dsn: str) -> None:
    with PostgresMainStorage(postgres_dsn) as storage:
        storage.put_session(SessionMeta(id="s", label="S"))
        hooks = storage.async_transaction_hooks
        assert await hooks.begin(wait=True)
        await storage.aop_set_fields("s", {"insight": "kept"})
        await hooks.savepoint(1)
        await storage.aop_set_fields("s", {"insight": "undone"})
        with pytest.raises(SessionNotFoundError):
            await storage.aop_set_fields("missing", {"insight": "x"})
        await hooks.rollback_to(1)
        # a sync primitive from a worker thread runs in the same (async) transaction
        found = await asyncio.to_thread(storage.op_read_session, "s", ("insight",), False)
        assert found is not None and found[1] == ("kept",)
        await hooks.commit()
        assert storage.get_insight("s") == "kept"
        assert await hooks.begin(wait=True)
        await storage.aop_set_fields("s", {"insight": "rolled back"})
        await hooks.rollback()
        assert storage.get_insight("s") == "kept"


def test_a_write_to_a_tree_waits_for_another_connection_and_other_trees_do_not(
    postgres_dsn: str,
) -> None:
    with (
        PostgresMainStorage(postgres_dsn, tree_id="alice") as first,
        PostgresMainStorage(postgres_dsn, tree_id="alice") as second,
        PostgresMainStorage(postgres_dsn, tree_id="bob") as bob,
    ):
        first.put_session(SessionMeta(id="s", label="S"))
        with first.transaction():
            first.put_insight("s", "first")
            assert second.transaction_hooks.begin(wait=False) is False
            assert bob.transaction_hooks.begin(wait=False) is True  # trees do not block
            bob.transaction_hooks.rollback()
            done = threading.Event()

            def write() -> None:
                second.put_insight("s", "second")  # waits for `first` to commit
                done.set()

            thread = threading.Thread(target=write)
            thread.start()
            assert not done.wait(0.3)
        thread.join(timeout=10)
        assert done.is_set()
        assert first.get_insight("s") == "second"


async def test_the_async_try_lock_is_refused_while_another_connection_writes(
    postgres_dsn: str,
) -> None:
    with (
        PostgresMainStorage(postgres_dsn) as first,
        PostgresMainStorage(postgres_dsn) as second,
    ):
        with first.transaction():
            first.put_session(SessionMeta(id="s", label="S"))
            assert await second.async_transaction_hooks.begin(wait=False) is False
        assert await second.async_transaction_hooks.begin(wait=False) is True
        await second.async_transaction_hooks.rollback()


def test_each_appended_event_is_notified_at_commit(postgres_dsn: str) -> None:
    with (
        PostgresMainStorage(postgres_dsn, tree_id="alice") as storage,
        psycopg.connect(postgres_dsn, autocommit=True) as listener,
    ):
        listener.execute(f"LISTEN {EVENTS_CHANNEL}")
        with storage.transaction():
            cursors = [
                storage.op_append_event("fork", None, "{}", "2024-01-01T00:00:00+00:00"),
                storage.op_append_event("consolidated", "s", "{}", "2024-01-01T00:00:00+00:00"),
            ]
        with pytest.raises(RuntimeError), storage.transaction():  # noqa: PT012 (rolled back)
            storage.op_append_event("lost", None, "{}", "2024-01-01T00:00:00+00:00")
            raise RuntimeError
        payloads = [json.loads(n.payload) for n in listener.notifies(timeout=2, stop_after=2)]
        assert cursors == [1, 2]
        assert payloads == [{"tree_id": "alice", "cursor": 1}, {"tree_id": "alice", "cursor": 2}]
        assert [n.payload for n in listener.notifies(timeout=0.3)] == []
        assert [row[0] for row in storage.op_events_after(0, 10)] == [1, 2]


def test_copy_records_refuses_a_missing_session(postgres_dsn: str) -> None:
    with PostgresMainStorage(postgres_dsn) as storage:
        storage.put_session(SessionMeta(id="s", label="S"))
        for source, target in (("s", "missing"), ("missing", "s")):
            with pytest.raises(SessionNotFoundError), storage.transaction():
                storage.op_copy_records(source, target, 5)
        with storage.transaction():
            assert storage.op_copy_records("s", "s", 5) == 0


def test_cached_records_follow_every_change_of_every_connection(postgres_dsn: str) -> None:
    with (
        PostgresMainStorage(postgres_dsn) as first,
        PostgresMainStorage(postgres_dsn) as second,
    ):
        first.put_session(SessionMeta(id="s", label="S"))
        first.append_records("s", [HumanMessage("one")])

        def texts(storage: PostgresMainStorage) -> list[str]:
            return [m.text for m in storage.list_records("s")]

        assert texts(first) == texts(second) == ["one"]  # both cached now
        second.append_records("s", [HumanMessage("two")])
        assert texts(first) == ["one", "two"]
        first.append_records("s", [HumanMessage("three")])  # extends its cached list
        assert texts(first) == texts(second) == ["one", "two", "three"]
        with pytest.raises(RuntimeError), first.transaction():  # noqa: PT012 (rolled back)
            first.append_records("s", [HumanMessage("undone")])
            assert texts(first) == ["one", "two", "three", "undone"]
            raise RuntimeError
        assert texts(first) == ["one", "two", "three"]
        second.trim_records("s", 1)
        assert texts(first) == ["three"]
        with second.transaction():
            second.op_delete_sessions(["s"])
        assert texts(first) == []
