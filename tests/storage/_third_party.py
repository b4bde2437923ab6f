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
)


def open_composed_sqlite(tmp_path: Path, tree_id: str) -> BackendStorage:
    backend = SqliteMainStorage(tmp_path / "third-party.db", tree_id=tree_id)
    return BackendStorage(backend, tree_id=tree_id)


class _SuspendingHooks:
    def __init__(self, hooks: AsyncTransactionHooks) -> None:
        self._hooks = hooks

    def __getattr__(self, name: str) -> Any:
        inner = getattr(self._hooks, name)

        async def suspending(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(0)
            return await inner(*args, **kwargs)

        return suspending


class _SuspendingMemory(InMemoryMainStorage):
    """Every `aop_*` yields to the loop before running."""

    @property
    def async_transaction_hooks(self) -> AsyncTransactionHooks:
        hooks: AsyncTransactionHooks = _SuspendingHooks(super().async_transaction_hooks)
        return hooks

    def __getattribute__(self, name: str) -> Any:
        found = super().__getattribute__(name)
        if not name.startswith("aop_"):
            return found

        async def suspending(*args: Any) -> Any:
            await asyncio.sleep(0)
            return await found(*args)

        return suspending


def open_suspending_memory(tmp_path: Path, tree_id: str) -> BackendStorage:
    return BackendStorage(_SuspendingMemory(tree_id=tree_id), tree_id=tree_id)
