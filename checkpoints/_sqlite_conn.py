"""The connection of `SqliteMainStorage`: opening it, and its transaction hooks.

`connect` opens a database file (or checks a connection given) for the storage;
`SqliteHooks` are the storage's `TransactionHooks` on it: `BEGIN IMMEDIATE` (retried with
backoff beyond the busy timeout), `COMMIT`, savepoints, and keeping the record cache exact
across connections.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
from collections.abc import Generator, Mapping, Sequence
from pathlib import Path
from typing import Any

from stello_graph.checkpoints._cache import RecordCache
from stello_graph.checkpoints._damage import damaged_error, tolerant_text, undecodable_column
from stello_graph.checkpoints._schema import CHANGES
from stello_graph.errors import DamagedDataError, InvalidInputError, StorageError

__all__ = [
    "SqliteHooks",
    "connect",
    "connect_read_only",
    "failure",
    "quick_check",
    "stream_rows",
]

_BEGIN_RETRIES = 6


class SqliteHooks:
    """`TransactionHooks` over one connection, keeping the record cache exact."""

    def __init__(
        self, conn: sqlite3.Connection, cache: RecordCache, busy_ms: int, tree_id: str
    ) -> None:
        self._conn = conn
        self._cache = cache
        self.busy_ms = busy_ms
        self._tree_id = tree_id
        self._synced = False
        """The cache was synced in this write transaction: no other connection can commit
        until it ends, so the reads inside it need not ask `PRAGMA data_version` again."""

    def begin(self, *, wait: bool) -> bool:
        """`BEGIN IMMEDIATE`, then bring the record cache up to date with what other
        connections committed before it (nobody else can write until it ends)."""
        if not self.begin_immediate(wait=wait):
            return False
        try:
            self.sync()
        except BaseException:
            self.rollback()
            raise
        # Only on a connection that runs no statement of its own accord: one in Python's
        # legacy transaction mode (a connection given with `isolation_level` not None) opens a
        # transaction by itself before a write, after one ended under it.
        self._synced = self._conn.isolation_level is None
        return True

    def begin_immediate(self, *, wait: bool) -> bool:
        """`BEGIN IMMEDIATE`: take the write lock now, so no later statement can hit BUSY.

        Waiting, it retries with backoff beyond the busy timeout; not waiting (a caller on
        the event loop), it returns `False` at once if another connection writes.
        """
        if not wait:
            self._exec("PRAGMA busy_timeout = 0")
            try:
                return self._try_begin()
            finally:
                self._exec(f"PRAGMA busy_timeout = {self.busy_ms}")
        for attempt in range(_BEGIN_RETRIES):
            if self._try_begin():
                return True
            time.sleep(min(2.0, 0.05 * 2**attempt) * (0.5 + random.random()))
        if self._try_begin():
            return True
        raise StorageError(
            f"The database stayed locked by another connection for {_BEGIN_RETRIES + 1} "
            f"busy timeouts of {self.busy_ms} ms."
        )

    def _try_begin(self) -> bool:
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            if isinstance(exc, sqlite3.OperationalError) and _is_busy(exc):
                return False
            raise StorageError(f"Cannot begin a transaction: {exc}") from exc
        return True

    def sync(self) -> None:
        """Drop the cached records if another connection changed this tree's L3 (once per
        write transaction: inside one, nobody else commits)."""
        if self._synced and self._conn.in_transaction:
            return
        if self._cache.enabled:
            self._cache.sync(self._exec("PRAGMA data_version"), self._version)

    def _version(self) -> int:
        """The tree's L3 change counter (see `_schema`)."""
        sql = f"SELECT version FROM {CHANGES} WHERE tree_id = ?"
        return self._exec(sql, (self._tree_id,)) or 0

    def commit(self) -> None:
        # Read before COMMIT, while no other connection can write: the counter then counts
        # exactly the changes the cache holds.
        version = self._version() if self._cache.enabled and self._cache.touched else None
        self._synced = False
        self._exec("COMMIT")
        self._cache.committed(version)

    def rollback(self) -> None:
        self._synced = False
        if self._conn.in_transaction:
            self._exec("ROLLBACK")
        self._cache.forget_touched()
        self._cache.settle()

    def savepoint(self, depth: int) -> None:
        if not self._conn.in_transaction:
            # the transaction ended under it (a trigger's RAISE(ROLLBACK)): this savepoint
            # begins a new one, which others may have committed before
            self._synced = False
        self._exec(f"SAVEPOINT stello_{depth}")

    def release(self, depth: int) -> None:
        self._exec(f"RELEASE stello_{depth}")

    def rollback_to(self, depth: int) -> None:
        if self._conn.in_transaction:  # an error may have ended the whole transaction
            self._exec(f"ROLLBACK TO stello_{depth}")
            self._exec(f"RELEASE stello_{depth}")
        self._cache.forget_touched()

    def _exec(self, sql: str, params: tuple[str, ...] = ()) -> Any:
        """Run `sql`; the first value of its first row (`None`: none)."""
        try:
            row = self._conn.execute(sql, params).fetchone()
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite failed on {sql!r}: {exc}") from exc
        return None if row is None else row[0]


