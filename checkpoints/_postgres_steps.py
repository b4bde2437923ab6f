"""The statements of `PostgresMainStorage`'s primitives, each written once.

Each method is a generator (`_postgres_conn.Steps`): it yields the statements of one
primitive, is sent their results and returns the primitive's value, so the storage runs it
with its sync driver (`op_*`) or its native async one (`aop_*`) alike. `Statements` also keeps
the decoded records of recently read sessions, each with the `records_stamp` it was read at
(see `_postgres_schema`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import BaseMessage

import stello_graph.checkpoints._postgres_schema as _schema
from stello_graph.checkpoints._cache import Lru
from stello_graph.checkpoints._damage import META, META_COLUMNS
from stello_graph.checkpoints._flows import _WAITER_TTL
from stello_graph.checkpoints._postgres_conn import Query, Steps, tree_lock_key
from stello_graph.checkpoints._postgres_schema import (
    CHECKPOINT_TABLES,
    EVENTS,
    NODES,
    RECORDS,
    SESSIONS,
)
from stello_graph.checkpoints._postgres_tree import TreeStatements, checked_fields
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
from stello_graph.checkpoints._shared_l3 import SharedPrefixes
from stello_graph.checkpoints._validate import CommitArgs
from stello_graph.errors import LeaseLostError, SessionArchivedError, SessionNotFoundError
from stello_graph.models import (
    Lease,
    SessionMeta,
    SessionRole,
    SessionStatus,
    TopologyNode,
)

__all__ = ["EVENTS_CHANNEL", "EventRow", "Statements"]

EVENTS_CHANNEL = "stello_events"
"""The channel notified of each appended event; the payload is JSON
`{"tree_id": ..., "cursor": ...}` (the event's cursor in its tree)."""

_ADVANCE = f"""next_seq = t.next_seq + %(count)s, turn_count = t.turn_count + %(user)s,
    updated_at = COALESCE(%(updated)s, t.updated_at),
    records_stamp = CASE WHEN %(count)s > 0 THEN nextval('{_schema.STAMPS}')
        ELSE t.records_stamp END"""
"""The `SET` of a session (`t`) whose records grow by `%(count)s`: `append`'s and a turn's
commit's, with `_INSERT` after it."""
_INSERT = f"""ins AS (
    INSERT INTO {RECORDS} (tree_id, session_id, seq, type, data, created_at, turn_id, turn_seq)
    SELECT %(tree)s, %(sid)s, up.first + r.i - 1, r.type, r.data, %(at)s, r.turn_id, r.turn_seq
    FROM up, unnest(%(types)s::text[], %(data)s::text[], %(turn_ids)s::text[],
        %(turn_seqs)s::int[]) WITH ORDINALITY AS r(type, data, turn_id, turn_seq, i))"""
"""The records added, numbered from the `first` seq the `up` of `_ADVANCE` returned."""


def _appended(
    tree: str,
    session_id: str,
    records: list[EncodedMessage],
    at: str,
    user_turn: bool,
    turns: list[RecordTurn],
) -> dict[str, Any]:
    """The parameters of `_ADVANCE` and `_INSERT`."""
    heads = run_heads(turns)
    return {
        "tree": tree, "sid": session_id, "count": len(records), "user": int(user_turn),
        "updated": at if records else None, "at": at,
        "types": [role for role, _ in records], "data": [data for _, data in records],
        "turn_ids": [turn_id for turn_id, _ in heads],
        "turn_seqs": [turn_seq for _, turn_seq in heads],
    }  # fmt: skip


class Statements(TreeStatements):
    """The primitives of one tree, as statements; and the tree's record cache."""

    def __init__(self, tree_id: str, cache_size: int) -> None:
        self.tree_id = tree_id
        self.key = tree_lock_key(tree_id)
        """The tree's advisory lock key, held by its write transactions."""
        self.cache: Lru[tuple[int, list[BaseMessage]]] = Lru(cache_size)
        """Decoded records by session, with the `records_stamp` they were read at."""
        self.shared = SharedPrefixes(tree_id)
        """The statements of shared L3 prefixes (`_shared_l3`)."""

    def put_session(self, row: MetaRow) -> Steps[None]:
        tree = self.tree_id
        yield Query(
            f"""INSERT INTO {SESSIONS} (tree_id, {META}, created_seq)
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

    def list_sessions(
        self, status: SessionStatus | None, role: SessionRole | None
    ) -> Steps[list[SessionMeta]]:
        sql, params = listed_sessions(self.tree_id, status, role)
        return built(stored_meta, (yield Query(sql, params)).rows)

    def read_session(
        self, session_id: str, names: Sequence[str], records: bool
    ) -> Steps[SessionRead | None]:
        """The meta, the named fields and the record stamp in one statement; the records
        from the cache when the stamp says they did not change (else one more statement)."""
        columns = "".join(f", {name}" for name in checked_fields(names))
        sql = f"""SELECT {META}{columns}, records_stamp FROM {SESSIONS}
            WHERE tree_id = %s AND id = %s"""
        rows = (yield Query(sql, (self.tree_id, session_id))).rows
        if not rows:
            return None
        (meta, values), stamp = split_read(rows[0][:-1]), rows[0][-1]
        if not records:
            return meta, values, ()
        return meta, values, (yield from self._records_at(session_id, stamp))

    def set_fields(self, session_id: str, values: dict[str, Any]) -> Steps[None]:
        columns = ", ".join(f"{name} = %s" for name in checked_fields(values))
        sql = f"UPDATE {SESSIONS} SET {columns} WHERE tree_id = %s AND id = %s"
        done = yield Query(sql, (*values.values(), self.tree_id, session_id))
        if done.rowcount == 0:
            raise SessionNotFoundError(session_id)

    def delete_sessions(self, session_ids: list[str]) -> Steps[None]:
        # ON DELETE CASCADE removes each session's records and node; one statement, so the
        # nodes' parent references are checked once every listed node is gone. Sessions that
        # share a prefix of these copy it first (`_shared_l3`). Their events keep their
        # cursors, without their details (`REMOVED_PAYLOAD`).
        yield from self.run(self.shared.release(list(session_ids)))
        sql = f"DELETE FROM {SESSIONS} WHERE tree_id = %s AND id = ANY(%s)"
        yield Query(sql, (self.tree_id, list(session_ids)))
        sql = f"UPDATE {EVENTS} SET payload = %s WHERE tree_id = %s AND session_id = ANY(%s)"
        yield Query(sql, (REMOVED_PAYLOAD, self.tree_id, list(session_ids)))
        # The sessions' turn threads in LangGraph's tables on this database (the stello
        # saver's), in this transaction and after the sessions' rows: a kill leaves none of
        # them, and a checkpoint write of the saver, which writes nothing of a thread whose
        # session is gone, either went before (its rows are seen here) or finds the session
        # gone (`StelloPostgresSaver`).
        sql = "SELECT name FROM unnest(%s::text[]) AS name WHERE to_regclass(name) IS NOT NULL"
        found = (yield Query(sql, (list(CHECKPOINT_TABLES),))).rows
        threads = session_threads(self.tree_id, session_ids)
        for (table,) in found:
            yield Query(f"DELETE FROM {table} WHERE thread_id = ANY(%s)", (threads,))
        for session_id in session_ids:
            self.cache.pop(session_id)

    def append(
        self,
        session_id: str,
        records: list[EncodedMessage],
        at: str,
        user_turn: bool,
        turns: list[RecordTurn],
    ) -> Steps[int]:
        # Subqueries in RETURNING read the snapshot before the statement: the old count and
        # the old stamp (the cached records are still exact if they had that stamp).
        sql = f"""WITH up AS (
            UPDATE {SESSIONS} AS t SET {_ADVANCE}
            WHERE t.tree_id = %(tree)s AND t.id = %(sid)s
            RETURNING t.next_seq - %(count)s AS first, t.records_stamp AS stamp,
                (SELECT COUNT(*) FROM {RECORDS} r
                    WHERE r.tree_id = t.tree_id AND r.session_id = t.id) AS before,
                (SELECT s.records_stamp FROM {SESSIONS} s
                    WHERE s.tree_id = t.tree_id AND s.id = t.id) AS old_stamp
        ), {_INSERT}
        SELECT first, stamp, before, old_stamp FROM up"""
        params = _appended(self.tree_id, session_id, records, at, user_turn, turns)
        found = (yield Query(sql, params)).rows
        if not found:
            raise SessionNotFoundError(session_id)
        _, stamp, before, old_stamp = found[0]
        self.committed(session_id, records, old_stamp, stamp)
        return int(before) + len(records)

    def has_turn(self, session_id: str, turn_id: str) -> Steps[bool]:
        # one statement for the usual case: the session's own rows, and whether it has more
        sql = f"""SELECT s.base_id, s.base_count, EXISTS (SELECT 1 FROM {RECORDS} r
                WHERE r.tree_id = s.tree_id AND r.session_id = s.id AND r.turn_id = %s)
            FROM {SESSIONS} s WHERE s.tree_id = %s AND s.id = %s"""
        rows = (yield Query(sql, (turn_id, self.tree_id, session_id))).rows
        if not rows or rows[0][2]:
            return bool(rows)
        base_id, base_count, _ = rows[0]
        if base_id is None:
            return False
        prefix = yield from self.run(self.shared.prefix(base_id, base_count))
        return (yield from self.run(self.shared.has_turn(prefix, turn_id)))

    def turns(self, session_id: str) -> Steps[list[RecordTurn]]:
        return read_turns((yield from self.run(self.shared.rows(session_id, "turn_id, turn_seq"))))

    def records(self, session_id: str) -> Steps[list[BaseMessage]]:
        stamp = None  # the session's, read only when the cache holds records of it
        if self.cache.get(session_id) is not None:
            sql = f"SELECT records_stamp FROM {SESSIONS} WHERE tree_id = %s AND id = %s"
            found = (yield Query(sql, (self.tree_id, session_id))).rows
            stamp = found[0][0] if found else None
        return (yield from self._records_at(session_id, stamp))

    def _records_at(self, session_id: str, stamp: int | None) -> Steps[list[BaseMessage]]:
        """The session's records: the cache's when it holds them at `stamp`, else read."""
        cached = self.cache.get(session_id)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        return (yield from self._load_records(session_id))

    def _load_records(self, session_id: str) -> Steps[list[BaseMessage]]:
        key = (self.tree_id, session_id)
        # the stamp and the records in one statement: one snapshot
        rows = (
            yield Query(
                f"""SELECT s.records_stamp, s.base_id, r.data FROM {SESSIONS} s
                LEFT JOIN {RECORDS} r ON r.tree_id = s.tree_id AND r.session_id = s.id
                WHERE s.tree_id = %s AND s.id = %s ORDER BY r.seq""",
                key,
            )
        ).rows
        if not rows:
            self.cache.pop(session_id)
            return []
        stamp = rows[0][0]
        if rows[0][1] is not None:  # a shared prefix: its rows, then the session's own
            # the same transaction: the rows a prefix points at do not change (see
            # `_shared_l3`), and the stamp read above is the session's for these rows
            shared = yield from self.run(self.shared.rows(session_id, "data"))
            rows = [(stamp, None, data) for (data,) in shared or ()]
        records = decode_records(session_id, [data for _, _, data in rows if data is not None])
        self.cache.put(session_id, (stamp, records))
        return records

    def count(self, session_id: str) -> Steps[int]:
        sql = f"""SELECT s.base_count + (SELECT COUNT(*) FROM {RECORDS} r
                WHERE r.tree_id = s.tree_id AND r.session_id = s.id)
            FROM {SESSIONS} s WHERE s.tree_id = %s AND s.id = %s"""
        rows = (yield Query(sql, (self.tree_id, session_id))).rows
        return int(rows[0][0]) if rows else 0

    def drop_oldest(self, session_id: str, count: int) -> Steps[None]:
        # rows below a child's cut are about to go: the children copy them first, and a
        # session trimming its own shared prefix holds its rows itself first (`_shared_l3`)
        yield from self.run(self.shared.release([session_id]))
        yield from self.run(self.shared.materialise(session_id))
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
        yield from self._restamp(session_id)

    def copy_records(self, source_id: str, target_id: str, count: int) -> Steps[int]:
        tree = self.tree_id
        sql = f"""SELECT s.id, s.next_seq, s.base_count + (SELECT COUNT(*) FROM {RECORDS} r
                WHERE r.tree_id = s.tree_id AND r.session_id = s.id)
            FROM {SESSIONS} s WHERE s.tree_id = %s AND s.id = ANY(%s)"""
        rows = (yield Query(sql, (tree, [source_id, target_id]))).rows
        present = {row[0]: row[1:] for row in rows}
        for session_id in (source_id, target_id):
            if session_id not in present:
                raise SessionNotFoundError(session_id)
        count = min(count, int(present[source_id][1]))  # checked by the caller; kept exact
        first, records = present[target_id]
        empty = count > 0 and source_id != target_id and records == 0
        yield from self.run(self.shared.fork(source_id, target_id, count, first, empty))
        yield from self._restamp(target_id)
        return (yield from self.count(target_id))

    def _restamp(self, session_id: str) -> Steps[None]:
        """A new `records_stamp` for the session whose records changed; its cache dropped."""
        sql = f"""UPDATE {SESSIONS} SET records_stamp = nextval('{_schema.STAMPS}')
            WHERE tree_id = %s AND id = %s"""
        yield Query(sql, (self.tree_id, session_id))
        self.cache.pop(session_id)

    def lease(
        self,
        session_id: str,
        owner: str,
        ttl: float,
        replace: str | None,
        refuse_archived: str | None,
        read: Sequence[str] | None,
    ) -> Steps[tuple[Lease, SessionRead | None] | None]:
        """`op_lease`: the decision of `choose_lease` as one `UPDATE` (in a transaction of
        its own outside the caller's: one round trip). With `refuse_archived` (the operation
        refused), an archived session raises `SessionArchivedError` and is left as it was.
        With `read`, the statement also returns the session's meta, those fields and its
        record stamp: when the record cache holds that stamp, the read is whole in the same
        round trip; else the shell reads the session under the lease, in the next one."""
        now = time.time()
        names = (*META_COLUMNS, *checked_fields(read), "records_stamp") if read else ()
        returned = "".join(f", t.{name}" for name in names)
        # refused: another holds it (not free), or another waits first (queued); a refused
        # owner takes the waiter's place when it is empty, its own, or lapsed
        refused = """(s.lease_owner IS DISTINCT FROM %(owner)s AND (
            NOT (s.lease_owner IS NULL OR s.lease_owner = %(owner)s
                OR s.lease_owner IS NOT DISTINCT FROM %(replace)s
                OR s.lease_expires <= %(now)s)
            OR (s.lease_waiter IS NOT NULL AND s.lease_waiter <> %(owner)s
                AND s.lease_wait_until > %(now)s)))"""
        enqueue = """(s.lease_waiter IS NULL OR s.lease_waiter = %(owner)s
            OR s.lease_wait_until <= %(now)s)"""
        archived = "(%(active)s AND s.status = 'archived')"
        sql = f"""UPDATE {SESSIONS} AS t SET
            lease_owner = CASE WHEN d.kept THEN t.lease_owner ELSE %(owner)s END,
            lease_token = CASE WHEN d.kept THEN t.lease_token
                WHEN t.lease_owner = %(owner)s THEN t.lease_token
                ELSE t.lease_token + 1 END,
            lease_expires = CASE WHEN d.kept THEN t.lease_expires
                ELSE %(now)s + %(ttl)s END,
            lease_waiter = CASE
                WHEN d.archived THEN t.lease_waiter
                WHEN d.refused AND d.enqueue THEN %(owner)s
                WHEN NOT d.refused AND t.lease_waiter = %(owner)s THEN NULL
                ELSE t.lease_waiter END,
            lease_wait_until = CASE
                WHEN d.archived THEN t.lease_wait_until
                WHEN d.refused AND d.enqueue THEN %(now)s + %(waiter_ttl)s
                WHEN NOT d.refused AND t.lease_waiter = %(owner)s THEN 0
                ELSE t.lease_wait_until END
        FROM (SELECT s.id, {refused} AS refused, {enqueue} AS enqueue,
                {archived} AS archived, {refused} OR {archived} AS kept
            FROM {SESSIONS} s WHERE s.tree_id = %(tree)s AND s.id = %(sid)s) AS d
        WHERE t.tree_id = %(tree)s AND t.id = d.id
        RETURNING NOT d.kept, t.lease_token, d.archived{returned}"""
        params = {
            "owner": owner, "replace": replace, "now": now, "ttl": ttl,
            "active": refuse_archived is not None, "waiter_ttl": _WAITER_TTL,
            "tree": self.tree_id, "sid": session_id,
        }  # fmt: skip
        rows = (yield Query(sql, params, lock=self.key)).rows
        if not rows:
            raise SessionNotFoundError(session_id)
        taken, token, was_archived = rows[0][:3]
        if was_archived:
            raise SessionArchivedError(session_id, refuse_archived or "this operation")
        if not taken:
            return None
        lease = Lease(session_id, owner, int(token), now + ttl)
        cached = self.cache.get(session_id) if read else None
        if cached is None or cached[0] != rows[0][-1]:
            return lease, None
        try:
            meta, values = split_read(rows[0][3:-1])
        except Exception:  # the shell's read under the lease says what is wrong
            return lease, None
        return lease, (meta, values, cached[1])

    def commit_turn(self, args: CommitArgs, release: bool) -> Steps[int]:
        """`op_commit_turn` as one statement (in a transaction of its own outside the
        caller's: one round trip): it reads the session as it was
        (`lease_owner, lease_token, turn_count, records_stamp`) and, when it committed, the
        first seq and the new stamp; no row when the session is missing. Nothing is written
        unless the lease (if given) still holds the session and the session is not archived.
        """
        session_id, records, at, user_turn, turns, insight, lease = args
        sql = f"""WITH s AS (
            SELECT id, status, lease_owner, lease_token, turn_count, records_stamp
            FROM {SESSIONS} WHERE tree_id = %(tree)s AND id = %(sid)s
        ), ok AS (
            SELECT id FROM s WHERE status <> 'archived' AND (NOT %(checked)s
                OR (lease_owner IS NOT DISTINCT FROM %(owner)s AND lease_token = %(token)s))
        ), up AS (
            UPDATE {SESSIONS} AS t SET {_ADVANCE},
                insight = CASE WHEN t.insight = %(insight)s THEN NULL ELSE t.insight END,
                lease_owner = CASE WHEN %(release)s THEN NULL ELSE t.lease_owner END,
                lease_expires = CASE WHEN %(release)s THEN 0 ELSE t.lease_expires END
            FROM ok WHERE t.tree_id = %(tree)s AND t.id = ok.id
            RETURNING t.next_seq - %(count)s AS first, t.records_stamp AS stamp
        ), {_INSERT}
        SELECT s.lease_owner, s.lease_token, s.turn_count, s.records_stamp, up.first, up.stamp
        FROM s LEFT JOIN up ON TRUE"""
        params = {
            **_appended(self.tree_id, session_id, records, at, user_turn, turns),
            "checked": lease is not None, "owner": None if lease is None else lease.owner,
            "token": None if lease is None else lease.token, "insight": insight,
            "release": release and lease is not None,
        }  # fmt: skip
        rows = (yield Query(sql, params, lock=self.key)).rows
        if not rows:
            raise SessionNotFoundError(session_id)
        owner, token, turn_count, old_stamp, first, stamp = rows[0]
        if first is None:  # nothing written: say why
            if lease is not None and (owner != lease.owner or token != lease.token):
                raise LeaseLostError(session_id)
            raise SessionArchivedError(session_id, "a turn's records")
        self.committed(session_id, records, old_stamp, stamp)
        return int(turn_count or 0) + int(user_turn)

    def committed(
        self, session_id: str, records: list[EncodedMessage], old_stamp: int, stamp: int
    ) -> None:
        """Keep the record cache exact after `append` or `commit_records` added `records`."""
        if not records:
            return
        cached = self.cache.pop(session_id)
        if cached is not None and cached[0] == old_stamp:
            added = [decode_message(data) for _, data in records]
            self.cache.put(session_id, (stamp, [*cached[1], *added]))

    def release_lease(self, lease: Lease) -> Steps[bool]:
        """`op_release_lease` as one `UPDATE` (as `lease`): the lease freed if it holds the
        session, the next holder's place if its owner keeps it; whether the lease was."""
        sql = f"""UPDATE {SESSIONS} AS t SET
            lease_owner = CASE WHEN d.held THEN NULL ELSE t.lease_owner END,
            lease_expires = CASE WHEN d.held THEN 0 ELSE t.lease_expires END,
            lease_waiter = CASE WHEN d.waits THEN NULL ELSE t.lease_waiter END,
            lease_wait_until = CASE WHEN d.waits THEN 0 ELSE t.lease_wait_until END
        FROM (SELECT s.id, s.lease_owner IS NOT DISTINCT FROM %(owner)s
                AND s.lease_token = %(token)s AS held,
                s.lease_waiter IS NOT DISTINCT FROM %(owner)s AS waits
            FROM {SESSIONS} s WHERE s.tree_id = %(tree)s AND s.id = %(sid)s) AS d
        WHERE t.tree_id = %(tree)s AND t.id = d.id AND (d.held OR d.waits)
        RETURNING d.held"""
        params = {
            "owner": lease.owner, "token": lease.token,
            "tree": self.tree_id, "sid": lease.session_id,
        }  # fmt: skip
        rows = (yield Query(sql, params, lock=self.key)).rows
        return bool(rows and rows[0][0])

    def append_event(self, kind: str, session_id: str | None, payload: str, at: str) -> Steps[int]:
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

    def events_after(self, cursor: int, limit: int) -> Steps[list[EventRow]]:
        rows = (yield Query(EVENTS_AFTER, (self.tree_id, cursor, limit))).rows
        return [(int(c), kind, sid, payload, at) for c, kind, sid, payload, at in rows]

    def nodes(self, node_id: str | None, parent_id: str | None) -> Steps[list[TopologyNode]]:
        if node_id is not None:
            query = Query(GET_NODE, (self.tree_id, node_id))
        elif parent_id is not None:
            query = Query(CHILDREN, (self.tree_id, parent_id))
        else:
            query = Query(ALL_NODES, (self.tree_id,))
        return built(stored_node, (yield query).rows)

    def put_node(self, node: TopologyNode) -> Steps[None]:
        tree = self.tree_id
        yield Query(PUT_NODE, (tree, node.id, node.parent_id, node.label, tree))

    def get_global(self, key: str) -> Steps[str | None]:
        rows = (yield Query(GET_GLOBAL, (self.tree_id, key))).rows
        return None if not rows else str(rows[0][0])

    def put_global(self, key: str, value: str) -> Steps[None]:
        yield Query(PUT_GLOBAL, (self.tree_id, key, value))
