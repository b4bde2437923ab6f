"""`PostgresMainStorage`: the `MainStorage` of many worker processes, on one PostgreSQL database.

The same tables and semantics as `SqliteMainStorage` (see `_postgres_schema`), every query
scoped by `tree_id`, so many trees (one per user) share one database and never see each
other. Each primitive is written once, as the statements it runs (`_postgres_steps`), and
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

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

import psycopg
import psycopg_pool

import stello_graph.checkpoints._postgres_schema as _schema
from stello_graph._tree_text import TopologyText
from stello_graph.checkpoints._flows import _WAITER_TTL
from stello_graph.checkpoints._postgres_conn import (
    AsyncHooks,
    Link,
    SyncHooks,
    tree_lock_key,
)
from stello_graph.checkpoints._postgres_steps import EVENTS_CHANNEL, EventRow, Statements
from stello_graph.checkpoints._primitives import one
from stello_graph.checkpoints._serde import (
    EncodedMessage,
    MetaRow,
    RecordTurn,
    SessionRead,
)
from stello_graph.checkpoints._shell import BackendStorage
from stello_graph.checkpoints._validate import (
    CommitArgs,
    check_non_negative,
    check_tree_id,
    checked_lease,
    lease_args,
)
from stello_graph.checkpoints.backend import TransactionHooks
from stello_graph.digest import DigestRow
from stello_graph.errors import (
    InvalidInputError,
    LeaseLostError,
    SessionArchivedError,
    SessionNotFoundError,
    StorageError,
)
from stello_graph.lease import aread_leased, read_leased
from stello_graph.models import (
    Lease,
    SessionMeta,
    SessionRole,
    SessionStats,
    SessionStatus,
    TopologyNode,
)

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

    from stello_graph.checkpoints._postgres_saver import StelloPostgresSaver
    from stello_graph.checkpoints.backend import ExportPart, L2Row, RowSink
    from stello_graph.storage import SessionSnapshot

__all__ = ["EVENTS_CHANNEL", "PostgresMainStorage", "open_postgres"]

T = TypeVar("T")
_AtOnce = tuple[str, Any, Callable[[list[tuple[Any, ...]]], T]]
"""A statement, its parameters, and what makes the primitive's value of its rows."""


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
        check_tree_id(tree_id)  # before a connection is opened, not after
        cache_size = check_non_negative(record_cache_size, "record_cache_size")
        self._steps = Statements(tree_id, cache_size)
        for name, value in (("connect_timeout", connect_timeout), ("lock_timeout", lock_timeout)):
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise InvalidInputError(f"{name} must be a positive number, got {value!r}.")
        self._link = Link(conninfo, connect_timeout=connect_timeout, lock_timeout=lock_timeout)
        key = self._key = tree_lock_key(tree_id)
        self._hooks = SyncHooks(self._link, key)
        self._ahooks = AsyncHooks(self._link, key)
        self.conninfo = self._link.conninfo
        """The connection string the storage (and `open_checkpointer`) connects with."""
        self._closed = False
        super().__init__(self, tree_id=tree_id)  # its own `StorageBackend`
        try:
            _schema.migrate(self._link)
        except BaseException:
            self._link.close()
            self._closed = True
            raise

    def close(self) -> None:
        """Close the connections the storage opened (waits for a running transaction)."""
        if not self._closed:
            self._txn.close(self._release)

    def _release(self) -> None:
        self._closed = True
        self._steps.cache.clear()
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

    # -- the lease and a turn's commit, each in one round trip ------------------------------
    def acquire_lease(
        self, session_id: str, owner: str, ttl: float, *, replace: str | None = None
    ) -> Lease | None:
        """Take (or renew) the session's lease for `ttl` seconds; `None` if another holds it.

        As `BackendStorage.acquire_lease` (the same rules: free, taken over from `replace`,
        the first refused owner queued), decided by one `UPDATE` sent with its transaction
        in one round trip, instead of a read and a write (four): a turn takes and gives back
        its lease every time. Inside a transaction of the caller, the shell's own path runs.

        Raises:
            SessionNotFoundError: no such session.
        """
        if self._txn.owns():
            return super().acquire_lease(session_id, owner, ttl, replace=replace)
        args = lease_args(session_id, owner, ttl, replace)
        lease: Lease | None = self._txn.read(one(PostgresMainStorage.op_acquire_at_once, *args))
        return lease

    async def aacquire_lease(
        self, session_id: str, owner: str, ttl: float, *, replace: str | None = None
    ) -> Lease | None:
        """Async twin of `acquire_lease` (one round trip too)."""
        if self._txn.owns():
            return await super().aacquire_lease(session_id, owner, ttl, replace=replace)
        args = lease_args(session_id, owner, ttl, replace)
        lease: Lease | None = await self._txn.aread(
            one(PostgresMainStorage.op_acquire_at_once, *args)
        )
        return lease

    def _lease_session(
        self, args: tuple[str, str, float, str | None], operation: str
    ) -> tuple[Lease, SessionSnapshot] | None:
        """`lease_session` in two round trips: the lease's `UPDATE`, which refuses an
        archived session without taking it, then the session's read under the lease (the
        shell's flow takes five). Inside a transaction of the caller, the shell's flow."""
        if self._txn.owns():
            return super()._lease_session(args, operation)
        lease: Lease | None = self._txn.read(
            one(PostgresMainStorage.op_acquire_at_once, *args, operation)
        )
        return None if lease is None else (lease, read_leased(self, lease, operation))

    async def _alease_session(
        self, args: tuple[str, str, float, str | None], operation: str
    ) -> tuple[Lease, SessionSnapshot] | None:
        """Async twin of `_lease_session` (two round trips too)."""
        if self._txn.owns():
            return await super()._alease_session(args, operation)
        lease: Lease | None = await self._txn.aread(
            one(PostgresMainStorage.op_acquire_at_once, *args, operation)
        )
        return None if lease is None else (lease, await aread_leased(self, lease, operation))

    def _acquire_at_once(
        self,
        session_id: str,
        owner: str,
        ttl: float,
        replace: str | None,
        refuse_archived: str | None = None,
    ) -> _AtOnce[Lease | None]:
        """The lease's one `UPDATE`; with `refuse_archived` (the operation refused), an
        archived session raises `SessionArchivedError` and is left as it was."""
        now = time.time()
        active = refuse_archived is not None
        sql, params = self._steps.acquire_lease(
            session_id, owner, now, ttl, replace, _WAITER_TTL, active=active
        )

        def done(rows: list[tuple[Any, ...]]) -> Lease | None:
            if not rows:
                raise SessionNotFoundError(session_id)
            taken, token, archived = rows[0]
            if archived:
                raise SessionArchivedError(session_id, refuse_archived or "this operation")
            return Lease(session_id, owner, int(token), now + ttl) if taken else None

        return sql, params, done

    def release_lease(self, lease: Lease) -> bool:
        """Free the session if `lease` still holds it; `True` if it did (one round trip,
        as `acquire_lease`; a second one when it did not, to free a waiting place)."""
        if self._txn.owns():
            return super().release_lease(lease)
        released: bool = self._txn.read(
            one(PostgresMainStorage.op_release_at_once, checked_lease(lease))
        )
        # not held: the shell's flow, which also frees a waiting place the owner kept
        return released or super().release_lease(lease)

    async def arelease_lease(self, lease: Lease) -> bool:
        """Async twin of `release_lease`."""
        if self._txn.owns():
            return await super().arelease_lease(lease)
        released: bool = await self._txn.aread(
            one(PostgresMainStorage.op_release_at_once, checked_lease(lease))
        )
        return released or await super().arelease_lease(lease)

    def _release_at_once(self, lease: Lease) -> _AtOnce[bool]:
        sql, params = self._steps.release_lease(lease.session_id, lease.owner, lease.token)
        return sql, params, bool

    def _commit_records(self, args: CommitArgs, release: bool) -> int:
        """A turn's commit as one statement sent with its transaction in one round trip (the
        shell's flow takes six); inside a transaction of the caller, the shell's flow."""
        if self._txn.owns():
            return super()._commit_records(args, release)
        turns: int = self._txn.read(one(PostgresMainStorage.op_commit_at_once, args, release))
        return turns

    async def _acommit_records(self, args: CommitArgs, release: bool) -> int:
        """Async twin of `_commit_records` (one round trip too)."""
        if self._txn.owns():
            return await super()._acommit_records(args, release)
        turns: int = await self._txn.aread(
            one(PostgresMainStorage.op_commit_at_once, args, release)
        )
        return turns

    def _commit_at_once(self, args: CommitArgs, release: bool) -> _AtOnce[int]:
        session_id, records, _, user_turn, _, _, lease = args
        sql, params = self._steps.commit_records(args, release)

        def done(rows: list[tuple[Any, ...]]) -> int:
            if not rows:
                raise SessionNotFoundError(session_id)
            owner, token, turn_count, old_stamp, first, stamp = rows[0]
            if first is None:  # nothing written: say why, as the shell's flow would
                if lease is not None and (owner != lease.owner or token != lease.token):
                    raise LeaseLostError(session_id)
                raise SessionArchivedError(session_id, "a turn's records")
            self._steps.committed(session_id, records, old_stamp, stamp)
            return int(turn_count or 0) + int(user_turn)

        return sql, params, done

    # the primitives the three run as (`one(...)` flows): a statement in its own
    # transaction, one round trip, on either side
    def op_acquire_at_once(self, *args: Any) -> Lease | None:
        return self._at_once(self._acquire_at_once(*args))

    async def aop_acquire_at_once(self, *args: Any) -> Lease | None:
        return await self._aat_once(self._acquire_at_once(*args))

    def op_release_at_once(self, lease: Lease) -> bool:
        return self._at_once(self._release_at_once(lease))

    async def aop_release_at_once(self, lease: Lease) -> bool:
        return await self._aat_once(self._release_at_once(lease))

    def op_commit_at_once(self, args: CommitArgs, release: bool) -> int:
        return self._at_once(self._commit_at_once(args, release))

    async def aop_commit_at_once(self, args: CommitArgs, release: bool) -> int:
        return await self._aat_once(self._commit_at_once(args, release))

    def _at_once(self, call: _AtOnce[T]) -> T:
        sql, params, done = call
        return done(self._link.atomic(self._key, sql, params).rows)

    async def _aat_once(self, call: _AtOnce[T]) -> T:
        sql, params, done = call
        return done((await self._link.aatomic(self._key, sql, params)).rows)

    # -- sync primitives ------------------------------------------------------------------
    def op_put_session(self, row: MetaRow) -> None:
        self._link.drive(self._steps.put_session(row))

    def op_list_sessions(
        self, status: SessionStatus | None, role: SessionRole | None
    ) -> list[SessionMeta]:
        return self._link.drive(self._steps.list_sessions(status, role))

    def op_session_stats(self) -> list[SessionStats]:
        return self._link.drive(self._steps.session_stats())

    def op_get_fields(self, session_id: str, names: Sequence[str]) -> tuple[Any, ...] | None:
        return self._link.drive(self._steps.get_fields(session_id, names))

    def op_read_session(
        self, session_id: str, names: Sequence[str], records: bool
    ) -> SessionRead | None:
        return self._link.drive(self._steps.read_session(session_id, names, records))

    def op_all_fields(self, names: Sequence[str]) -> list[tuple[Any, ...]]:
        return self._link.drive(self._steps.all_fields(names))

    def op_digests(self) -> list[DigestRow]:
        return self._link.drive(self._steps.digests())

    def op_l2s_after(self, after: int, limit: int) -> list[L2Row]:
        return cast("list[L2Row]", self._link.drive(self._steps.l2s_after(after, limit)))

    def op_export_rows(self, part: ExportPart, sink: RowSink) -> int:
        # one statement; its rows arrive whole (no server-side cursor yet), then go one by one
        return _sunk(self._link.drive(self._steps.export_rows(part)), sink)

    def op_set_fields(self, session_id: str, values: dict[str, Any]) -> None:
        self._link.drive(self._steps.set_fields(session_id, values))

    def op_delete_sessions(self, session_ids: list[str]) -> None:
        self._link.drive(self._steps.delete_sessions(session_ids))

    def op_append(
        self,
        session_id: str,
        records: list[EncodedMessage],
        at: str,
        user_turn: bool,
        turns: list[RecordTurn],
    ) -> int:
        return self._link.drive(self._steps.append(session_id, records, at, user_turn, turns))

    def op_has_turn(self, session_id: str, turn_id: str) -> bool:
        return self._link.drive(self._steps.has_turn(session_id, turn_id))

    def op_turns(self, session_id: str) -> list[RecordTurn]:
        return self._link.drive(self._steps.turns(session_id))

    def op_records(self, session_id: str) -> Sequence[BaseMessage]:
        return self._link.drive(self._steps.records(session_id))

    def op_count(self, session_id: str) -> int:
        return self._link.drive(self._steps.count(session_id))

    def op_drop_oldest(self, session_id: str, count: int) -> None:
        self._link.drive(self._steps.drop_oldest(session_id, count))

    def op_copy_records(self, source_id: str, target_id: str, count: int) -> int:
        return self._link.drive(self._steps.copy_records(source_id, target_id, count))

    def op_append_event(self, kind: str, session_id: str | None, payload: str, at: str) -> int:
        return self._link.drive(self._steps.append_event(kind, session_id, payload, at))

    def op_events_after(self, cursor: int, limit: int) -> list[EventRow]:
        return self._link.drive(self._steps.events_after(cursor, limit))

    def op_get_node(self, node_id: str) -> TopologyNode | None:
        return self._link.drive(self._steps.get_node(node_id))

    def op_put_node(self, node: TopologyNode) -> None:
        self._link.drive(self._steps.put_node(node))

    def op_children(self, parent_id: str) -> list[TopologyNode]:
        return self._link.drive(self._steps.children(parent_id))

    def op_all_nodes(self) -> list[TopologyNode]:
        return self._link.drive(self._steps.all_nodes())

    def op_topology_text(self) -> TopologyText | None:
        try:
            return self._link.drive(self._steps.topology_text())
        except StorageError as exc:
            return self._too_long(exc)

    def op_get_global(self, key: str) -> str | None:
        return self._link.drive(self._steps.get_global(key))

    def op_put_global(self, key: str, value: str) -> None:
        self._link.drive(self._steps.put_global(key, value))

    # -- async primitives (native: psycopg's AsyncConnection) -----------------------------
    async def aop_put_session(self, row: MetaRow) -> None:
        await self._link.adrive(self._steps.put_session(row))

    async def aop_list_sessions(
        self, status: SessionStatus | None, role: SessionRole | None
    ) -> list[SessionMeta]:
        return await self._link.adrive(self._steps.list_sessions(status, role))

    async def aop_session_stats(self) -> list[SessionStats]:
        return await self._link.adrive(self._steps.session_stats())

    async def aop_get_fields(self, session_id: str, names: Sequence[str]) -> tuple[Any, ...] | None:
        return await self._link.adrive(self._steps.get_fields(session_id, names))

    async def aop_read_session(
        self, session_id: str, names: Sequence[str], records: bool
    ) -> SessionRead | None:
        return await self._link.adrive(self._steps.read_session(session_id, names, records))

    async def aop_all_fields(self, names: Sequence[str]) -> list[tuple[Any, ...]]:
        return await self._link.adrive(self._steps.all_fields(names))

    async def aop_digests(self) -> list[DigestRow]:
        return await self._link.adrive(self._steps.digests())

    async def aop_l2s_after(self, after: int, limit: int) -> list[L2Row]:
        return cast("list[L2Row]", await self._link.adrive(self._steps.l2s_after(after, limit)))

    async def aop_export_rows(self, part: ExportPart, sink: RowSink) -> int:
        return _sunk(await self._link.adrive(self._steps.export_rows(part)), sink)

    async def aop_set_fields(self, session_id: str, values: dict[str, Any]) -> None:
        await self._link.adrive(self._steps.set_fields(session_id, values))

    async def aop_delete_sessions(self, session_ids: list[str]) -> None:
        await self._link.adrive(self._steps.delete_sessions(session_ids))

    async def aop_append(
        self,
        session_id: str,
        records: list[EncodedMessage],
        at: str,
        user_turn: bool,
        turns: list[RecordTurn],
    ) -> int:
        return await self._link.adrive(
            self._steps.append(session_id, records, at, user_turn, turns)
        )

    async def aop_has_turn(self, session_id: str, turn_id: str) -> bool:
        return await self._link.adrive(self._steps.has_turn(session_id, turn_id))

    async def aop_turns(self, session_id: str) -> list[RecordTurn]:
        return await self._link.adrive(self._steps.turns(session_id))

    async def aop_records(self, session_id: str) -> Sequence[BaseMessage]:
        return await self._link.adrive(self._steps.records(session_id))

    async def aop_count(self, session_id: str) -> int:
        return await self._link.adrive(self._steps.count(session_id))

    async def aop_drop_oldest(self, session_id: str, count: int) -> None:
        await self._link.adrive(self._steps.drop_oldest(session_id, count))

    async def aop_copy_records(self, source_id: str, target_id: str, count: int) -> int:
        return await self._link.adrive(self._steps.copy_records(source_id, target_id, count))

    async def aop_append_event(
        self, kind: str, session_id: str | None, payload: str, at: str
    ) -> int:
        return await self._link.adrive(self._steps.append_event(kind, session_id, payload, at))

    async def aop_events_after(self, cursor: int, limit: int) -> list[EventRow]:
        return await self._link.adrive(self._steps.events_after(cursor, limit))

    async def aop_get_node(self, node_id: str) -> TopologyNode | None:
        return await self._link.adrive(self._steps.get_node(node_id))

    async def aop_put_node(self, node: TopologyNode) -> None:
        await self._link.adrive(self._steps.put_node(node))

    async def aop_children(self, parent_id: str) -> list[TopologyNode]:
        return await self._link.adrive(self._steps.children(parent_id))

    async def aop_all_nodes(self) -> list[TopologyNode]:
        return await self._link.adrive(self._steps.all_nodes())

    async def aop_topology_text(self) -> TopologyText | None:
        try:
            return await self._link.adrive(self._steps.topology_text())
        except StorageError as exc:
            return self._too_long(exc)

    def _too_long(self, exc: StorageError) -> TopologyText | None:
        """`None` (`topology_parts` then) for a tree's text longer than PostgreSQL's longest
        value (1 GB), read outside a transaction; inside one, the failed statement has
        aborted the transaction, and `exc` is raised."""
        limit = isinstance(exc.__cause__, psycopg.errors.ProgramLimitExceeded)
        if not limit or self._link.txn is not None or self._link.atxn is not None:
            raise exc
        return None

    async def aop_get_global(self, key: str) -> str | None:
        return await self._link.adrive(self._steps.get_global(key))

    async def aop_put_global(self, key: str, value: str) -> None:
        await self._link.adrive(self._steps.put_global(key, value))

    # -- LangGraph ------------------------------------------------------------------------
    def open_checkpointer(self) -> StelloPostgresSaver:
        """A LangGraph `PostgresSaver` on the same database (its tables set up); the agent
        opens one this way when given this storage and no checkpointer."""
        from stello_graph.checkpoints._postgres_saver import postgres_saver

        return postgres_saver(self.conninfo)


def _sunk(rows: list[tuple[Any, ...]], sink: RowSink) -> int:
    """Hand `rows` to `sink` one by one; how many."""
    for row in rows:
        sink(row)
    return len(rows)


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