# -- failures, and reads of damaged rows -----------------------------------------------------
_DAMAGED_CODES = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def failure(exc: sqlite3.Error, where: str) -> StorageError:
    """The typed error of a failed statement on the database `where`: a file whose pages do
    not read (`database disk image is malformed`) is `DamagedDataError`."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in _DAMAGED_CODES:
        return _damaged(where, exc)
    return StorageError(f"SQLite failed on {where}: {exc}")


def _damaged(where: str, found: object) -> DamagedDataError:
    return DamagedDataError(
        f"The database {where} is damaged: {found}. Restore it from a backup; SQLite's "
        "`.recover` command (sqlite3 FILE .recover) saves what can still be read."
    )


def stream_rows(
    conn: sqlite3.Connection,
    sql: str,
    params: Sequence[Any] | Mapping[str, Any],
    where: str,
    session_id: str | None = None,
) -> Generator[Any, None, None]:
    """The rows of a statement, one at a time. A text that is not UTF-8 (a damaged row)
    fails a read of `session_id` with `DamagedDataError` naming its column; a whole-tree
    read (no `session_id`) runs the statement again with `tolerant_text`, the rows already
    handed over skipped, so that one damaged row never makes the rest of the tree
    unreadable (the builders of `_rows` mark it). Close the iterator when done with it early.
    """
    done = 0
    try:
        for row in conn.execute(sql, params):
            yield row
            done += 1
        return
    except sqlite3.Error as exc:
        column = undecodable_column(exc)
        if column is None:
            raise failure(exc, where) from exc
        if session_id is not None:
            raise damaged_error(session_id, column, exc) from exc
    conn.text_factory = tolerant_text
    try:
        for index, row in enumerate(conn.execute(sql, params)):
            if index >= done:
                yield row
    except sqlite3.Error as exc:
        raise failure(exc, where) from exc
    finally:
        conn.text_factory = str


def quick_check(conn: sqlite3.Connection, where: str) -> None:
    """SQLite's `PRAGMA quick_check` of the database (every page read once: a second or so
    per gigabyte).

    Raises:
        DamagedDataError: it found damage (its first findings are in the message).
    """
    try:
        found = [str(row[0]) for row in conn.execute("PRAGMA quick_check(5)")]
    except sqlite3.DatabaseError as exc:
        found = [str(exc)]
    if found != ["ok"]:
        lines = [line for text in found for line in text.splitlines() if "***" not in line]
        raise _damaged(where, f"PRAGMA quick_check found: {'; '.join(lines[:5])}")


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc) or "busy" in str(exc)


def connect(
    target: str | os.PathLike[str] | sqlite3.Connection,
) -> tuple[sqlite3.Connection, bool, str]:
    """`(connection, whether we own it, path)`; the path is `":memory:"` for memory."""
    if isinstance(target, sqlite3.Connection):
        # Python 3.12 `autocommit=` connections manage transactions themselves.
        legacy = getattr(sqlite3, "LEGACY_TRANSACTION_CONTROL", -1)
        if getattr(target, "autocommit", legacy) != legacy:
            raise InvalidInputError(
                "Open the connection without `autocommit=`: the storage manages transactions."
            )
        try:
            files = {name: file for _, name, file in target.execute("PRAGMA database_list")}
        except sqlite3.Error as exc:
            raise InvalidInputError(f"The connection given cannot be used: {exc}") from exc
        return target, False, files.get("main") or ":memory:"
    if not isinstance(target, (str, os.PathLike)):
        raise InvalidInputError(
            "path_or_connection must be a path, ':memory:' or a sqlite3.Connection, "
            f"got {type(target).__name__}."
        )
    path = os.fsdecode(os.fspath(target))
    try:
        conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    except sqlite3.Error as exc:
        raise StorageError(f"Cannot open the database {path!r}: {exc}") from exc
    return conn, True, path


_SIDE_FILES = ("-wal", "-shm")


class _ReadOnly(sqlite3.Connection):
    """A read-only connection that, closed, removes the WAL side files its opening made."""

    tidy: Path | None = None
    """The database file, when it had no side files before this connection opened it."""

    def close(self) -> None:
        super().close()
        path, self.tidy = self.tidy, None
        if path is None or not _has_side_files(path):
            return
        # A read-only connection leaves the -wal and -shm it made (only the last close of a
        # connection that may write removes them): one such connection opens and closes.
        # With another connection on the file, they stay, as they must.
        try:
            tidy = sqlite3.connect(f"{path.as_uri()}?mode=rw", uri=True, timeout=0.1)
        except sqlite3.Error:
            return
        try:
            tidy.execute("PRAGMA schema_version").fetchone()
        except sqlite3.Error:
            pass
        finally:
            tidy.close()


def _has_side_files(path: Path) -> bool:
    return any(os.path.exists(f"{path}{side}") for side in _SIDE_FILES)


def connect_read_only(path: str | os.PathLike[str], *, timeout: float = 5.0) -> sqlite3.Connection:
    """A connection that reads the database at `path` and never changes it: opening a WAL
    database read-only makes its `-wal` and `-shm` side files, and closing the connection
    removes them again when the file had none (and nobody else has it open).

    Raises:
        sqlite3.Error: the file cannot be opened read-only.
    """
    resolved = Path(path).resolve()
    had_side_files = _has_side_files(resolved)
    conn = sqlite3.connect(
        f"{resolved.as_uri()}?mode=ro", uri=True, timeout=timeout, factory=_ReadOnly
    )
    if not had_side_files:
        conn.tidy = resolved
    return conn
