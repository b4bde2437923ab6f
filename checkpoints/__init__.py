"""Storage implementations of stello-graph (import as `stello_graph.checkpoints`).

* `SqliteMainStorage` - the reference `MainStorage`, in a SQLite file shared safely by
  threads, asyncio tasks and processes.
* `InMemoryMainStorage` - the same storage on a private SQLite `:memory:` database, for tests.
* `StorageBackend` / `BackendStorage` - for a storage of your own: implement the twenty
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
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # What type checkers and IDEs read: `X as X` re-exports each name, as `__all__` (built from
    # `_LAZY` at run time) cannot tell them.
    from stello_graph.checkpoints._postgres_saver import StelloPostgresSaver as StelloPostgresSaver
    from stello_graph.checkpoints.backend import AsyncStorageBackend as AsyncStorageBackend
    from stello_graph.checkpoints.backend import AsyncTransactionHooks as AsyncTransactionHooks
    from stello_graph.checkpoints.backend import BackendStorage as BackendStorage
    from stello_graph.checkpoints.backend import OptionalPrimitives as OptionalPrimitives
    from stello_graph.checkpoints.backend import StorageBackend as StorageBackend
    from stello_graph.checkpoints.backend import TransactionHooks as TransactionHooks
    from stello_graph.checkpoints.postgres import PostgresMainStorage as PostgresMainStorage
    from stello_graph.checkpoints.postgres import open_postgres as open_postgres
    from stello_graph.checkpoints.saver import StelloSqliteSaver as StelloSqliteSaver
    from stello_graph.checkpoints.saver import open_sqlite as open_sqlite
    from stello_graph.checkpoints.saver import sqlite_saver as sqlite_saver
    from stello_graph.checkpoints.sqlite import InMemoryMainStorage as InMemoryMainStorage
    from stello_graph.checkpoints.sqlite import SqliteMainStorage as SqliteMainStorage

_LAZY = {
    # storages
    **dict.fromkeys(
        ("InMemoryMainStorage", "SqliteMainStorage"), "stello_graph.checkpoints.sqlite"
    ),
    "PostgresMainStorage": "stello_graph.checkpoints.postgres",
    # writing a storage of your own
    **dict.fromkeys(
        (
            "BackendStorage",
            "StorageBackend",
            "OptionalPrimitives",
            "TransactionHooks",
            "AsyncStorageBackend",
            "AsyncTransactionHooks",
        ),
        "stello_graph.checkpoints.backend",
    ),
    # LangGraph checkpointers on the same file
    **dict.fromkeys(
        ("StelloSqliteSaver", "open_sqlite", "sqlite_saver"), "stello_graph.checkpoints.saver"
    ),
    "StelloPostgresSaver": "stello_graph.checkpoints._postgres_saver",
    "open_postgres": "stello_graph.checkpoints.postgres",
}
__all__ = list(_LAZY)  # and `is_postgres_dsn`, a helper of the library's own openers

_CONNINFO = re.compile(r"\s*(host|hostaddr|port|dbname|user|password|service)\s*=")
"""How a libpq `key=value` connection string begins (a file path never does in practice)."""


def is_postgres_dsn(where: str) -> bool:
    """Whether `where` names a PostgreSQL database, a `postgresql://` URL or a libpq
    `key=value` connection string (`"host=db dbname=app"`), rather than a SQLite file: how
    `StelloAgent(storage=...)`, the server and the command line choose between the two."""
    return where.startswith(("postgresql://", "postgres://")) or bool(_CONNINFO.match(where))


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
