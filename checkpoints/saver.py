"""LangGraph checkpointers on the same SQLite file as the `SqliteMainStorage`.

`StelloSqliteSaver` is LangGraph's `SqliteSaver` with working async methods (run in worker
threads), so one agent can be driven both from threads and from asyncio on one file, and with
fewer write transactions: `delete_thread` is folded into the next write, and (with
`hold_first_steps`, as the agent's own saver runs) the first steps of a run are written
together, once the run gets past its first model step. `open_sqlite(path)` opens the stello
storage and such a saver on the same database file.

This module imports LangGraph; `stello_graph.checkpoints` loads it only when one of its
names is used.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.base import CheckpointTuple as _CheckpointTuple
from langgraph.checkpoint.sqlite import SqliteSaver

from stello_graph._ids import session_of_thread
from stello_graph.checkpoints._schema import SESSIONS
from stello_graph.checkpoints._threaded_saver import (
    HELD_CHECKPOINTS,
    AsyncInThreads,
    HeldRuns,
    thread_of,
)
from stello_graph.checkpoints.sqlite import SqliteMainStorage
from stello_graph.errors import StorageError

__all__ = ["HELD_CHECKPOINTS", "StelloSqliteSaver", "open_sqlite", "sqlite_saver"]

BUSY_TIMEOUT_MS = 30_000

_PUT = (
    "INSERT OR REPLACE INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, "
    "parent_checkpoint_id, type, checkpoint, metadata) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_WRITES = (
    "INSERT OR {} INTO writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, "
    "idx, channel, type, value) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)

_SESSION = (
    f"SELECT EXISTS (SELECT 1 FROM {SESSIONS} WHERE tree_id = ?1 AND id = ?2),"
    f" EXISTS (SELECT 1 FROM {SESSIONS} WHERE tree_id = ?1)"
)

Rows = list[tuple[Any, ...]]
Op = Callable[[], tuple[str, Rows]]
"""A statement and its rows, made when it is written: what is held and then dropped is never
serialised."""


class StelloSqliteSaver(AsyncInThreads, SqliteSaver):
    """`SqliteSaver` whose async methods work too (each runs the sync one in a thread),
    with fewer write transactions.

    * `delete_thread` writes nothing itself: the thread's checkpoints so far are unknown to
      `get_tuple` and `list` from the moment it returns, and deleted in the same
      transaction as the saver's next write (or by `flush()` / `close()`). A process that
      ends before either leaves them on disk, as if they had not been deleted: a thread of
      finished runs, which the next run on it starts after.
    * With `hold_first_steps`, a run that starts from an input keeps its checkpoints and
      writes up to its first node step (`HELD_CHECKPOINTS`) in memory, and
      writes them in one transaction with the first write that comes after (the results of
      a stello turn's first tool round), or when anything reads the thread, or at
      `flush()` / `close()`; `delete_thread` drops what it holds of the thread unwritten. A
      stello turn without tools then costs the saver no transaction at all; the price is
      that a crash before the run gets past its first model step keeps nothing of the run
      (see BENCHMARKS.md, "What a crash keeps"). Off by default; `StelloAgent` turns it on
      for the saver it makes itself when it prunes and its durability is not `"sync"`.
    * It writes nothing of a stello session's turn thread whose session the file's storage
      no longer has: a turn that runs on while its session is removed (by another process)
      stores none of its text. The check and the write are one `BEGIN IMMEDIATE`
      transaction, and the removal deletes the session's threads in its own.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        *args: Any,
        hold_first_steps: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(conn, *args, **kwargs)
        self.hold_first_steps = hold_first_steps
        """Hold each run's first steps in memory (see the class)."""
        self._held = HeldRuns()
        self._deleted: dict[str, str] = {}  # thread -> greatest checkpoint id deleted
        self._known: dict[str, str] = {}  # thread -> greatest checkpoint id it has on disk

    @property
    def _memory_lock(self) -> AbstractContextManager[bool]:
        return self.lock  # SqliteSaver's: held by `cursor()` while it writes

    # -- writing ----------------------------------------------------------------------------
    @contextmanager
    def cursor(self, transaction: bool = True) -> Iterator[sqlite3.Cursor]:
        """`SqliteSaver.cursor`; a writing one first deletes the threads deleted since the
        last write, in its own transaction. Every statement of the saver runs in one: a
        failure of SQLite (a full disk, a file gone read-only) is raised as `StorageError`,
        the original its `__cause__`."""
        with self.lock, _sqlite_errors(self.conn):
            self.setup()
            cur = self.conn.cursor()
            if transaction and not self.conn.in_transaction:
                cur.execute("BEGIN IMMEDIATE")  # what it reads of the storage stays so
            try:
                if transaction and self._deleted:
                    self._purge(cur)
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

    def _purge(self, cur: sqlite3.Cursor) -> None:
        gone = list(self._deleted.items())
        cur.executemany("DELETE FROM checkpoints WHERE thread_id = ? AND checkpoint_id <= ?", gone)
        cur.executemany("DELETE FROM writes WHERE thread_id = ? AND checkpoint_id <= ?", gone)
        self._deleted.clear()

    def _write(self, threads: Sequence[str], ops: Sequence[Op] = ()) -> None:
        """Write what is held of `threads`, then `ops` (of `threads`' one thread, when
        given), in one transaction; nothing of a stello turn thread whose session is gone
        (removed, in the same file, by a transaction before this one)."""
        with self.cursor() as cur:
            gone = {thread for thread in threads if _session_gone(cur, thread)}
            for thread in threads:
                held = self._held.pop(thread, None)
                if thread in gone:
                    continue
                for op in held.ops if held is not None else ():
                    cur.executemany(*op())
                if held is not None:
                    self._saw(thread, held.checkpoints[-1])
            for op in ops if not gone else ():
                cur.executemany(*op())

    def _saw(self, thread: str, checkpoint_id: str) -> None:
        if checkpoint_id > self._known.get(thread, ""):
            self._known[thread] = checkpoint_id

    def _put_op(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
    ) -> tuple[str, str, str | None, Op]:
        thread = str(config["configurable"]["thread_id"])
        ns = config["configurable"]["checkpoint_ns"]
        parent = config["configurable"].get("checkpoint_id")
        merged = get_checkpoint_metadata(config, metadata)

        def op() -> tuple[str, Rows]:
            type_, blob = self.serde.dumps_typed(checkpoint)
            meta = json.dumps(merged, ensure_ascii=False).encode("utf-8", "ignore")
            return _PUT, [(thread, ns, checkpoint["id"], parent, type_, blob, meta)]

        return thread, ns, parent, op

    def _in_memory_put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig | None:
        op, on = self._put_op(config, checkpoint, metadata)[3], self.hold_first_steps
        return self._held.hold_put(config, checkpoint["id"], metadata, new_versions, op, enabled=on)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        args = (config, checkpoint, metadata, new_versions)
        done = self._in_memory(self._in_memory_put, *args, wait=True)
        if done is not None:
            return done
        thread, ns, _, op = self._put_op(config, checkpoint, metadata)
        self._write([thread], [op])
        with self.lock:
            self._saw(thread, checkpoint["id"])
        return {"configurable": {"thread_id": thread, "checkpoint_ns": ns,
                                 "checkpoint_id": checkpoint["id"]}}  # fmt: skip

    def _writes_op(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> tuple[str, str, Op]:
        thread = str(config["configurable"]["thread_id"])
        ns = str(config["configurable"]["checkpoint_ns"])
        checkpoint_id = str(config["configurable"]["checkpoint_id"])
        verb = "REPLACE" if all(w[0] in WRITES_IDX_MAP for w in writes) else "IGNORE"
        writes = list(writes)

        def op() -> tuple[str, Rows]:
            rows: Rows = [
                (thread, ns, checkpoint_id, task_id, task_path, WRITES_IDX_MAP.get(channel, idx),
                 channel, *self.serde.dumps_typed(value))
                for idx, (channel, value) in enumerate(writes)
            ]  # fmt: skip
            return _WRITES.format(verb), rows

        return thread, checkpoint_id, op

    def _in_memory_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> bool:
        op = self._writes_op(config, writes, task_id, task_path)[2]
        return self._held.hold_writes(config, op)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        if not self._in_memory(
            self._in_memory_writes, config, writes, task_id, task_path, wait=True
        ):
            thread, _, op = self._writes_op(config, writes, task_id, task_path)
            self._write([thread], [op])

    def _unwritten(self, thread_id: str) -> bool:
        return self.hold_first_steps and not self._known.get(thread_id)

    def flush(self) -> None:
        """Write everything held, and delete the deleted threads' rows, now."""
        with self.lock:
            pending = bool(self._held or self._deleted)
        if pending:
            self._write(list(self._held))

    def _flush_read(self, config: RunnableConfig | None) -> None:
        thread = thread_of(config)
        if thread is None:
            self.flush()
        elif thread in self._held:
            self._write([thread])

    # -- reading ----------------------------------------------------------------------------
    def _hidden(self, thread: str, checkpoint_id: str) -> bool:
        bound = self._deleted.get(thread)
        return bound is not None and checkpoint_id <= bound

    def get_tuple(self, config: RunnableConfig) -> _CheckpointTuple | None:
        self._flush_read(config)
        found = super().get_tuple(config)
        thread = thread_of(config)
        if thread is None:
            return found
        if found is None:
            if not config["configurable"].get("checkpoint_id"):
                with self.lock:
                    self._known.setdefault(thread, "")  # nothing on disk: nothing to delete
            return found
        checkpoint_id = str(found.config["configurable"]["checkpoint_id"])
        with self.lock:
            if self._hidden(thread, checkpoint_id):
                return None
            self._saw(thread, checkpoint_id)
        return found

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[_CheckpointTuple]:
        self._flush_read(config)
        for found in super().list(config, filter=filter, before=before, limit=limit):
            thread = thread_of(found.config)
            checkpoint_id = str(found.config["configurable"]["checkpoint_id"])
            if thread is None or not self._hidden(thread, checkpoint_id):
                yield found

    def _in_memory_delete(self, thread_id: str) -> bool:
        thread = str(thread_id)
        if thread not in self._held and thread not in self._known:
            return False  # rows this saver never saw: they are deleted now
        self._held.pop(thread, None)
        known = self._known.pop(thread, None)
        if known:
            self._deleted[thread] = max(known, self._deleted.get(thread, ""))
        return True

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint and write of `thread_id` (see the class): at once what
        is held of it, with the next write what is on disk."""
        thread = str(thread_id)
        if not self._in_memory(self._in_memory_delete, thread, wait=True):
            with self.cursor() as cur:
                cur.execute("DELETE FROM checkpoints WHERE thread_id = ?", (thread,))
                cur.execute("DELETE FROM writes WHERE thread_id = ?", (thread,))

    def close(self) -> None:
        """Write what is held (and delete the deleted threads' rows), close the connection.
        What could not be written is forgotten: closing again does nothing."""
        try:
            self.flush()
        finally:
            self._held.clear()
            self._deleted.clear()
            with _sqlite_errors(self.conn):
                self.conn.close()


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


@contextmanager
def _sqlite_errors(conn: sqlite3.Connection) -> Iterator[None]:
    """A failure of SQLite in the block, raised as `StorageError` (its `__cause__`)."""
    try:
        yield
    except sqlite3.Error as exc:
        where = _file_of(conn)
        raise StorageError(f"LangGraph's checkpointer failed on {where}: {exc}") from exc


def _file_of(conn: sqlite3.Connection) -> str:
    try:
        files = {name: file for _, name, file in conn.execute("PRAGMA database_list")}
    except sqlite3.Error:
        return "its SQLite database"
    return repr(files.get("main") or ":memory:")


def sqlite_saver(
    path: str | os.PathLike[str], *, hold_first_steps: bool = False
) -> StelloSqliteSaver:
    """A `StelloSqliteSaver` on its own connection to `path` (WAL, busy timeout)."""
    conn = sqlite3.connect(os.fspath(path), check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA synchronous=NORMAL")
    return StelloSqliteSaver(conn, hold_first_steps=hold_first_steps)


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
