"""`SqliteMainStorage`: the reference `MainStorage`, one SQLite file (or connection).

One connection per storage, guarded by one lock (see `_txn`): a storage can be shared by
threads and asyncio tasks; several storages (or processes) can share one file. The file is
opened in WAL mode with `synchronous=NORMAL`; writers wait for each other through SQLite's
busy timeout and, beyond it, a few retries of `BEGIN IMMEDIATE` (`_sqlite_conn`).

SQLite has no async API: the async methods run their statements in the storage's own worker
thread (one per storage, so the connection is used by one thread at a time), never on the
event loop.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import stello_graph.checkpoints._schema as _schema
from stello_graph.checkpoints._cache import RecordCache
from stello_graph.checkpoints._damage import META
from stello_graph.checkpoints._flows import QUEUE, choose_lease, release_changes
from stello_graph.checkpoints._primitives import one
from stello_graph.checkpoints._rows import (
    ALL_NODES,
    CHILDREN,
    EVENTS_AFTER,
    GET_GLOBAL,
    GET_NODE,
    PUT_GLOBAL,
    PUT_NODE,
    built,
    listed_sessions,
    stored_meta,
    stored_node,
)
from stello_graph.checkpoints._schema import (
    EVENTS,
    LANGGRAPH_TABLES,
    NODES,
    ROWS,
    SESSIONS,
)
from stello_graph.checkpoints._serde import (
    REMOVED_PAYLOAD,
    EncodedMessage,
    EventRow,
    MetaRow,
    RecordTurn,
    SessionRead,
    decode_message,
    decode_records,
    read_turns,
    run_heads,
    session_threads,
    split_read,
)
from stello_graph.checkpoints._shared_l3 import (
    Lookup,
    SharedPrefixes,
    T,
    drive_sqlite,
    sqlite_marks,
)
from stello_graph.checkpoints._shell import FIELDS, BackendStorage
from stello_graph.checkpoints._sqlite_conn import (
    SqliteHooks,
    connect,
    failure,
    quick_check,
    stream_rows,
)
from stello_graph.checkpoints._sqlite_tree import SqliteTreeReads
from stello_graph.checkpoints._validate import CommitArgs, check_non_negative, check_tree_id
from stello_graph.checkpoints.backend import TransactionHooks
from stello_graph.errors import (
    InvalidInputError,
    LeaseLostError,
    NotADatabaseError,
    SessionArchivedError,
    SessionNotFoundError,
    StorageError,
)
from stello_graph.models import (
    Lease,
    SessionMeta,
    SessionRole,
    SessionStatus,
    TopologyNode,
)

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage


__all__ = ["InMemoryMainStorage", "SqliteMainStorage"]

_COMMIT = ("insight", "turn_count", "lease_owner", "lease_token")
"""What a turn's commit reads of its session before it writes."""

_CHECKPOINT_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN (?, ?)"
_COUNTED = f"s.base_count + (SELECT COUNT(*) FROM {ROWS} r WHERE r.l3_key = s.l3_key)"
"""A session's record count (the records it inherits and its own rows) in a statement on `s`."""


