"""LangGraph checkpointers on the same SQLite file as the `SqliteMainStorage`.

`StelloSqliteSaver` is LangGraph's `SqliteSaver` with working async methods (run in worker
threads), so one agent can be driven both from threads and from asyncio on one file.
`open_sqlite(path)` opens the stello storage and such a saver on the same database file.

This module imports LangGraph; `stello_graph.checkpoints` loads it only when one of its
names is used.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import ChannelVersions, Checkpoint, CheckpointMetadata
from langgraph.checkpoint.sqlite import SqliteSaver

from stello_graph._ids import session_of_thread
from stello_graph.checkpoints._schema import SESSIONS
from stello_graph.checkpoints._threaded_saver import AsyncInThreads
from stello_graph.checkpoints.sqlite import SqliteMainStorage
from stello_graph.errors import StorageError

__all__ = ["StelloSqliteSaver", "open_sqlite", "sqlite_saver"]

_SESSION = (
    f"SELECT EXISTS (SELECT 1 FROM {SESSIONS} WHERE tree_id = ?1 AND id = ?2),"
    f" EXISTS (SELECT 1 FROM {SESSIONS} WHERE tree_id = ?1)"
)

_WRITING: ContextVar[str | None] = ContextVar("stello_saver_writing", default=None)
"""The thread whose checkpoint or writes the saver is writing (in this context)."""


class _Gone(Exception):
    """The thread being written is a stello session's whose session was removed."""


class StelloSqliteSaver(AsyncInThreads, SqliteSaver):
    """`SqliteSaver` whose async methods work too (each runs the sync one in a thread), whose
    failures are `StorageError`, and which writes nothing of a stello session's turn thread
    whose session the file's storage no longer has: a turn that runs on while its session is
    removed (by another process) stores none of its text. The check and the write are one
    `BEGIN IMMEDIATE` transaction, and the removal deletes the session's threads in its own.
    """

    @contextmanager
    def cursor(self, transaction: bool = True) -> Iterator[sqlite3.Cursor]:
        """`SqliteSaver.cursor`; a writing one is a `BEGIN IMMEDIATE` transaction (what it
        reads of the storage stays so) that writes nothing of a removed session's thread
        (`_Gone`). A failure of SQLite (a full disk, a file gone read-only) is raised as
        `StorageError`, the original its `__cause__`."""
        with self.lock, self._errors():
            self.setup()
            cur = self.conn.cursor()
            if transaction and not self.conn.in_transaction:
                cur.execute("BEGIN IMMEDIATE")
            try:
                thread = _WRITING.get()
                if transaction and thread is not None and _session_gone(cur, thread):
                    raise _Gone
                yield cur
            except BaseException:
                if transaction:  # nothing of a write that failed half-way
                    self.conn.rollback()
                raise
            else:
                if transaction:
                    self.conn.commit()
            finally:
                cur.close()

    @contextmanager
    def _writing(self, config: RunnableConfig) -> Iterator[None]:
        reset = _WRITING.set(str(config["configurable"]["thread_id"]))  # as SqliteSaver reads it
        try:
            yield
        finally:
            _WRITING.reset(reset)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        try:
            with self._writing(config):
                return super().put(config, checkpoint, metadata, new_versions)
        except _Gone:
            conf = config["configurable"]
            return {"configurable": {"thread_id": str(conf["thread_id"]),
                                     "checkpoint_ns": conf["checkpoint_ns"],
                                     "checkpoint_id": checkpoint["id"]}}  # fmt: skip

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        with suppress(_Gone), self._writing(config):
            super().put_writes(config, writes, task_id, task_path)

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """A failure of SQLite in the block, raised as `StorageError` (its `__cause__`)."""
        try:
            yield
        except sqlite3.Error as exc:
            where = _file_of(self.conn)
            raise StorageError(f"LangGraph's checkpointer failed on {where}: {exc}") from exc


def _session_gone(cur: sqlite3.Cursor, thread: str) -> bool:
    """Whether `thread` is a stello session's turn thread, of a tree stored on this file
    which has no such session (any other thread, or a tree stored elsewhere, is written)."""
    session = session_of_thread(thread)
    if session is None:
        return False
    try:
        found, tree = cur.execute(_SESSION, session).fetchone()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):  # no storage on this file
            return False
        raise
    return bool(tree and not found)


def _file_of(conn: sqlite3.Connection) -> str:
    try:
        files = {name: file for _, name, file in conn.execute("PRAGMA database_list")}
    except sqlite3.Error:
        return "its SQLite database"
    return repr(files.get("main") or ":memory:")


def sqlite_saver(path: str | os.PathLike[str]) -> StelloSqliteSaver:
    """A `StelloSqliteSaver` on its own connection to `path` (WAL, busy timeout)."""
    conn = sqlite3.connect(os.fspath(path), timeout=30.0, check_same_thread=False)
    conn.execute("PRAGMA synchronous=NORMAL")
    return StelloSqliteSaver(conn)


def open_sqlite(
    path: str | os.PathLike[str], *, tree_id: str = "default", allow_foreign_tables: bool = False
) -> tuple[SqliteMainStorage, StelloSqliteSaver]:
    """Open the stello storage and a LangGraph checkpointer on the same SQLite file
    (`allow_foreign_tables` as `SqliteMainStorage` takes it).

    Example:
        >>> storage, saver = open_sqlite("app.db")  # doctest: +SKIP
        >>> agent = StelloAgent(model=model, storage=storage, checkpointer=saver)  # doctest: +SKIP
    """
    storage = SqliteMainStorage(path, tree_id=tree_id, allow_foreign_tables=allow_foreign_tables)
    return storage, sqlite_saver(path)
