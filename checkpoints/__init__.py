"""Storage implementations of stello-graph (import as `stello_graph.checkpoints`).

* `SqliteMainStorage` - the reference `MainStorage`, in a SQLite file shared safely by
  threads, asyncio tasks and processes.
* `InMemoryMainStorage` - the same storage on a private SQLite `:memory:` database, for tests.
* `StorageBackend` / `BackendStorage` - for a storage of your own: implement the eighteen
  primitives of the backend protocol (and any of `OptionalPrimitives`, for speed), and
  `BackendStorage(backend)` is a full `MainStorage` (see `stello_graph.checkpoints.backend`);
  `AsyncStorageBackend` / `AsyncTransactionHooks` for a backend with native async I/O, whose
  async primitives the async methods await.
* `open_sqlite(path)` - the storage and a LangGraph checkpointer (`StelloSqliteSaver`) on the
  same SQLite file. These names load LangGraph, so they are imported on first use.
* `PostgresMainStorage` - the same storage on PostgreSQL, for many worker processes, and
  `open_postgres(conninfo)` - it and a LangGraph `PostgresSaver` (`StelloPostgresSaver`) on the
  same database. They need the `postgres` extra (psycopg) and are imported on first use.

Every name here is imported on first use, so a module of the package loads only what it
needs: `stello-graph tree` and `export` read a SQLite file without pydantic or LangChain
(`checkpoints._sqlite_rows`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stello_graph.checkpoints._postgres_saver import StelloPostgresSaver
    from stello_graph.checkpoints.backend import (
        AsyncStorageBackend,
        AsyncTransactionHooks,
        BackendStorage,
        OptionalPrimitives,
        StorageBackend,
        TransactionHooks,
    )
    from stello_graph.checkpoints.postgres import PostgresMainStorage, open_postgres
    from stello_graph.checkpoints.saver import StelloSqliteSaver, open_sqlite, sqlite_saver
    from stello_graph.checkpoints.sqlite import InMemoryMainStorage, SqliteMainStorage

_LAZY = {
    **dict.fromkeys(
        (
            "AsyncStorageBackend",
            "AsyncTransactionHooks",
            "BackendStorage",
            "OptionalPrimitives",
            "StorageBackend",
            "TransactionHooks",
        ),
        "stello_graph.checkpoints.backend",
    ),
    "InMemoryMainStorage": "stello_graph.checkpoints.sqlite",
    "SqliteMainStorage": "stello_graph.checkpoints.sqlite",
    "PostgresMainStorage": "stello_graph.checkpoints.postgres",
    "StelloPostgresSaver": "stello_graph.checkpoints._postgres_saver",
    "open_postgres": "stello_graph.checkpoints.postgres",
    "StelloSqliteSaver": "stello_graph.checkpoints.saver",
    "open_sqlite": "stello_graph.checkpoints.saver",
    "sqlite_saver": "stello_graph.checkpoints.saver",
}

__all__ = [
    # storages
    "InMemoryMainStorage",
    "SqliteMainStorage",
    "PostgresMainStorage",
    # writing a storage of your own
    "BackendStorage",
    "StorageBackend",
    "OptionalPrimitives",
    "TransactionHooks",
    "AsyncStorageBackend",
    "AsyncTransactionHooks",
    # LangGraph checkpointers on the same file
    "StelloSqliteSaver",
    "open_sqlite",
    "sqlite_saver",
    "StelloPostgresSaver",
    "open_postgres",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        try:  # a submodule (`checkpoints.sqlite`, ...), as once imported with the package
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
        raise AttributeError(f"module 'stello_graph.checkpoints' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
