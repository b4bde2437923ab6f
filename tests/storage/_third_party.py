"""Storages to hold to the suites through `STELLO_TEST_STORAGE` (see `tests/conftest.py`).

* `open_composed_sqlite` - `BackendStorage` over a SQLite backend object: sync primitives
  only, so every async method runs in the storage's worker thread.
* `open_suspending_memory` - `BackendStorage` over an in-memory backend whose async
  primitives and hooks really suspend (as a network round trip would), so the native
  async path runs with other tasks interleaved at every primitive.

    STELLO_TEST_STORAGE=tests.storage._third_party:open_suspending_memory pytest tests/storage
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from stello_graph.checkpoints import (
    AsyncTransactionHooks,
    BackendStorage,
    InMemoryMainStorage,
    SqliteMainStorage,
    StorageBackend,
)


class RequiredOnly:
    """A backend with the protocol's required primitives only, as a minimal third-party one
    has (no optional read such as `op_topology_text`): those of another backend."""

    _NAMES = frozenset(
        {name for name in vars(StorageBackend) if name.startswith("op_")}
        | {"transaction_hooks", "close"}
    )

    def __init__(self, backend: StorageBackend) -> None:
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        if name not in self._NAMES:
            raise AttributeError(name)
        return getattr(self._backend, name)


def open_composed_sqlite(tmp_path: Path, tree_id: str) -> BackendStorage:
    backend = SqliteMainStorage(tmp_path / "third-party.db", tree_id=tree_id)
    return BackendStorage(backend, tree_id=tree_id)


class InlineHooks:
    """`AsyncTransactionHooks` that run a backend's sync hooks inline."""

    def __init__(self, hooks: Any) -> None:
        self._hooks = hooks

    async def begin(self, *, wait: bool) -> bool:
        return bool(self._hooks.begin(wait=wait))

    async def commit(self) -> None:
        self._hooks.commit()

    async def rollback(self) -> None:
        self._hooks.rollback()

    async def savepoint(self, depth: int) -> None:
        self._hooks.savepoint(depth)

    async def release(self, depth: int) -> None:
        self._hooks.release(depth)

    async def rollback_to(self, depth: int) -> None:
        self._hooks.rollback_to(depth)


class NativeMemory(InMemoryMainStorage):
    """An in-memory backend used as a native async one: each `aop_NAME` runs `op_NAME` on the
    event loop (after yielding to it when `suspend`, as a network round trip would)."""

    suspend = False

    @property
    def async_transaction_hooks(self) -> AsyncTransactionHooks:
        hooks: AsyncTransactionHooks = InlineHooks(self.transaction_hooks)
        return hooks

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("aop_"):
            raise AttributeError(name)
        sync = getattr(self, "op_" + name[4:])

        async def primitive(*args: Any) -> Any:
            if self.suspend:
                await asyncio.sleep(0)
            return sync(*args)

        return primitive


class _SuspendingHooks:
    def __init__(self, hooks: AsyncTransactionHooks) -> None:
        self._hooks = hooks

    def __getattr__(self, name: str) -> Any:
        inner = getattr(self._hooks, name)

        async def suspending(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(0)
            return await inner(*args, **kwargs)

        return suspending


class _SuspendingMemory(NativeMemory):
    """Every `aop_*` and hook yields to the loop before running."""

    suspend = True

    @property
    def async_transaction_hooks(self) -> AsyncTransactionHooks:
        hooks: AsyncTransactionHooks = _SuspendingHooks(super().async_transaction_hooks)
        return hooks


def open_suspending_memory(tmp_path: Path, tree_id: str) -> BackendStorage:
    return BackendStorage(_SuspendingMemory(tree_id=tree_id), tree_id=tree_id)
