"""The async seam: native async backends are awaited, sync-only ones run off the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from stello_graph.checkpoints import (
    AsyncStorageBackend,
    AsyncTransactionHooks,
    BackendStorage,
    InMemoryMainStorage,
    SqliteMainStorage,
    StorageBackend,
)
from stello_graph.checkpoints.backend import SessionRead
from stello_graph.models import SessionMeta
from tests.storage._third_party import InlineHooks, NativeMemory, open_suspending_memory


def _members(cls: type) -> set[str]:
    return {name for name in vars(cls) if not name.startswith("_")}


def test_every_primitive_has_an_async_twin() -> None:
    sync = {name for name in _members(StorageBackend) if name.startswith("op_")}
    added = _members(AsyncStorageBackend)
    assert added == {f"a{name}" for name in sync} | {"async_transaction_hooks"}
    assert _members(AsyncTransactionHooks) == {
        *("begin", "commit", "rollback", "savepoint", "release", "rollback_to")
    }


class _ThreadRecordingSqlite(SqliteMainStorage):
    """Records the thread every primitive and transaction boundary runs in."""

    threads: list[int]

    def op_read_session(
        self, session_id: str, names: Sequence[str], records: bool
    ) -> SessionRead | None:
        self.threads.append(threading.get_ident())
        return super().op_read_session(session_id, names, records)

    def op_set_fields(self, session_id: str, values: dict[str, Any]) -> None:
        self.threads.append(threading.get_ident())
        super().op_set_fields(session_id, values)


async def test_sqlite_runs_no_primitive_on_the_event_loop(tmp_path: Path) -> None:
    storage = _ThreadRecordingSqlite(tmp_path / "s.db")
    storage.threads = []
    with storage:
        await storage.aput_session(SessionMeta(id="s1", label="One"))
        await storage.aget_session("s1")
        await storage.aput_insight("s1", "hint")
        async with storage.atransaction():
            await storage.aget_session("s1")
            await storage.aput_insight("s1", "again")
            async with storage.atransaction():
                await storage.aclear_insight("s1")
        loop_thread = threading.get_ident()
        assert len(storage.threads) == 6
        assert loop_thread not in storage.threads
        assert storage.get_insight("s1") is None


class _RecordingHooks(InlineHooks):
    def __init__(self, storage: InMemoryMainStorage, calls: list[str]) -> None:
        super().__init__(storage.transaction_hooks)
        self.calls = calls

    async def begin(self, *, wait: bool) -> bool:
        self.calls.append("begin")
        return await super().begin(wait=wait)

    async def savepoint(self, depth: int) -> None:
        self.calls.append(f"savepoint {depth}")
        await super().savepoint(depth)

    async def commit(self) -> None:
        self.calls.append("commit")
        await super().commit()


class _NativeBackend(NativeMemory):
    """An in-memory backend whose async primitives and hooks record being awaited."""

    calls: list[str]

    @property
    def async_transaction_hooks(self) -> AsyncTransactionHooks:
        return _RecordingHooks(self, self.calls)

    def op_read_session(
        self, session_id: str, names: Sequence[str], records: bool
    ) -> SessionRead | None:
        self.calls.append("op_read_session")
        return super().op_read_session(session_id, names, records)

    async def aop_read_session(
        self, session_id: str, names: Sequence[str], records: bool
    ) -> SessionRead | None:
        self.calls.append("aop_read_session")
        await asyncio.sleep(0)  # a real suspension, as a network round trip would be
        return self.op_read_session(session_id, names, records)

    async def aop_put_session(self, row: Any) -> None:
        self.calls.append("aop_put_session")
        await asyncio.sleep(0)
        self.op_put_session(row)


async def test_a_native_async_backend_is_awaited_on_the_loop() -> None:
    backend = _NativeBackend()
    backend.calls = []
    storage = BackendStorage(backend)
    await storage.aput_session(SessionMeta(id="s1", label="One"))
    assert backend.calls == ["begin", "aop_put_session", "commit"]
    backend.calls.clear()
    async with storage.atransaction():
        assert (await storage.aget_session("s1")) is not None
        await storage.aput_session(SessionMeta(id="s2", label="Two"))
    assert backend.calls == [
        *("begin", "aop_read_session", "op_read_session"),
        *("savepoint 1", "aop_put_session", "commit"),
    ]
    backend.calls.clear()
    assert storage.get_session("s2") is not None  # sync calls use the sync primitives
    assert backend.calls == ["op_read_session"]


def _open(backend: str, tmp_path: Path) -> BackendStorage:
    if backend == "sqlite":
        return SqliteMainStorage(tmp_path / "s.db")
    if backend == "suspending":  # native async primitives that really suspend
        return open_suspending_memory(tmp_path, "default")
    return InMemoryMainStorage()


ASYNC_KINDS = ["sqlite", "memory", "suspending"]


@pytest.mark.parametrize("backend", ASYNC_KINDS)
async def test_waiting_tasks_never_starve_the_owner(tmp_path: Path, backend: str) -> None:
    with _open(backend, tmp_path) as storage:
        await storage.aput_session(SessionMeta(id="s1", label="One"))
        entered = asyncio.Event()

        async def owner() -> None:
            async with storage.atransaction():
                entered.set()
                await asyncio.sleep(0.01)  # every waiter queues meanwhile
                for index in range(5):
                    await storage.aput_global(f"owner{index}", index)

        async def waiter(index: int) -> None:
            await entered.wait()
            await storage.aput_global(f"waiter{index}", index)

        await asyncio.wait_for(asyncio.gather(owner(), *(waiter(i) for i in range(30))), timeout=30)
        assert storage.get_global("owner4") == 4
        assert storage.get_global("waiter29") == 29


@pytest.mark.parametrize("backend", ASYNC_KINDS)
async def test_a_cancelled_worker_write_frees_the_lock(tmp_path: Path, backend: str) -> None:
    with _open(backend, tmp_path) as storage:
        await storage.aput_session(SessionMeta(id="s1", label="One"))
        for attempt in range(20):
            task = asyncio.ensure_future(storage.aput_insight("s1", f"insight {attempt}"))
            await asyncio.sleep(0)
            task.cancel()  # in flight (a write in memory may have finished already)
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # the storage is usable at once, from a thread and from the loop
        await asyncio.wait_for(asyncio.to_thread(storage.put_insight, "s1", "thread"), 10)
        await asyncio.wait_for(storage.aput_insight("s1", "loop"), 10)
        assert storage.get_insight("s1") == "loop"


@pytest.mark.parametrize("backend", ASYNC_KINDS)
async def test_a_transaction_cancelled_in_its_body_rolls_back(tmp_path: Path, backend: str) -> None:
    with _open(backend, tmp_path) as storage:
        await storage.aput_session(SessionMeta(id="s1", label="One"))
        inside = asyncio.Event()

        async def body() -> None:
            async with storage.atransaction():
                await storage.aput_insight("s1", "never")
                inside.set()
                await asyncio.sleep(30)

        task = asyncio.ensure_future(body())
        await inside.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await storage.aget_insight("s1") is None
        await asyncio.wait_for(storage.aput_insight("s1", "kept"), 10)
        assert storage.get_insight("s1") == "kept"


@pytest.mark.parametrize("backend", ASYNC_KINDS)
async def test_a_waiter_cancelled_while_queued_takes_nothing(tmp_path: Path, backend: str) -> None:
    with _open(backend, tmp_path) as storage:
        await storage.aput_session(SessionMeta(id="s1", label="One"))
        release = threading.Event()
        held = threading.Event()

        def hold() -> None:
            with storage.transaction():
                held.set()
                release.wait(10)

        thread = threading.Thread(target=hold)
        thread.start()
        held.wait(10)
        queued = asyncio.ensure_future(storage.aput_insight("s1", "queued"))
        await asyncio.sleep(0.01)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        release.set()
        await asyncio.to_thread(thread.join, 10)
        await asyncio.wait_for(storage.aput_insight("s1", "after"), 10)
        assert storage.get_insight("s1") == "after"


def test_async_calls_after_close_fail_and_reopen_nothing(tmp_path: Path) -> None:
    storage = SqliteMainStorage(tmp_path / "s.db")
    asyncio.run(storage.aput_session(SessionMeta(id="s1", label="One")))
    storage.close()
    with pytest.raises(Exception, match="closed"):
        asyncio.run(storage.aget_session("s1"))


def test_every_method_has_an_async_twin_with_the_same_parameters() -> None:
    import inspect

    methods = {
        name
        for name in dir(BackendStorage)
        if not name.startswith("_") and callable(getattr(BackendStorage, name))
    }
    sync_only = {"close", "transaction", "atransaction"}
    for name in sorted(methods - sync_only):
        if name.startswith("a") and name[1:] in methods:
            continue  # an async twin, checked from its sync method
        twin = getattr(BackendStorage, f"a{name}", None)
        is_async = inspect.iscoroutinefunction(twin) or inspect.isasyncgenfunction(twin)
        assert twin is not None and is_async, name
        ours = inspect.signature(getattr(BackendStorage, name)).parameters
        assert list(inspect.signature(twin).parameters) == list(ours), name
