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

from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import psycopg
import psycopg_pool

import stello_graph.checkpoints._postgres_schema as _schema
from stello_graph._flow import arun, run
from stello_graph._tree_text import TopologyText
from stello_graph.checkpoints._postgres_conn import AsyncHooks, Link, Steps, SyncHooks
from stello_graph.checkpoints._postgres_steps import EVENTS_CHANNEL, Statements
from stello_graph.checkpoints._shell import BackendStorage
from stello_graph.checkpoints._validate import (
    check_non_negative,
    check_tree_id,
)
from stello_graph.checkpoints.backend import TransactionHooks
from stello_graph.errors import InvalidInputError, StorageError

if TYPE_CHECKING:
    from stello_graph.checkpoints._postgres_saver import StelloPostgresSaver

__all__ = ["EVENTS_CHANNEL", "PostgresMainStorage", "open_postgres"]

T = TypeVar("T")
P = ParamSpec("P")


def _primitive(
    steps: Callable[Concatenate[Statements, P], Steps[T]],
) -> tuple[
    Callable[Concatenate[PostgresMainStorage, P], T],
    Callable[Concatenate[PostgresMainStorage, P], Coroutine[Any, Any, T]],
]:
    """The `op_` primitive that runs the statements of `steps` (a method of `Statements`) on
    a sync connection, and its `aop_` twin that runs them on the loop's async one."""

    def op(storage: PostgresMainStorage, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return run(steps(storage._steps, *args, **kwargs), storage._link)

    async def aop(storage: PostgresMainStorage, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await arun(steps(storage._steps, *args, **kwargs), storage._link)

    for twin, prefix in ((op, "op_"), (aop, "aop_")):
        twin.__name__ = f"{prefix}{steps.__name__}"  # the name a flow's `Op` calls it by
        twin.__qualname__ = f"PostgresMainStorage.{twin.__name__}"
    return op, aop


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
        self._hooks = SyncHooks(self._link, self._steps.key)
        self._ahooks = AsyncHooks(self._link, self._steps.key)
        self.conninfo = self._link.conninfo
        """The connection string the storage (and `open_checkpointer`) connects with."""
        super().__init__(self, tree_id=tree_id)  # its own `StorageBackend`
        try:
            _schema.migrate(self._link)
        except BaseException:
            self._link.close()
            raise

    def close(self) -> None:
        """Close the connections the storage opened (waits for a running transaction)."""
        if not self._link.closed:
            self._txn.close(self._release)

    def _release(self) -> None:
        self._steps.cache.clear()
        self._link.close()

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

    # the primitives, each a `Statements` generator run on either side; the lease and the
    # commit are one statement each, in a transaction of its own outside the caller's
    op_lease, aop_lease = _primitive(Statements.lease)
    op_release_lease, aop_release_lease = _primitive(Statements.release_lease)
    op_commit_turn, aop_commit_turn = _primitive(Statements.commit_turn)
    op_put_session, aop_put_session = _primitive(Statements.put_session)
    op_list_sessions, aop_list_sessions = _primitive(Statements.list_sessions)
    op_session_stats, aop_session_stats = _primitive(Statements.session_stats)
    op_read_session, aop_read_session = _primitive(Statements.read_session)
    op_all_fields, aop_all_fields = _primitive(Statements.all_fields)
    op_digests, aop_digests = _primitive(Statements.digests)
    op_l2s_after, aop_l2s_after = _primitive(Statements.l2s_after)
    op_export_rows, aop_export_rows = _primitive(Statements.export_rows)
    op_set_fields, aop_set_fields = _primitive(Statements.set_fields)
    op_delete_sessions, aop_delete_sessions = _primitive(Statements.delete_sessions)
    op_append, aop_append = _primitive(Statements.append)
    op_has_turn, aop_has_turn = _primitive(Statements.has_turn)
    op_turns, aop_turns = _primitive(Statements.turns)
    op_records, aop_records = _primitive(Statements.records)
    op_count, aop_count = _primitive(Statements.count)
    op_drop_oldest, aop_drop_oldest = _primitive(Statements.drop_oldest)
    op_copy_records, aop_copy_records = _primitive(Statements.copy_records)
    op_append_event, aop_append_event = _primitive(Statements.append_event)
    op_events_after, aop_events_after = _primitive(Statements.events_after)
    op_nodes, aop_nodes = _primitive(Statements.nodes)
    op_put_node, aop_put_node = _primitive(Statements.put_node)
    op_get_global, aop_get_global = _primitive(Statements.get_global)
    op_put_global, aop_put_global = _primitive(Statements.put_global)

    def _topology_text(self) -> Steps[TopologyText | None]:
        """The tree's text; `None` (`topology_parts` then) for one longer than PostgreSQL's
        longest value (1 GB), read outside a transaction; inside one, the failed statement
        has aborted the transaction, and the error is raised."""
        try:
            return (yield from self._steps.topology_text())
        except StorageError as exc:
            limit = isinstance(exc.__cause__, psycopg.errors.ProgramLimitExceeded)
            if not limit or self._link.txn is not None or self._link.atxn is not None:
                raise
            return None

    def op_topology_text(self) -> TopologyText | None:
        return run(self._topology_text(), self._link)

    async def aop_topology_text(self) -> TopologyText | None:
        return await arun(self._topology_text(), self._link)

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
