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
from langgraph.checkpoint.sqlite import SqliteSaver

from stello_graph._ids import session_of_thread
from stello_graph.checkpoints._schema import SESSIONS
from stello_graph.checkpoints._threaded_saver import (
    HELD_CHECKPOINTS,
    AsyncInThreads,
    saved,
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
      `get_tuple`, `list` and `get_delta_channel_history` from the moment it returns, and
      deleted in the same transaction as the saver's next write (or by `flush()` /
      `close()`). A process that ends before either leaves them on disk, as if they had not
      been deleted: a thread of finished runs, which the next run on it starts after.
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

    def _new_lock(self) -> AbstractContextManager[bool]:
        return self.lock  # SqliteSaver's: held by `cursor()` while it writes

    # -- writing ----------------------------------------------------------------------------
    @contextmanager
    def cursor(self, transaction: bool = True) -> Iterator[sqlite3.Cursor]:
        """`SqliteSaver.cursor`; a writing one first deletes the threads deleted since the
        last write, in its own transaction. Every statement of the saver runs in one: a
        failure of SQLite (a full disk, a file gone read-only) is raised as `StorageError`,
        the original its `__cause__`."""
        with self.lock, self._errors():
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

    def _write(
        self, config: RunnableConfig | None, op: Op | None = None, checkpoint_id: str | None = None
    ) -> RunnableConfig | None:
        """Write what is held of `config`'s thread (of every thread, and the deleted threads'
        rows, without one), then `op` (of that thread), in one transaction; nothing of a
        stello turn thread whose session is gone (removed, in the same file, by a transaction
        before this one)."""
        thread = thread_of(config)
        with self.lock:
            if thread is None and not (self._held or self._deleted):
                return None
        with self.cursor() as cur:
            threads = list(self._held) if thread is None else [thread]
            gone = {each for each in threads if _session_gone(cur, each)}
            for each in threads:
                held = self._held.pop(each, None)
                if held is not None and each not in gone:
                    for held_op in held.ops:
                        cur.executemany(*held_op())
                    self._saw(each, held.checkpoints[-1])
            if op is not None and not gone:
                cur.executemany(*op())
            if config is None or thread is None or checkpoint_id is None:
                return None
            self._saw(thread, checkpoint_id)  # under the lock: a delete from now covers it
        return saved(config, checkpoint_id)

    def _put_op(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> Op:
        thread = str(config["configurable"]["thread_id"])
        ns = config["configurable"]["checkpoint_ns"]
        parent = config["configurable"].get("checkpoint_id")
        merged = get_checkpoint_metadata(config, metadata)

        def op() -> tuple[str, Rows]:
            type_, blob = self.serde.dumps_typed(checkpoint)
            meta = json.dumps(merged, ensure_ascii=False).encode("utf-8", "ignore")
            return _PUT, [(thread, ns, checkpoint["id"], parent, type_, blob, meta)]

        return op

    def _writes_op(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> Op:
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

        return op

    def _in_memory_delete(self, thread_id: str) -> bool:
        """What is held of the thread is dropped at once, its rows on disk deleted with the
        next write; rows this saver never saw are deleted now (`False`)."""
        if thread_id not in self._held and thread_id not in self._known:
            return False
        self._held.pop(thread_id, None)
        known = self._known.pop(thread_id, None)
        if known:
            self._deleted[thread_id] = max(known, self._deleted.get(thread_id, ""))
        return True

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