class SqliteMainStorage(SqliteTreeReads, BackendStorage):
    """A `MainStorage` in a SQLite database, bound to one tree.

    Args:
        path_or_connection: a file path (created if missing), `":memory:"`, or an open
            `sqlite3.Connection`. A connection given is used as is (opened with
            `check_same_thread=False` if threads or async methods will use the storage: the
            async ones run in the storage's worker thread; rows as tuples) and is not closed
            by `close()`; it must not be used by anyone else.
        tree_id: the tree this storage reads and writes; other trees in the same file stay
            invisible.
        busy_timeout: seconds a write waits for another connection's transaction.
        record_cache_size: how many sessions' decoded records to keep (0 disables).
        allow_foreign_tables: add stello's tables to a database that has none yet but holds
            other tables (another application's). Refused by default, so that a mistyped
            path never writes into someone else's database; a LangGraph checkpointer's
            tables (`checkpoints`, `writes`) do not count as foreign.

    Raises:
        NotADatabaseError: the file is not a SQLite database.
        ForeignDatabaseError: the database holds other tables and no stello data, and
            `allow_foreign_tables` is false (it is left untouched).
        SchemaVersionError: the database was written by a newer stello-graph (it is left
            untouched).

    Example:
        >>> from stello_graph.models import SessionMeta
        >>> with SqliteMainStorage(":memory:", tree_id="alice") as storage:
        ...     storage.put_session(SessionMeta(id="s1", label="Ideas"))
        ...     storage.count_records("s1")
        0
    """

    def __init__(
        self,
        path_or_connection: str | os.PathLike[str] | sqlite3.Connection,
        *,
        tree_id: str = "default",
        busy_timeout: float = 30.0,
        record_cache_size: int = 256,
        allow_foreign_tables: bool = False,
    ) -> None:
        check_tree_id(tree_id)  # before a connection is opened, not after
        if isinstance(busy_timeout, bool) or not isinstance(busy_timeout, (int, float)):
            raise InvalidInputError(f"busy_timeout must be a number, got {busy_timeout!r}.")
        self._cache = RecordCache(check_non_negative(record_cache_size, "record_cache_size"))
        self._conn, self._owns_conn, self.path = connect(path_or_connection)
        self.realpath = "" if self.path in ("", ":memory:") else os.path.realpath(self.path)
        """The database file's resolved path (`""` in memory): two storages of one file
        have the same."""
        busy_ms = max(0, int(busy_timeout * 1000))
        self._hooks = SqliteHooks(self._conn, self._cache, busy_ms, tree_id)
        self._shared = SharedPrefixes(tree_id)
        super().__init__(self, tree_id=tree_id)  # its own `StorageBackend`
        self._closed = False
        try:
            self._open(allow_foreign_tables=bool(allow_foreign_tables))
        except BaseException:
            self._release_connection()
            raise

    def _open(self, *, allow_foreign_tables: bool) -> None:
        conn, where = self._conn, repr(self.path)
        if conn.in_transaction:
            raise InvalidInputError("The connection given has an open transaction.")
        try:
            conn.execute(f"PRAGMA busy_timeout = {self._hooks.busy_ms}")
            conn.execute("PRAGMA foreign_keys = ON")
            version = _schema.read_version(conn)
            # Refuse a newer schema before anything (journal mode included) changes the file.
            _schema.check_version(version, where)
            if not allow_foreign_tables:
                _schema.check_not_foreign(conn, version, where)
            if self.path not in ("", ":memory:"):
                conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            _schema.migrate(conn, where, begin=lambda: self._hooks.begin_immediate(wait=True))
        except sqlite3.Error as exc:
            if isinstance(exc, sqlite3.DatabaseError) and "not a database" in str(exc):
                raise NotADatabaseError(f"{where} is not a SQLite database ({exc}).") from exc
            raise StorageError(f"Cannot open the database {where}: {exc}") from exc

    def check(self) -> None:
        """Read every page of the database once (SQLite's `PRAGMA quick_check`: about a
        second per gigabyte), as `stello-graph tree` and `export` do before reading a file.

        Raises:
            DamagedDataError: the file is damaged (the message says what was found).
        """
        self._txn.read(one(SqliteMainStorage.op_quick_check))

    def op_quick_check(self) -> None:
        quick_check(self._conn, repr(self.path))

    def close(self) -> None:
        """Close the connection (when the storage opened it); waits for a running transaction."""
        if not self._closed:
            self._txn.close(self._release_connection)

    def _release_connection(self) -> None:
        self._closed = True
        self._cache.clear()
        if self._owns_conn:
            self._conn.close()

    @property
    def transaction_hooks(self) -> TransactionHooks:
        """`BEGIN IMMEDIATE` / `COMMIT` / savepoints on the storage's connection."""
        return self._hooks

    def __repr__(self) -> str:
        return f"SqliteMainStorage({self.path!r}, tree_id={self.tree_id!r})"

    # -- SQL helpers ----------------------------------------------------------------------
    def _q(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> sqlite3.Cursor:
        try:
            return self._conn.execute(sql, params)
        except sqlite3.Error as exc:
            raise failure(exc, repr(self.path)) from exc

    def _fetch(
        self,
        sql: str,
        params: Sequence[Any] | Mapping[str, Any] = (),
        session_id: str | None = None,
    ) -> list[Any]:
        """The rows of a read of `session_id` (its damaged row: `DamagedDataError`), or of a
        whole-tree read (no `session_id`: damaged rows come back to be marked, see
        `stream_rows`). A statement that reads only numbers may use `_q` itself."""
        return list(stream_rows(self._conn, sql, params, repr(self.path), session_id))

    def _one(self, sql: str, params: Sequence[Any], session_id: str) -> Any:
        """The first row of a read of `session_id` (see `_fetch`), or `None`."""
        rows = self._fetch(sql, params, session_id)
        return rows[0] if rows else None

    def _qmany(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        try:
            self._conn.executemany(sql, rows)
        except sqlite3.Error as exc:
            raise failure(exc, repr(self.path)) from exc

    def _run(self, steps: Lookup[T], session_id: str | None = None) -> T:
        """Run shared-prefix statements (`_shared_l3`) on the connection: for a read of
        `session_id`, or of the whole tree (see `_fetch`)."""
        return drive_sqlite(steps, lambda sql, params: self._fetch(sql, params, session_id))

    # -- sessions -------------------------------------------------------------------------
    def op_put_session(self, row: MetaRow) -> None:
        tree = self.tree_id
        self._q(
            f"""INSERT INTO {SESSIONS} (tree_id, {META}, created_seq, l3_key)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?,
                (SELECT COALESCE(MAX(created_seq), 0) + 1 FROM {SESSIONS} WHERE tree_id = ?),
                (SELECT COALESCE(MAX(l3_key), 0) + 1 FROM {SESSIONS}))
            ON CONFLICT (tree_id, id) DO UPDATE SET
                label = excluded.label, role = excluded.role, status = excluded.status,
                tags = excluded.tags, metadata = excluded.metadata,
                created_at = excluded.created_at, updated_at = excluded.updated_at,
                l3_key = COALESCE(l3_key, excluded.l3_key)""",
            (tree, *row, tree),
        )
        sql = f"UPDATE {NODES} SET label = ? WHERE tree_id = ? AND id = ?"
        self._q(sql, (row[1], tree, row[0]))

    def op_list_sessions(
        self, status: SessionStatus | None, role: SessionRole | None
    ) -> list[SessionMeta]:
        sql, params = listed_sessions(self.tree_id, status, role)
        return built(stored_meta, self._fetch(sqlite_marks(sql), params))

    def op_read_session(
        self, session_id: str, names: Sequence[str], records: bool
    ) -> SessionRead | None:
        assert FIELDS.issuperset(names)
        columns = "".join(f", {name}" for name in names)
        sql = f"SELECT {META}{columns} FROM {SESSIONS} WHERE tree_id = ? AND id = ?"
        row = self._one(sql, (self.tree_id, session_id), session_id)
        if row is None:
            return None
        return *split_read(row), self.op_records(session_id) if records else ()

    def op_set_fields(self, session_id: str, values: dict[str, Any]) -> None:
        assert FIELDS.issuperset(values)
        columns = ", ".join(f"{name} = ?" for name in values)
        sql = f"UPDATE {SESSIONS} SET {columns} WHERE tree_id = ? AND id = ?"
        if self._q(sql, (*values.values(), self.tree_id, session_id)).rowcount == 0:
            raise SessionNotFoundError(session_id)

    # -- a turn's lease and commit, each atomic by itself ----------------------------------
    @contextmanager
    def _alone(self) -> Iterator[None]:
        """The transaction of an operation atomic by itself: the caller's when one is open
        (the shell set a savepoint), else one of its own."""
        if self._conn.in_transaction:
            yield
            return
        self._hooks.begin(wait=True)
        try:
            yield
            self._hooks.commit()
        except BaseException:
            self._hooks.rollback()
            raise

    def op_lease(
        self,
        session_id: str,
        owner: str,
        ttl: float,
        replace: str | None,
        refuse: str | None,
        read: Sequence[str] | None,
    ) -> tuple[Lease, SessionRead | None] | None:
        names = (*(read or ()), *QUEUE)
        with self._alone():
            found = self.op_read_session(session_id, names, read is not None)
            if found is None:
                raise SessionNotFoundError(session_id)
            meta, values, records = found
            if refuse is not None and meta.status == "archived":
                raise SessionArchivedError(session_id, refuse)
            split = len(names) - len(QUEUE)
            lease, changes = choose_lease(
                session_id, owner, ttl, replace, values[split:], time.time()
            )
            if changes:
                self.op_set_fields(session_id, changes)
        if lease is None:
            return None
        return lease, None if read is None else (meta, values[:split], records)

    def op_release_lease(self, lease: Lease) -> bool:
        with self._alone():
            found = self.op_read_session(lease.session_id, QUEUE, False)
            if found is None:
                return False  # the session is gone with its lease
            held, changes = release_changes(lease, found[1])
            if changes:
                self.op_set_fields(lease.session_id, changes)
            return held

    def op_commit_turn(self, args: CommitArgs, release: bool) -> int:
        session_id, records, at, user_turn, turns, insight, lease = args
        with self._alone():
            found = self.op_read_session(session_id, _COMMIT, False)
            if found is None:
                raise SessionNotFoundError(session_id)
            meta, (current, turn_count, owner, token), _ = found
            if lease is not None and (owner != lease.owner or token != lease.token):
                raise LeaseLostError(session_id)
            if meta.status == "archived":
                raise SessionArchivedError(session_id, "a turn's records")
            self.op_append(session_id, records, at, user_turn, turns, counted=False)
            values: dict[str, Any] = {}
            if insight is not None and current == insight:
                values["insight"] = None
            if release and lease is not None:
                values.update(lease_owner=None, lease_expires=0.0)
            if values:
                self.op_set_fields(session_id, values)
            return int(turn_count or 0) + int(user_turn)

    # -- records --------------------------------------------------------------------------
    def op_append(
        self,
        session_id: str,
        records: list[EncodedMessage],
        at: str,
        user_turn: bool,
        turns: list[RecordTurn],
        counted: bool = True,
    ) -> int:
        """See `StorageBackend.op_append`; `counted=False` (a turn's commit, which needs no
        count) returns 0 instead, sparing a COUNT when the record cache is cold."""
        tree = self.tree_id
        sql = f"SELECT next_seq, l3_key FROM {SESSIONS} WHERE tree_id = ? AND id = ?"
        found = self._q(sql, (tree, session_id)).fetchone()
        if found is None:
            raise SessionNotFoundError(session_id)
        first: int = found[0]
        self._qmany(
            f"""INSERT INTO {ROWS} (l3_key, seq, type, data, created_at, turn_id, turn_seq)
            VALUES (?, ?, ?, ?, ?, ?, ?)""",
            [
                (found[1], first + index, role, data, at, stored, turn_seq)
                for index, ((role, data), (stored, turn_seq)) in enumerate(
                    zip(records, run_heads(turns), strict=True)
                )
            ],
        )
        self._q(
            f"""UPDATE {SESSIONS} SET next_seq = ?, turn_count = turn_count + ?,
                updated_at = COALESCE(?, updated_at)
            WHERE tree_id = ? AND id = ?""",
            (first + len(records), int(user_turn), at if records else None, tree, session_id),
        )
        self._hooks.sync()  # the cache up to date before it is extended
        self._cache.extend(session_id, lambda: [decode_message(data) for _, data in records])
        return self.op_count(session_id) if counted else 0

    def op_records(self, session_id: str) -> Sequence[BaseMessage]:
        self._hooks.sync()
        cached = self._cache.get(session_id)
        if cached is not None:
            return cached
        rows = self._run(self._shared.rows(session_id, "data"), session_id) or []
        records = decode_records(session_id, [data for (data,) in rows], decode_message)
        self._cache.put(session_id, records)
        return records

    def op_turns(self, session_id: str) -> list[RecordTurn]:
        return read_turns(self._run(self._shared.rows(session_id, "turn_id, turn_seq"), session_id))

    def op_has_turn(self, session_id: str, turn_id: str) -> bool:
        # one statement for the usual case: the session's own rows, and whether it has more
        sql = f"""SELECT base_id, base_count, EXISTS (
                SELECT 1 FROM {ROWS} INDEXED BY stello_records_turns
                WHERE l3_key = s.l3_key AND turn_id = ?)
            FROM {SESSIONS} s WHERE s.tree_id = ? AND s.id = ?"""
        row = self._one(sql, (turn_id, self.tree_id, session_id), session_id)
        if row is None or row[2]:
            return row is not None
        if row[0] is None:
            return False
        segments = self._run(self._shared.prefix(*row[:2]), session_id)
        return self._run(self._shared.has_turn(segments, turn_id), session_id)

    def op_count(self, session_id: str) -> int:
        self._hooks.sync()
        cached = self._cache.get(session_id)
        if cached is not None:
            return len(cached)
        sql = f"SELECT {_COUNTED} FROM {SESSIONS} s WHERE s.tree_id = ? AND s.id = ?"
        row = self._q(sql, (self.tree_id, session_id)).fetchone()
        return 0 if row is None else int(row[0])

    def op_drop_oldest(self, session_id: str, count: int) -> None:
        # rows below a child's cut are about to go: the children copy them first, and a
        # session trimming its own shared prefix holds its rows itself first (`_shared_l3`)
        self._run(self._shared.release([session_id]))
        self._run(self._shared.materialise(session_id))
        sql = f"SELECT l3_key FROM {SESSIONS} WHERE tree_id = ? AND id = ?"
        found = self._q(sql, (self.tree_id, session_id)).fetchone()
        key = None if found is None else found[0]
        kept = f"SELECT seq FROM {ROWS} WHERE l3_key = ? ORDER BY seq LIMIT 1 OFFSET ?"
        # the new first record must carry its turn's id, which may be on a dropped one
        self._q(
            f"""UPDATE {ROWS} SET turn_id = (
                SELECT r.turn_id FROM {ROWS} r
                WHERE r.l3_key = {ROWS}.l3_key AND r.seq <= {ROWS}.seq AND r.turn_id IS NOT NULL
                ORDER BY r.seq DESC LIMIT 1)
            WHERE l3_key = ? AND turn_id IS NULL AND seq = ({kept})""",
            (key, key, count),
        )
        self._q(
            f"""DELETE FROM {ROWS} WHERE l3_key = ? AND seq IN (
                SELECT seq FROM {ROWS} WHERE l3_key = ? ORDER BY seq LIMIT ?)""",
            (key, key, count),
        )
        self._cache.drop_oldest(session_id, count)

    # -- branching (contract B: rows shared or copied inside the database) -----------------
    def op_copy_records(self, source_id: str, target_id: str, count: int) -> int:
        tree = self.tree_id
        sql = f"""SELECT s.next_seq, s.base_id, {_COUNTED}
            FROM {SESSIONS} s WHERE s.tree_id = ? AND s.id = ?"""
        found = [self._q(sql, (tree, sid)).fetchone() for sid in (source_id, target_id)]
        for sid, row in zip((source_id, target_id), found, strict=True):
            if row is None:
                raise SessionNotFoundError(sid)
        count = min(count, found[0][2])  # the caller checked it; a prefix must be exact
        source = self._cache.get(source_id)
        target = self._cache.get(target_id)
        self._cache.discard(target_id)  # marks it touched: a rollback forgets it
        empty = count > 0 and source_id != target_id and found[1][2] == 0
        self._run(self._shared.fork(source_id, target_id, count, found[1][0], empty))
        if source is not None and (target is not None or empty):
            self._cache.put(target_id, [*(target or ()), *source[:count]])
        return self.op_count(target_id)

    # -- topology -------------------------------------------------------------------------
    def op_nodes(self, node_id: str | None, parent_id: str | None) -> list[TopologyNode]:
        if node_id is not None:  # a point read: a damaged row is `DamagedDataError`
            rows = self._fetch(sqlite_marks(GET_NODE), (self.tree_id, node_id), node_id)
        elif parent_id is not None:
            rows = self._fetch(sqlite_marks(CHILDREN), (self.tree_id, parent_id))
        else:
            rows = self._fetch(sqlite_marks(ALL_NODES), (self.tree_id,))
        return built(stored_node, rows)

    def op_put_node(self, node: TopologyNode) -> None:
        tree = self.tree_id
        self._q(sqlite_marks(PUT_NODE), (tree, node.id, node.parent_id, node.label, tree))

    def op_delete_sessions(self, session_ids: list[str]) -> None:
        # Sessions that share a prefix of these copy it first (`_shared_l3`); then ON DELETE
        # CASCADE removes the records and the node of each session. Their events keep their
        # cursors, without their details (`REMOVED_PAYLOAD`): one pass over the tree's log.
        self._run(self._shared.release(session_ids))
        sql = f"DELETE FROM {SESSIONS} WHERE tree_id = ? AND id = ?"
        self._qmany(sql, [(self.tree_id, session_id) for session_id in session_ids])
        for start in range(0, len(session_ids), 500):  # SQLite binds 32,766 values at most
            chunk = session_ids[start : start + 500]
            self._q(
                f"""UPDATE {EVENTS} SET payload = ? WHERE tree_id = ?
                    AND session_id IN ({", ".join("?" * len(chunk))})""",
                (REMOVED_PAYLOAD, self.tree_id, *chunk),
            )
        self._delete_threads(session_ids)
        for session_id in session_ids:
            self._cache.discard(session_id)

    def _delete_threads(self, session_ids: list[str]) -> None:
        # The sessions' turn threads in LangGraph's tables on this file (`open_sqlite`'s
        # saver), in this transaction: a kill after it leaves none of them, and the saver
        # writes nothing of a thread whose session is gone (`StelloSqliteSaver`).
        found = {row[0] for row in self._q(_CHECKPOINT_TABLES, tuple(LANGGRAPH_TABLES))}
        threads = [(thread,) for thread in session_threads(self.tree_id, session_ids)]
        for table in sorted(found):
            self._qmany(f"DELETE FROM {table} WHERE thread_id = ?", threads)

    # -- globals --------------------------------------------------------------------------
    def op_get_global(self, key: str) -> str | None:
        row = self._q(sqlite_marks(GET_GLOBAL), (self.tree_id, key)).fetchone()
        return None if row is None else str(row[0])

    def op_put_global(self, key: str, value: str) -> None:
        self._q(sqlite_marks(PUT_GLOBAL), (self.tree_id, key, value))

    # -- the event log --------------------------------------------------------------------
    def op_append_event(self, kind: str, session_id: str | None, payload: str, at: str) -> int:
        # Inside the write transaction (BEGIN IMMEDIATE): no other writer can take the cursor.
        tree = self.tree_id
        sql = f"SELECT COALESCE(MAX(cursor), 0) + 1 FROM {EVENTS} WHERE tree_id = ?"
        cursor: int = self._q(sql, (tree,)).fetchone()[0]
        self._q(
            f"""INSERT INTO {EVENTS} (tree_id, cursor, kind, session_id, payload, at)
            VALUES (?, ?, ?, ?, ?, ?)""",
            (tree, cursor, kind, session_id, payload, at),
        )
        return cursor

    def op_events_after(self, cursor: int, limit: int) -> list[EventRow]:
        rows = self._fetch(sqlite_marks(EVENTS_AFTER), (self.tree_id, cursor, limit))
        return [tuple(row) for row in rows]


class InMemoryMainStorage(SqliteMainStorage):
    """A `MainStorage` kept in memory, for tests and experiments: `SqliteMainStorage` on a
    private `":memory:"` database, so it has exactly the SQLite storage's semantics. Nothing
    survives `close()` or the process.

    Args:
        tree_id: the tree this storage reads and writes.
        record_cache_size: how many sessions' decoded records to keep (0 disables).

    Example:
        >>> from stello_graph.models import SessionMeta
        >>> storage = InMemoryMainStorage()
        >>> storage.put_session(SessionMeta(id="s1", label="Ideas"))
        >>> storage.get_session("s1").label
        'Ideas'
    """

    def __init__(self, *, tree_id: str = "default", record_cache_size: int = 256) -> None:
        super().__init__(":memory:", tree_id=tree_id, record_cache_size=record_cache_size)

    def __repr__(self) -> str:
        return f"InMemoryMainStorage(tree_id={self.tree_id!r})"
