"""`transaction(savepoints=False)`: an all-or-nothing block. The calls inside it set no
savepoint of their own, and a failure of any of them undoes the whole block, even when the
failure is caught inside it. Flows run in one transaction (`_flow.Atomic`: a fork, a
consolidation's write) use it."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage

from stello_graph._fork import ForkRequest, fork_session
from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.errors import SessionNotFoundError, StorageError
from stello_graph.models import SessionMeta
from tests.conftest import Api


@asynccontextmanager
async def _whole(api: Api) -> AsyncIterator[None]:
    if api.mode == "sync":
        with api.storage.transaction(savepoints=False):
            yield
    else:
        async with api.storage.atransaction(savepoints=False):
            yield


def _ids(api: Api) -> list[str]:
    return [meta.id for meta in api.storage.list_sessions()]


async def test_the_block_commits_every_call(api: Api) -> None:
    async with _whole(api):
        await api("put_session", SessionMeta(id="a", label="A"))
        await api("append_records", "a", [HumanMessage("q")])
        await api("put_session", SessionMeta(id="b", label="B"))
    assert _ids(api) == ["a", "b"]
    assert [m.content for m in await api("list_records", "a")] == ["q"]


async def _fails_inside(api: Api, *, catch: bool) -> None:
    """A whole block whose second call fails (the failure caught inside it, or not)."""
    async with _whole(api):
        await api("put_session", SessionMeta(id="a", label="A"))
        if not catch:
            await api("append_records", "missing", [HumanMessage("q")])
        with pytest.raises(SessionNotFoundError):
            await api("append_records", "missing", [HumanMessage("q")])
        await api("put_session", SessionMeta(id="b", label="B"))


async def test_a_failed_call_undoes_the_whole_block(api: Api) -> None:
    await api("put_session", SessionMeta(id="kept", label="K"))
    with pytest.raises(SessionNotFoundError):
        await _fails_inside(api, catch=False)
    assert _ids(api) == ["kept"]


async def test_a_caught_failure_still_undoes_the_block(api: Api) -> None:
    with pytest.raises(StorageError, match="all-or-nothing"):
        await _fails_inside(api, catch=True)
    assert _ids(api) == []
    await api("put_session", SessionMeta(id="c", label="C"))  # the storage works on
    assert _ids(api) == ["c"]


async def test_nested_in_a_transaction_the_block_is_one_savepoint(api: Api) -> None:
    async with api.transaction():
        await api("put_session", SessionMeta(id="outer", label="O"))
        with pytest.raises(StorageError, match="all-or-nothing"):
            await _fails_inside(api, catch=True)
        async with _whole(api):  # a later block of the same transaction starts whole
            await api("put_session", SessionMeta(id="later", label="L"))
    assert _ids(api) == ["outer", "later"]


def test_no_savepoint_per_call_on_sqlite(tmp_path: Path) -> None:
    with SqliteMainStorage(tmp_path / "a.db") as storage:
        seen: list[str] = []
        conn: sqlite3.Connection = storage._conn
        conn.set_trace_callback(seen.append)
        with storage.transaction(savepoints=False):
            storage.put_session(SessionMeta(id="a", label="A"))
            storage.append_records("a", [HumanMessage("q")])
        with storage.transaction():
            storage.put_session(SessionMeta(id="b", label="B"))
        conn.set_trace_callback(None)
    savepoints = [sql for sql in seen if sql.startswith("SAVEPOINT")]
    assert savepoints == ["SAVEPOINT stello_1"]  # the second block's call only


def test_a_fork_sets_no_savepoint(tmp_path: Path) -> None:
    with SqliteMainStorage(tmp_path / "a.db") as storage:
        storage.put_session(SessionMeta(id="src", label="S"))
        storage.append_records("src", [HumanMessage("q")], user_turn=True)
        seen: list[str] = []
        storage._conn.set_trace_callback(seen.append)
        fork_session(storage, ForkRequest.build("src", "Child", context="inherit"))
        storage._conn.set_trace_callback(None)
    assert not [sql for sql in seen if sql.startswith(("SAVEPOINT", "RELEASE"))]
    assert sum(sql.startswith("BEGIN") for sql in seen) == 1


def _append_then_read(storage: SqliteMainStorage) -> None:
    with storage.transaction(savepoints=False):
        with pytest.raises(StorageError):  # the first record is written meanwhile
            storage.append_records("a", [HumanMessage("small"), HumanMessage("x" * 5000)])
        storage.list_records("a")  # refused: it would read (and cache) that record


def test_a_broken_block_takes_no_further_call_so_no_cache_holds_its_rows(tmp_path: Path) -> None:
    with SqliteMainStorage(tmp_path / "a.db") as storage:
        storage.put_session(SessionMeta(id="a", label="A"))
        storage._conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 2000)  # the 2nd record cannot be
        with pytest.raises(StorageError, match="all-or-nothing") as raised:
            _append_then_read(storage)
        assert isinstance(raised.value.__cause__, StorageError)  # what the call raised
        storage._conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 1_000_000_000)
        assert storage.list_records("a") == [] and storage.count_records("a") == 0


def _whole_in_whole(storage: SqliteMainStorage) -> None:
    with storage.transaction(savepoints=False):
        storage.put_session(SessionMeta(id="a", label="A"))
        with storage.transaction(savepoints=False), pytest.raises(SessionNotFoundError):
            storage.append_records("missing", [HumanMessage("q")])
        raise AssertionError("the inner block's exit raises")  # pragma: no cover


def test_an_all_or_nothing_block_inside_another_fails_with_it(tmp_path: Path) -> None:
    with SqliteMainStorage(tmp_path / "a.db") as storage:
        with pytest.raises(StorageError, match="all-or-nothing"):
            _whole_in_whole(storage)
        assert storage.list_sessions() == []


def test_an_override_of_transaction_gets_plain_transactions(tmp_path: Path) -> None:
    calls: list[str] = []

    class Instrumented(SqliteMainStorage):
        def transaction(self):  # type: ignore[no-untyped-def,override]  # the protocol's own
            calls.append("transaction")
            return super().transaction()

    with Instrumented(tmp_path / "a.db") as storage:
        storage.put_session(SessionMeta(id="src", label="S"))
        child = fork_session(storage, ForkRequest.build("src", "Child"))
        assert storage.get_session(child.id) is not None
    assert calls  # the fork ran in the override's transaction
