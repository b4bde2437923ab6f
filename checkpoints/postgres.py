"""`PostgresMainStorage`: the `MainStorage` of many worker processes, on one PostgreSQL database.

The same tables and semantics as `SqliteMainStorage` (see `_postgres_schema`), every query
scoped by `tree_id`, so many trees (one per user) share one database and never see each
other. Each primitive is written once, as the statements it runs (`_postgres_conn.Steps`), and
run by a sync driver (`op_*`, on a psycopg `Connection`) and a native async one (`aop_*`, on
a psycopg `AsyncConnection`, no threads). Write transactions take the tree's advisory lock
(see `_postgres_conn`), so the shell's read-then-write compositions (leases,
compare-and-clear) hold across processes unchanged.

Appending an event also `NOTIFY`s the channel `EVENTS_CHANNEL` (`stello_events`) with
`{"tree_id": ..., "cursor": ...}`, delivered when the transaction commits: a listener in
another process (`LISTEN stello_events`) reads the new events with `events_after(cursor)`.

Needs the `postgres` extra: `pip install "stello-graph[postgres]"`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg_pool
from langchain_core.messages import BaseMessage

import stello_graph.checkpoints._postgres_schema as _schema
from stello_graph.checkpoints._postgres_conn import (
    AsyncHooks,
    Link,
    Query,
    Steps,
    SyncHooks,
    tree_lock_key,
)
from stello_graph.checkpoints._postgres_schema import EVENTS, GLOBALS, NODES, RECORDS, SESSIONS
from stello_graph.checkpoints._serde import (
    EncodedMessage,
    MetaRow,
    RecordTurn,
    decode_message,
    from_iso,
    row_to_meta,
)
from stello_graph.checkpoints._shell import FIELDS, BackendStorage
from stello_graph.checkpoints._txn import TransactionHooks
from stello_graph.checkpoints._validate import check_identifier, check_non_negative
from stello_graph.errors import InvalidInputError, SessionNotFoundError
from stello_graph.models import (
    ChildL2,
    SessionMeta,
    SessionRole,
    SessionStats,
    SessionStatus,
    TopologyNode,
    utcnow,
)

if TYPE_CHECKING:
    from stello_graph.checkpoints._postgres_saver import StelloPostgresSaver

__all__ = ["EVENTS_CHANNEL", "PostgresMainStorage", "open_postgres"]

EVENTS_CHANNEL = "stello_events"
"""The channel notified of each appended event; the payload is JSON
`{"tree_id": ..., "cursor": ...}` (the event's cursor in its tree)."""

EventRow = tuple[int, str, str | None, str, str]
"""`(cursor, kind, session_id, payload, at)` of one stored event."""

COLUMNS = FIELDS | {"forked_from", "forked_at_turn"}
"""The per-session columns `op_get_fields` / `op_set_fields` accept (names are checked before
they are put in SQL)."""

_META = "id, label, role, status, tags, metadata, created_at, updated_at"


class PostgresMainStorage(BackendStorage):
    """A `MainStorage` in a PostgreSQL database, bound to one tree; sync and native async.

    Args:
        conninfo: a libpq connection string or URL (`"postgresql://user@host/db"`): the
            storage opens a connection of its own (and one per event loop for async
            calls) and reconnects when one is lost; or a `psycopg_pool.ConnectionPool`,
            from which each call or transaction takes a connection (async calls open a
            connection per loop with the pool's conninfo). A pool given is not closed by
            `close()`.
        tree_id: the tree this storage reads and writes; other trees in the database stay
            invisible.
        connect_timeout: seconds to wait for the server when connecting.
        lock_timeout: seconds a write waits for another connection's write to the same tree.
        record_cache_size: how many sessions' decoded records to keep (0 disables): a read
            checks the session's stamp (one indexed lookup) instead of decoding its records
            again; a change made by any connection moves the stamp.

    Raises:
        InvalidInputError: `conninfo` is not a connection string or a pool.
        StorageUnavailableError: the server cannot be reached or refuses the login.
        ForeignDatabaseError: the database holds tables named like stello's that it did not
            make (left untouched).
        SchemaVersionError: the database was written by a newer stello-graph.

    Example:
        >>> url = "postgresql://app@db/app"
        >>> storage = PostgresMainStorage(url, tree_id="alice")  # doctest: +SKIP
        >>> storage.put_session(SessionMeta(id="s1", label="Ideas"))  # doctest: +SKIP
    """

    def __init__(
        self,
        conninfo: str | psycopg_pool.ConnectionPool[Any],
        *,
        tree_id: str = "default",
        connect_timeout: float = 10.0,
        lock_timeout: float = 30.0,
        record_cache_size: int = 256,
    ) -> None:
        check_identifier(tree_id, "tree_id")  # before a connection is opened, not after
        self._cache_size = check_non_negative(record_cache_size, "record_cache_size")
        self._cache: OrderedDict[str, tuple[int, list[BaseMessage]]] = OrderedDict()
        """Decoded records by session, with the `records_stamp` they were read at."""
        for name, value in (("connect_timeout", connect_timeout), ("lock_timeout", lock_timeout)):
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise InvalidInputError(f"{name} must be a positive number, got {value!r}.")
        self._link = Link(conninfo, connect_timeout=connect_timeout, lock_timeout=lock_timeout)
        key = tree_lock_key(tree_id)
        self._hooks = SyncHooks(self._link, key)
        self._ahooks = AsyncHooks(self._link, key)
        self.conninfo = self._link.conninfo
        """The connection string the storage (and `open_checkpointer`) connects with."""
        self._closed = False
        super().__init__(self, tree_id=tree_id)  # its own `StorageBackend`
        try:
            self._migrate()
        except BaseException:
            self._link.close()
            self._closed = True
            raise

    def _migrate(self) -> None:
        """Check the database is stello's (or free of it), then bring its schema up to date
        in one transaction under the migration lock (read again under it: another process
        may have migrated meanwhile)."""
        conn = self._link.acquire()
        try:
            if self._read_version(conn) == _schema.SCHEMA_VERSION:
                return
            lock = f"BEGIN; SELECT pg_advisory_xact_lock({_schema.MIGRATION_LOCK})"
            self._link.run(conn, Query(lock))
            try:
                version = self._read_version(conn)
                for sql, params in _schema.migration_statements(
                    version, lambda: utcnow().isoformat()
                ):
                    self._link.run(conn, Query(sql, params))
                self._link.run(conn, Query("COMMIT"))
            except BaseException:
                if not (conn.broken or conn.closed):
                    conn.execute("ROLLBACK")
                raise
        finally:
            self._link.release(conn)

    def _read_version(self, conn: psycopg.Connection[Any]) -> int:
        run = self._link.run
        tables = [row[0] for row in run(conn, Query(_schema.STELLO_TABLES)).rows]
        columns = [row[0] for row in run(conn, Query(_schema.SCHEMA_COLUMNS)).rows]
        version = None
        if _schema.SCHEMA in tables and sorted(columns) == ["applied_at", "version"]:
            found = run(conn, Query(f"SELECT MAX(version) FROM {_schema.SCHEMA}")).rows
            version = found[0][0]
        return _schema.check_shape(self._link.where, tables, columns, version)

    def close(self) -> None:
        """Close the connections the storage opened (waits for a running transaction)."""
        if not self._closed:
            self._txn.close(self._release)

    def _release(self) -> None:
        self._closed = True
        self._cache.clear()
        self._link.close()

    def __enter__(self) -> PostgresMainStorage:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PostgresMainStorage({self._link.where}, tree_id={self.tree_id!r})"

    @property
    def transaction_hooks(self) -> TransactionHooks:
        """`BEGIN` + the tree's advisory lock / `COMMIT` / savepoints, sync side."""
        return self._hooks

    @property
    def async_transaction_hooks(self) -> AsyncHooks:
        """The async twins of `transaction_hooks`, on the running loop's connection."""
        return self._ahooks

    # -- the primitives, each written once as its statements ------------------------------
    def _q_session_exists(self, session_id: str) -> Steps[bool]:
        sql = f"SELECT 1 FROM {SESSIONS} WHERE tree_id = %s AND id = %s"
        return bool((yield Query(sql, (self.tree_id, session_id))).rows)

    def _q_get_session(self, session_id: str) -> Steps[SessionMeta | None]:
        sql = f"SELECT {_META} FROM {SESSIONS} WHERE tree_id = %s AND id = %s"
        rows = (yield Query(sql, (self.tree_id, session_id))).rows
        return row_to_meta(rows[0]) if rows else None

    def _q_put_session(self, row: MetaRow) -> Steps[None]:
        tree = self.tree_id
        yield Query(
            f"""INSERT INTO {SESSIONS} (tree_id, {_META}, created_seq)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s,
                (SELECT COALESCE(MAX(created_seq), 0) + 1 FROM {SESSIONS} WHERE tree_id = %s))
            ON CONFLICT (tree_id, id) DO UPDATE SET
                label = excluded.label, role = excluded.role, status = excluded.status,
                tags = excluded.tags, metadata = excluded.metadata,
                created_at = excluded.created_at, updated_at = excluded.updated_at""",
            (tree, *row, tree),
        )
        sql = f"UPDATE {NODES} SET label = %s WHERE tree_id = %s AND id = %s"
        yield Query(sql, (row[1], tree, row[0]))

    def _q_list_sessions(
        self, status: SessionStatus | None, role: SessionRole | None
    ) -> Steps[list[SessionMeta]]:
        where, params = ["tree_id = %s"], [self.tree_id]
        if role is not None:
            where.append("role = %s")
            params.append(role)
        if status is not None:
            where.append("status = %s")
            params.append(status)
        sql = f"SELECT {_META} FROM {SESSIONS} WHERE {' AND '.join(where)} ORDER BY created_seq"
        return [row_to_meta(row) for row in (yield Query(sql, params)).rows]

    def _q_l2s(self) -> Steps[list[ChildL2]]:
        rows = (
            yield Query(
                f"""SELECT id, label, memory FROM {SESSIONS}
                WHERE tree_id = %s AND role = 'standard' AND status = 'active'
                    AND memory IS NOT NULL
                ORDER BY created_seq""",
                (self.tree_id,),
            )
        ).rows
        return [ChildL2(session_id=sid, label=label, l2=l2) for sid, label, l2 in rows]

    def _q_session_stats(self) -> Steps[list[SessionStats]]:
        # As SQLite's: a session's seqs are contiguous, so the records after the L2 cursor
        # are those from MIN(seq) + memory_through on.
        rows = (
            yield Query(
                f"""SELECT s.id, s.label, s.role, s.status, s.updated_at, n.parent_id,
                    n.id IS NOT NULL, s.turn_count,
                    (SELECT COUNT(*) FROM {RECORDS} r
                        WHERE r.tree_id = s.tree_id AND r.session_id = s.id),
                    s.memory_through,
                    (SELECT COUNT(*) FROM {RECORDS} r
                        WHERE r.tree_id = s.tree_id AND r.session_id = s.id
                        AND r.type = 'human'
                        AND r.seq >= s.memory_through + (SELECT MIN(f.seq) FROM {RECORDS} f
                            WHERE f.tree_id = s.tree_id AND f.session_id = s.id)),
                    s.memory IS NOT NULL, s.insight IS NOT NULL,
                    s.subtree_synthesis IS NOT NULL
                FROM {SESSIONS} s
                LEFT JOIN {NODES} n ON n.tree_id = s.tree_id AND n.id = s.id
                WHERE s.tree_id = %s ORDER BY s.created_seq""",
                (self.tree_id,),
            )
        ).rows
        return [
            SessionStats(
                id=row[0],
                label=row[1],
                role=row[2],
                status=row[3],
                updated_at=from_iso(row[4]),
                parent_id=row[5],
                in_tree=bool(row[6]),
                turns=row[7],
                records=row[8],
                memory_through=row[9] or 0,
                turns_since_memory=row[10],
                has_memory=bool(row[11]),
                has_insight=bool(row[12]),
                has_subtree_synthesis=bool(row[13]),
            )
            for row in rows
        ]

    def _q_get_fields(self, session_id: str, names: Sequence[str]) -> Steps[tuple[Any, ...] | None]:
        if not COLUMNS.issuperset(names):
            raise InvalidInputError(f"Unknown session fields: {sorted(set(names) - COLUMNS)}.")
        sql = f"SELECT {', '.join(names)} FROM {SESSIONS} WHERE tree_id = %s AND id = %s"
        rows = (yield Query(sql, (self.tree_id, session_id))).rows
        return tuple(rows[0]) if rows else None

    def _q_set_fields(self, session_id: str, values: dict[str, Any]) -> Steps[None]:
        if not COLUMNS.issuperset(values):
            raise InvalidInputError(f"Unknown session fields: {sorted(set(values) - COLUMNS)}.")
        columns = ", ".join(f"{name} = %s" for name in values)
        sql = f"UPDATE {SESSIONS} SET {columns} WHERE tree_id = %s AND id = %s"
        done = yield Query(sql, (*values.values(), self.tree_id, session_id))
        if done.rowcount == 0:
            raise SessionNotFoundError(session_id)

    def _q_delete_sessions(self, session_ids: list[str]) -> Steps[None]:
        # ON DELETE CASCADE removes each session's records and node; one statement, so the
        # nodes' parent references are checked once every listed node is gone.
        sql = f"DELETE FROM {SESSIONS} WHERE tree_id = %s AND id = ANY(%s)"
        yield Query(sql, (self.tree_id, list(session_ids)))
        for session_id in session_ids:
            self._cache.pop(session_id, None)

    def _q_append(
        self,
        session_id: str,
        records: list[EncodedMessage],
        at: str,
        user_turn: bool,
        turns: list[RecordTurn],
    ) -> Steps[int]:
        tree, count = self.tree_id, len(records)
        # Subqueries in RETURNING read the snapshot before the statement: the old count and
        # the old stamp (the cached records are still exact if they had that stamp).
        found = (
            yield Query(
                f"""UPDATE {SESSIONS} SET next_seq = next_seq + %s,
                    turn_count = turn_count + %s, updated_at = COALESCE(%s, updated_at),
                    records_stamp = CASE WHEN %s THEN nextval('{_schema.STAMPS}')
                        ELSE records_stamp END
                WHERE tree_id = %s AND id = %s
                RETURNING next_seq - %s, records_stamp,
                    (SELECT COUNT(*) FROM {RECORDS} WHERE tree_id = %s AND session_id = %s),
                    (SELECT s.records_stamp FROM {SESSIONS} s
                        WHERE s.tree_id = %s AND s.id = %s)""",
                (
                    *(count, int(user_turn), at if records else None, bool(records)),
                    *(tree, session_id, count, tree, session_id, tree, session_id),
                ),
            )
        ).rows
        if not found:
            raise SessionNotFoundError(session_id)
        first, stamp, before, old_stamp = found[0]
        if records:
            heads = _run_heads(turns)
            yield Query(
                f"""INSERT INTO {RECORDS}
                    (tree_id, session_id, seq, type, data, created_at, turn_id, turn_seq)
                SELECT %s, %s, %s + r.i - 1, r.type, r.data, %s, r.turn_id, r.turn_seq
                FROM unnest(%s::text[], %s::text[], %s::text[], %s::int[])
                    WITH ORDINALITY AS r(type, data, turn_id, turn_seq, i)""",
                (
                    *(tree, session_id, first, at),
                    [role for role, _ in records],
                    [data for _, data in records],
                    [turn_id for turn_id, _ in heads],
                    [turn_seq for _, turn_seq in heads],
                ),
            )
            cached = self._cache.pop(session_id, None)
            if cached is not None and cached[0] == old_stamp:
                added = [decode_message(data) for _, data in records]
                self._remember(session_id, stamp, [*cached[1], *added])
        return int(before) + count

    def _q_has_turn(self, session_id: str, turn_id: str) -> Steps[bool]:
        sql = f"""SELECT 1 FROM {RECORDS}
            WHERE tree_id = %s AND session_id = %s AND turn_id = %s LIMIT 1"""
        return bool((yield Query(sql, (self.tree_id, session_id, turn_id))).rows)

    def _q_turns(self, session_id: str) -> Steps[list[RecordTurn]]:
        sql = f"""SELECT turn_id, turn_seq FROM {RECORDS}
            WHERE tree_id = %s AND session_id = %s ORDER BY seq"""
        turns, turn_id = [], ""
        for stored, turn_seq in (yield Query(sql, (self.tree_id, session_id))).rows:
            turn_id = stored or turn_id  # the first record of a run carries the turn's id
            turns.append((turn_id, turn_seq))
        return turns

    def _q_records(self, session_id: str) -> Steps[list[BaseMessage]]:
        key = (self.tree_id, session_id)
        cached = self._cache.get(session_id)
        if cached is not None:
            sql = f"SELECT records_stamp FROM {SESSIONS} WHERE tree_id = %s AND id = %s"
            found = (yield Query(sql, key)).rows
            if found and found[0][0] == cached[0]:
                self._cache.move_to_end(session_id)
                return cached[1]
        # the stamp and the records in one statement: one snapshot
        rows = (
            yield Query(
                f"""SELECT s.records_stamp, r.data FROM {SESSIONS} s
                LEFT JOIN {RECORDS} r ON r.tree_id = s.tree_id AND r.session_id = s.id
                WHERE s.tree_id = %s AND s.id = %s ORDER BY r.seq""",
                key,
            )
        ).rows
        if not rows:
            self._cache.pop(session_id, None)
            return []
        records = [decode_message(data) for _, data in rows if data is not None]
        self._remember(session_id, rows[0][0], records)
        return records

    def _remember(self, session_id: str, stamp: int, records: list[BaseMessage]) -> None:
        """Keep a session's decoded records (the newest `record_cache_size` sessions)."""
        if self._cache_size <= 0:
            return
        self._cache[session_id] = (stamp, records)
        self._cache.move_to_end(session_id)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    def _q_count(self, session_id: str) -> Steps[int]:
        sql = f"SELECT COUNT(*) FROM {RECORDS} WHERE tree_id = %s AND session_id = %s"
        return int((yield Query(sql, (self.tree_id, session_id))).rows[0][0])

    def _q_drop_oldest(self, session_id: str, count: int) -> Steps[None]:
        key = (self.tree_id, session_id)
        kept = f"""SELECT seq FROM {RECORDS} WHERE tree_id = %s AND session_id = %s
            ORDER BY seq LIMIT 1 OFFSET %s"""
        # the new first record must carry its turn's id, which may be on a dropped one
        yield Query(
            f"""UPDATE {RECORDS} AS t SET turn_id = (
                SELECT r.turn_id FROM {RECORDS} r
                WHERE r.tree_id = t.tree_id AND r.session_id = t.session_id
                    AND r.seq <= t.seq AND r.turn_id IS NOT NULL
                ORDER BY r.seq DESC LIMIT 1)
            WHERE t.tree_id = %s AND t.session_id = %s AND t.turn_id IS NULL
                AND t.seq = ({kept})""",
            (*key, *key, count),
        )
        yield Query(
            f"""DELETE FROM {RECORDS} WHERE tree_id = %s AND session_id = %s AND seq IN (
                SELECT seq FROM {RECORDS} WHERE tree_id = %s AND session_id = %s
                ORDER BY seq LIMIT %s)""",
            (*key, *key, count),
        )
        yield Query(
            f"""UPDATE {SESSIONS} SET records_stamp = nextval('{_schema.STAMPS}')
            WHERE tree_id = %s AND id = %s""",
            key,
        )
        self._cache.pop(session_id, None)

    def _q_copy_records(self, source_id: str, target_id: str, count: int) -> Steps[int]:
        tree = self.tree_id
        sql = f"SELECT id FROM {SESSIONS} WHERE tree_id = %s AND id = ANY(%s)"
        present = {row[0] for row in (yield Query(sql, (tree, [source_id, target_id]))).rows}
        for session_id in (source_id, target_id):
            if session_id not in present:
                raise SessionNotFoundError(session_id)
        # copied in the database, stored form and turn kept; seqs continue the target's
        yield Query(
            f"""WITH src AS (
                SELECT type, data, created_at, turn_id, turn_seq,
                    row_number() OVER (ORDER BY seq) - 1 AS i
                FROM {RECORDS} WHERE tree_id = %s AND session_id = %s
                ORDER BY seq LIMIT %s),
            target AS (
                UPDATE {SESSIONS} SET next_seq = next_seq + (SELECT COUNT(*) FROM src),
                    records_stamp = nextval('{_schema.STAMPS}')
                WHERE tree_id = %s AND id = %s
                RETURNING next_seq - (SELECT COUNT(*) FROM src) AS first)
            INSERT INTO {RECORDS}
                (tree_id, session_id, seq, type, data, created_at, turn_id, turn_seq)
            SELECT %s, %s, target.first + src.i, src.type, src.data, src.created_at,
                src.turn_id, src.turn_seq
            FROM src CROSS JOIN target""",
            (tree, source_id, count, tree, target_id, tree, target_id),
        )
        self._cache.pop(target_id, None)
        return (yield from self._q_count(target_id))

    def _q_append_event(
        self, kind: str, session_id: str | None, payload: str, at: str
    ) -> Steps[int]:
        tree = self.tree_id
        rows = (
            yield Query(
                f"""WITH e AS (
                    INSERT INTO {EVENTS} (tree_id, cursor, kind, session_id, payload, at)
                    VALUES (%s, (SELECT COALESCE(MAX(cursor), 0) + 1 FROM {EVENTS}
                        WHERE tree_id = %s), %s, %s, %s, %s)
                    RETURNING cursor)
                SELECT cursor, pg_notify(%s, json_build_object(
                    'tree_id', %s::text, 'cursor', cursor)::text) FROM e""",
                (tree, tree, kind, session_id, payload, at, EVENTS_CHANNEL, tree),
            )
        ).rows
        return int(rows[0][0])

    def _q_events_after(self, cursor: int, limit: int) -> Steps[list[EventRow]]:
        sql = f"""SELECT cursor, kind, session_id, payload, at FROM {EVENTS}
            WHERE tree_id = %s AND cursor > %s ORDER BY cursor LIMIT %s"""
        rows = (yield Query(sql, (self.tree_id, cursor, limit))).rows
        return [(int(c), kind, sid, payload, at) for c, kind, sid, payload, at in rows]

    def _q_get_node(self, node_id: str) -> Steps[TopologyNode | None]:
        sql = f"SELECT id, parent_id, label FROM {NODES} WHERE tree_id = %s AND id = %s"
        rows = (yield Query(sql, (self.tree_id, node_id))).rows
        return _node(rows[0]) if rows else None

    def _q_put_node(self, node: TopologyNode) -> Steps[None]:
        tree = self.tree_id
        yield Query(
            f"""INSERT INTO {NODES} (tree_id, id, parent_id, label, position)
            VALUES (%s, %s, %s, %s,
                (SELECT COALESCE(MAX(position), 0) + 1 FROM {NODES} WHERE tree_id = %s))
            ON CONFLICT (tree_id, id) DO UPDATE SET
                parent_id = excluded.parent_id, label = excluded.label""",
            (tree, node.id, node.parent_id, node.label, tree),
        )

    def _q_children(self, parent_id: str) -> Steps[list[TopologyNode]]:
        sql = f"""SELECT id, parent_id, label FROM {NODES}
            WHERE tree_id = %s AND parent_id = %s ORDER BY position"""
        return [_node(row) for row in (yield Query(sql, (self.tree_id, parent_id))).rows]

    def _q_all_nodes(self) -> Steps[list[TopologyNode]]:
        sql = f"SELECT id, parent_id, label FROM {NODES} WHERE tree_id = %s ORDER BY position"
        return [_node(row) for row in (yield Query(sql, (self.tree_id,))).rows]

    def _q_get_global(self, key: str) -> Steps[str | None]:
        sql = f"SELECT value FROM {GLOBALS} WHERE tree_id = %s AND key = %s"
        rows = (yield Query(sql, (self.tree_id, key))).rows
        return None if not rows else str(rows[0][0])

    def _q_put_global(self, key: str, value: str) -> Steps[None]:
        yield Query(
            f"""INSERT INTO {GLOBALS} (tree_id, key, value) VALUES (%s, %s, %s)
            ON CONFLICT (tree_id, key) DO UPDATE SET value = excluded.value""",
            (self.tree_id, key, value),
        )

    # -- sync primitives ------------------------------------------------------------------
    def op_session_exists(self, session_id: str) -> bool:
        return self._link.drive(self._q_session_exists(session_id))

    def op_get_session(self, session_id: str) -> SessionMeta | None:
        return self._link.drive(self._q_get_session(session_id))

    def op_put_session(self, row: MetaRow) -> None:
        self._link.drive(self._q_put_session(row))

    def op_list_sessions(
        self, status: SessionStatus | None, role: SessionRole | None
    ) -> list[SessionMeta]:
        return self._link.drive(self._q_list_sessions(status, role))

    def op_l2s(self) -> list[ChildL2]:
        return self._link.drive(self._q_l2s())

    def op_session_stats(self) -> list[SessionStats]:
        return self._link.drive(self._q_session_stats())

    def op_get_fields(self, session_id: str, names: Sequence[str]) -> tuple[Any, ...] | None:
        return self._link.drive(self._q_get_fields(session_id, names))

    def op_set_fields(self, session_id: str, values: dict[str, Any]) -> None:
        self._link.drive(self._q_set_fields(session_id, values))

    def op_delete_sessions(self, session_ids: list[str]) -> None:
        self._link.drive(self._q_delete_sessions(session_ids))

    def op_append(
        self,
        session_id: str,
        records: list[EncodedMessage],
        at: str,
        user_turn: bool,
        turns: list[RecordTurn],
    ) -> int:
        return self._link.drive(self._q_append(session_id, records, at, user_turn, turns))

    def op_has_turn(self, session_id: str, turn_id: str) -> bool:
        return self._link.drive(self._q_has_turn(session_id, turn_id))

    def op_turns(self, session_id: str) -> list[RecordTurn]:
        return self._link.drive(self._q_turns(session_id))

    def op_records(self, session_id: str) -> Sequence[BaseMessage]:
        return self._link.drive(self._q_records(session_id))

    def op_count(self, session_id: str) -> int:
        return self._link.drive(self._q_count(session_id))

    def op_drop_oldest(self, session_id: str, count: int) -> None:
        self._link.drive(self._q_drop_oldest(session_id, count))

    def op_copy_records(self, source_id: str, target_id: str, count: int) -> int:
        return self._link.drive(self._q_copy_records(source_id, target_id, count))

    def op_append_event(self, kind: str, session_id: str | None, payload: str, at: str) -> int:
        return self._link.drive(self._q_append_event(kind, session_id, payload, at))

    def op_events_after(self, cursor: int, limit: int) -> list[EventRow]:
        return self._link.drive(self._q_events_after(cursor, limit))

    def op_get_node(self, node_id: str) -> TopologyNode | None:
        return self._link.drive(self._q_get_node(node_id))

    def op_put_node(self, node: TopologyNode) -> None:
        self._link.drive(self._q_put_node(node))

    def op_children(self, parent_id: str) -> list[TopologyNode]:
        return self._link.drive(self._q_children(parent_id))

    def op_all_nodes(self) -> list[TopologyNode]:
        return self._link.drive(self._q_all_nodes())

    def op_get_global(self, key: str) -> str | None:
        return self._link.drive(self._q_get_global(key))

    def op_put_global(self, key: str, value: str) -> None:
        self._link.drive(self._q_put_global(key, value))

    # -- async primitives (native: psycopg's AsyncConnection) -----------------------------
    async def aop_session_exists(self, session_id: str) -> bool:
        return await self._link.adrive(self._q_session_exists(session_id))

    async def aop_get_session(self, session_id: str) -> SessionMeta | None:
        return await self._link.adrive(self._q_get_session(session_id))

    async def aop_put_session(self, row: MetaRow) -> None:
        await self._link.adrive(self._q_put_session(row))

    async def aop_list_sessions(
        self, status: SessionStatus | None, role: SessionRole | None
    ) -> list[SessionMeta]:
        return await self._link.adrive(self._q_list_sessions(status, role))

    async def aop_l2s(self) -> list[ChildL2]:
        return await self._link.adrive(self._q_l2s())

    async def aop_session_stats(self) -> list[SessionStats]:
        return await self._link.adrive(self._q_session_stats())

    async def aop_get_fields(self, session_id: str, names: Sequence[str]) -> tuple[Any, ...] | None:
        return await self._link.adrive(self._q_get_fields(session_id, names))

    async def aop_set_fields(self, session_id: str, values: dict[str, Any]) -> None:
        await self._link.adrive(self._q_set_fields(session_id, values))

    async def aop_delete_sessions(self, session_ids: list[str]) -> None:
        await self._link.adrive(self._q_delete_sessions(session_ids))

    async def aop_append(
        self,
        session_id: str,
        records: list[EncodedMessage],
        at: str,
        user_turn: bool,
        turns: list[RecordTurn],
    ) -> int:
        return await self._link.adrive(self._q_append(session_id, records, at, user_turn, turns))

    async def aop_has_turn(self, session_id: str, turn_id: str) -> bool:
        return await self._link.adrive(self._q_has_turn(session_id, turn_id))

    async def aop_turns(self, session_id: str) -> list[RecordTurn]:
        return await self._link.adrive(self._q_turns(session_id))

    async def aop_records(self, session_id: str) -> Sequence[BaseMessage]:
        return await self._link.adrive(self._q_records(session_id))

    async def aop_count(self, session_id: str) -> int:
        return await self._link.adrive(self._q_count(session_id))

    async def aop_drop_oldest(self, session_id: str, count: int) -> None:
        await self._link.adrive(self._q_drop_oldest(session_id, count))

    async def aop_copy_records(self, source_id: str, target_id: str, count: int) -> int:
        return await self._link.adrive(self._q_copy_records(source_id, target_id, count))

    async def aop_append_event(
        self, kind: str, session_id: str | None, payload: str, at: str
    ) -> int:
        return await self._link.adrive(self._q_append_event(kind, session_id, payload, at))

    async def aop_events_after(self, cursor: int, limit: int) -> list[EventRow]:
        return await self._link.adrive(self._q_events_after(cursor, limit))

    async def aop_get_node(self, node_id: str) -> TopologyNode | None:
        return await self._link.adrive(self._q_get_node(node_id))

    async def aop_put_node(self, node: TopologyNode) -> None:
        await self._link.adrive(self._q_put_node(node))

    async def aop_children(self, parent_id: str) -> list[TopologyNode]:
        return await self._link.adrive(self._q_children(parent_id))

    async def aop_all_nodes(self) -> list[TopologyNode]:
        return await self._link.adrive(self._q_all_nodes())

    async def aop_get_global(self, key: str) -> str | None:
        return await self._link.adrive(self._q_get_global(key))

    async def aop_put_global(self, key: str, value: str) -> None:
        await self._link.adrive(self._q_put_global(key, value))

    # -- LangGraph ------------------------------------------------------------------------
    def open_checkpointer(self) -> StelloPostgresSaver:
        """A LangGraph `PostgresSaver` on the same database (its tables set up); the agent
        opens one this way when given this storage and no checkpointer."""
        from stello_graph.checkpoints._postgres_saver import postgres_saver

        return postgres_saver(self.conninfo)


def open_postgres(
    conninfo: str, *, tree_id: str = "default"
) -> tuple[PostgresMainStorage, StelloPostgresSaver]:
    """Open the stello storage and a LangGraph checkpointer on the same PostgreSQL database.

    Raises:
        StorageUnavailableError: the server cannot be reached (nothing is left open).

    Example:
        >>> url = "postgresql://app@db/app"
        >>> storage, saver = open_postgres(url, tree_id="alice")  # doctest: +SKIP
        >>> agent = StelloAgent(model=model, storage=storage, checkpointer=saver)  # doctest: +SKIP
    """
    storage = PostgresMainStorage(conninfo, tree_id=tree_id)
    try:
        return storage, storage.open_checkpointer()
    except BaseException:
        storage.close()
        raise


def _run_heads(turns: list[RecordTurn]) -> list[tuple[str | None, int]]:
    """`turns` as stored: the turn id only on the first record of each run of one turn."""
    heads: list[tuple[str | None, int]] = []
    previous: str | None = None
    for turn_id, turn_seq in turns:
        heads.append((None if turn_id == previous else turn_id, turn_seq))
        previous = turn_id
    return heads


def _node(row: Sequence[Any]) -> TopologyNode:
    return TopologyNode(id=row[0], parent_id=row[1], label=row[2])
