"""Connections and transactions of `PostgresMainStorage` (sync and native async).

A storage talks to PostgreSQL through a `Link`: sync calls run on a psycopg `Connection` (the
storage's own, opened from a DSN, or one taken from a `ConnectionPool` for each call or
transaction), async calls on a psycopg `AsyncConnection` of their own per event loop (an
async connection belongs to the loop it was made on). Every connection is in autocommit
mode; a write transaction is explicit:

    BEGIN ISOLATION LEVEL READ COMMITTED; SELECT pg_advisory_xact_lock(<key of the tree>)

so the writes to one tree are serialised across connections and processes, as SQLite's
`BEGIN IMMEDIATE` serialises them in one file, while other trees never wait. READ COMMITTED
(not REPEATABLE READ) because the snapshot must be taken *after* the lock is granted: each
statement then sees everything committed by the previous holder. Nested transactions are
savepoints.

A statement always runs on the connection of the open transaction, whichever side (sync or
async) opened it: a sync call made from a worker thread inside an async transaction is run on
that transaction's loop.

Errors: a lost or refused connection is `StorageUnavailableError` (the server rolls back the
unfinished transaction, so nothing partial is stored; the next call reconnects); any other
database error is `StorageError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import select
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
import psycopg_pool
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict

from stello_graph._cancelled import running_loop
from stello_graph._flow import Call, arun, run
from stello_graph.errors import InvalidInputError, StorageError, StorageUnavailableError

__all__ = [
    "AsyncHooks",
    "Link",
    "Query",
    "Result",
    "Steps",
    "SyncHooks",
    "tree_lock_key",
]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Query:
    """One statement and its parameters."""

    sql: str
    params: Sequence[Any] | dict[str, Any] = ()
    lock: int | None = None
    """With the advisory lock key of a tree, the statement runs in the open transaction, or
    outside one in a write transaction of its own holding that lock, in one round trip
    (`Link.execute`)."""

    def run(self, link: Link) -> Result:
        return link.execute(self)

    async def arun(self, link: Link) -> Result:
        return await link.aexecute(self)


@dataclass(frozen=True, slots=True)
class Result:
    """The rows a statement returned (empty for none) and the rows it changed."""

    rows: list[tuple[Any, ...]]
    rowcount: int


Steps = Generator[Query, Result, T]
"""A primitive written once: it yields statements, is sent their results, returns its value;
`_flow.run` runs it on a `Link`'s sync connections, `_flow.arun` on its async ones."""


def tree_lock_key(tree_id: str) -> int:
    """The 64-bit advisory lock key of a tree (signed, as PostgreSQL's bigint)."""
    digest = hashlib.blake2b(f"stello-tree\x00{tree_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def describe(conninfo: str) -> str:
    """The database a conninfo names, for messages, without its password.

    Raises:
        InvalidInputError: `conninfo` is not a connection string or URL.
    """
    try:
        parts = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as exc:
        raise InvalidInputError(
            f"Not a PostgreSQL connection string: {exc}. Pass a URL such as "
            "'postgresql://user@host:5432/dbname' or 'host=... dbname=...'."
        ) from exc
    host = parts.get("host") or parts.get("hostaddr") or "localhost"
    port = f":{parts['port']}" if parts.get("port") else ""
    user = f"{parts['user']}@" if parts.get("user") else ""
    return f"'postgresql://{user}{host}{port}/{parts.get('dbname') or ''}'"


def hung_up(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether the server ended an idle connection: its socket is readable though nothing was
    asked (the server's goodbye before it closes, on a restart or a terminated backend). Such
    a connection is replaced before use, so a restart between calls costs no failed call. A
    connection in a transaction, or already known lost, is left to the caller."""
    if conn.closed or conn.broken:
        return True
    if conn.info.transaction_status != pq.TransactionStatus.IDLE:
        return False
    try:
        return bool(select.select([conn.fileno()], [], [], 0)[0])
    except (OSError, ValueError, psycopg.Error):
        return True


def check_idle(conn: psycopg.Connection[Any]) -> None:
    """A pool's `check`: refuse a connection the server ended while it was idle (`hung_up`),
    closed, so that the pool drops it rather than keeping it."""
    if hung_up(conn):
        conn.close()
        raise psycopg.OperationalError("the server ended the connection while it was idle")


class Link:
    """The storage's connections, the open transaction, and the statements run on them."""

    def __init__(
        self,
        target: str | psycopg_pool.ConnectionPool[Any],
        *,
        connect_timeout: float,
        lock_timeout: float,
    ) -> None:
        if isinstance(target, psycopg_pool.ConnectionPool):
            self.pool: psycopg_pool.ConnectionPool[Any] | None = target
            # a pool's conninfo and kwargs may be functions (credentials that rotate)
            conninfo, found = target.conninfo, target.kwargs
            self.conninfo: str = conninfo() if callable(conninfo) else conninfo
            kwargs = dict((found() if callable(found) else found) or {})
        elif isinstance(target, str):
            self.pool, self.conninfo, kwargs = None, target, {}
        else:
            raise InvalidInputError(
                "conninfo must be a connection string or a psycopg_pool.ConnectionPool, "
                f"got {type(target).__name__}."
            )
        self.where = describe(self.conninfo)
        kwargs.pop("row_factory", None)
        kwargs.update(autocommit=True, connect_timeout=max(1, round(connect_timeout)))
        self._kwargs = kwargs
        self.lock_ms = max(1, int(lock_timeout * 1000))
        self._own: psycopg.Connection[Any] | None = None
        self.closed = False
        """Set by `close()`: a call made afterwards runs on a connection of its own, closed
        when it returns (nothing is left open by a storage used after `close()`)."""
        self._aconns: dict[int, tuple[asyncio.AbstractEventLoop, psycopg.AsyncConnection[Any]]] = {}
        self.txn: psycopg.Connection[Any] | None = None
        """The connection of the open sync transaction."""
        self.atxn: tuple[asyncio.AbstractEventLoop, psycopg.AsyncConnection[Any]] | None = None
        """The loop and connection of the open async transaction."""

    # -- connections ----------------------------------------------------------------------
    def acquire(self) -> psycopg.Connection[Any]:
        """A sync connection: the storage's own (reconnected if lost), or one of the pool."""
        if self.pool is not None:
            conn = self._from_pool(self.pool)
            if conn.info.transaction_status == pq.TransactionStatus.IDLE and not conn.autocommit:
                conn.autocommit = True
            return conn
        if self.closed:
            return self._connect()
        if self._own is None or hung_up(self._own):
            if self._own is not None:
                self._own.close()
            self._own = self._connect()
        return self._own

    def _from_pool(self, pool: psycopg_pool.ConnectionPool[Any]) -> psycopg.Connection[Any]:
        """A connection of `pool` the server has not ended (one it ended is given back
        closed, which the pool drops; at most `max_size` of them)."""
        for _ in range(pool.max_size + 1):
            try:
                conn: psycopg.Connection[Any] = pool.getconn()
            except psycopg_pool.PoolTimeout as exc:
                raise StorageUnavailableError(
                    f"No connection to PostgreSQL at {self.where} from the pool: {exc}"
                ) from exc
            if not hung_up(conn):
                return conn
            conn.close()
            pool.putconn(conn)
        raise StorageUnavailableError(
            f"Every connection of the pool to PostgreSQL at {self.where} was ended by the "
            "server. Nothing was stored; retry once the server is back."
        )

    def release(self, conn: psycopg.Connection[Any]) -> None:
        """Give back a connection from `acquire` (a lost one is dropped)."""
        if self.pool is not None:
            self.pool.putconn(conn)
        elif conn is not self._own:  # a call after `close()`
            conn.close()
        elif conn.broken:
            conn.close()
            self._own = None

    async def aacquire(self) -> psycopg.AsyncConnection[Any]:
        """The async connection of the running loop (made, or remade if lost)."""
        loop = asyncio.get_running_loop()
        for key, (old, stale) in list(self._aconns.items()):
            if old.is_closed():  # its tasks are gone: libpq closes it, no loop to await on
                del self._aconns[key]
                stale.pgconn.finish()
        found = self._aconns.get(id(loop))
        if found is not None and found[0] is loop:
            if not hung_up(found[1]):
                return found[1]
            found[1].pgconn.finish()  # idle and ended by the server: nothing to await
        conn = await self._aconnect()
        self._aconns[id(loop)] = (loop, conn)
        return conn

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(self.conninfo, **self._kwargs)
        except psycopg.Error as exc:
            raise self._unavailable(exc) from exc

    async def _aconnect(self) -> psycopg.AsyncConnection[Any]:
        try:
            return await psycopg.AsyncConnection.connect(self.conninfo, **self._kwargs)
        except psycopg.Error as exc:
            raise self._unavailable(exc) from exc

    def _unavailable(self, exc: BaseException) -> StorageUnavailableError:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return StorageUnavailableError(
            f"Cannot connect to PostgreSQL at {self.where}: {reason}. Check the address, "
            "the credentials and that the server is running."
        )

    def close(self) -> None:
        """Close the connections the storage opened (not the pool given)."""
        self.closed = True
        if self._own is not None:
            self._own.close()
            self._own = None
        for _, conn in self._aconns.values():
            # idle (the storage's lock is held): libpq closes it without awaiting its loop
            conn.pgconn.finish()
        self._aconns.clear()

    # -- statements -----------------------------------------------------------------------
    def error(
        self, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], exc: psycopg.Error
    ) -> StorageError:
        """The typed error of a failed statement."""
        if conn.broken or conn.closed:
            return StorageUnavailableError(
                f"The connection to PostgreSQL at {self.where} was lost ({exc}). Nothing of "
                "the unfinished transaction was stored; retry the operation."
            )
        if isinstance(exc, psycopg.errors.LockNotAvailable):
            return StorageError(
                f"The tree stayed locked by another connection for {self.lock_ms} ms "
                f"(PostgreSQL at {self.where}): {exc}"
            )
        return StorageError(f"PostgreSQL failed at {self.where}: {exc}")

    def run(self, conn: psycopg.Connection[Any], query: Query, skip: int = 0) -> Result:
        return run(self._ran(conn, conn.execute, query, skip=skip), self)

    async def arun(self, conn: psycopg.AsyncConnection[Any], query: Query, skip: int = 0) -> Result:
        return await arun(self._ran(conn, conn.execute, query, skip=skip), self)

    def _ran(
        self, conn: Any, execute: Any, query: Query, *, script: bool = False, skip: int = 0
    ) -> Generator[Call, Any, Result]:
        """The steps of `query` run by `execute` (a method of `conn`, either side's, or of
        a client-side cursor of it), the rows of its result after the first `skip` of a
        multi-statement one; as a `script` (a locked statement outside a transaction):
        `BEGIN`, the lock of `query.lock`, the statement and `COMMIT`, rolled back if it
        fails."""
        sql = query.sql
        if script:
            assert query.lock is not None
            sql, skip = f"{self.begin_sql(query.lock, wait=True)}; {sql}; COMMIT", 3
        try:
            cur = yield Call(execute, execute, (sql, _params(query.params)))
            for _ in range(skip):  # BEGIN, SET LOCAL, the lock of `begin_sql`: then the result
                cur.nextset()
            rows = _rows((yield Call(cur.fetchall, cur.fetchall))) if cur.description else []
            return Result(rows, cur.rowcount)
        except psycopg.Error as exc:
            if script:
                yield from _rolled_back(conn)
            raise self.error(conn, exc) from exc

    def execute(self, query: Query) -> Result:
        """Run a statement: in the open transaction (either side's), else on its own; one
        with a `lock`, outside a transaction, in a write transaction of its own holding that
        lock, in one round trip: `BEGIN`, the lock, the statement and `COMMIT` are sent as
        one script, its parameters bound on the client.

        A statement that fails leaves the transaction aborted: it is rolled back, nothing of
        it is stored, and the error is raised typed.
        """
        if self.atxn is not None:
            loop, aconn = self.atxn
            if running_loop() is loop:
                raise StorageError(
                    "A sync storage method was called on the event loop inside its own "
                    "`atransaction()`: await the async twin (`aget_session`, ...) instead."
                )
            return asyncio.run_coroutine_threadsafe(self.arun(aconn, query), loop).result()
        if self.txn is not None:
            return self.run(self.txn, query)
        conn = self.acquire()
        try:
            if query.lock is None:
                return self.run(conn, query)
            with psycopg.ClientCursor(conn) as cur:
                return run(self._ran(conn, cur.execute, query, script=True), self)
        finally:
            self.release(conn)

    async def aexecute(self, query: Query) -> Result:
        """The async twin of `execute`, on the running loop's connection."""
        if self.txn is not None:  # a sync transaction of this thread, under a nested loop
            return self.run(self.txn, query)
        if self.atxn is not None:
            loop, aconn = self.atxn
            if loop is asyncio.get_running_loop():
                return await self.arun(aconn, query)
            future = asyncio.run_coroutine_threadsafe(self.arun(aconn, query), loop)
            return await asyncio.wrap_future(future)
        own = await self._aconnect() if self.closed else None  # a call after `close()`
        conn = own if own is not None else await self.aacquire()
        try:
            if query.lock is None:
                return await self.arun(conn, query)
            async with psycopg.AsyncClientCursor(conn) as cur:
                return await arun(self._ran(conn, cur.execute, query, script=True), self)
        finally:
            if own is not None:
                await own.close()

    # -- transactions ---------------------------------------------------------------------
    def begin_sql(self, key: int, *, wait: bool) -> str:
        lock = "pg_advisory_xact_lock" if wait else "pg_try_advisory_xact_lock"
        return (
            "BEGIN ISOLATION LEVEL READ COMMITTED; "
            f"SET LOCAL lock_timeout = {self.lock_ms}; SELECT {lock}({int(key)})"
        )


# PostgreSQL's text cannot hold NUL, which SQLite's (and Python's) can. A text holding NUL,
# or starting with the marker \x01, is stored as the marker then the text with \x01 -> \x01\x02
# and NUL -> \x01\x03: deterministic and injective (ids still compare equal), and a no-op for
# every other text.
_MARK = "\x01"
_UNESCAPES = re.compile("\x01([\x02\x03])")


def escape_text(value: str) -> str:
    """`value` as stored in a text column (see above)."""
    if "\x00" not in value and not value.startswith(_MARK):
        return value
    return _MARK + value.replace(_MARK, "\x01\x02").replace("\x00", "\x01\x03")


def unescape_text(value: str) -> str:
    """The text `escape_text` stored as `value`."""
    if not value.startswith(_MARK):
        return value
    return _UNESCAPES.sub(lambda m: _MARK if m.group(1) == "\x02" else "\x00", value[1:])


def _param(value: Any) -> Any:
    if isinstance(value, str):
        return escape_text(value)
    if isinstance(value, list):
        return [escape_text(item) if isinstance(item, str) else item for item in value]
    return value


def _params(params: Sequence[Any] | dict[str, Any]) -> Any:
    if not params:
        return None
    if isinstance(params, dict):
        return {name: _param(value) for name, value in params.items()}
    return [_param(value) for value in params]


def _rows(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    # a plain loop, not `any(genexpr)`: this scan runs over every value of every result
    # (300,000 of them for the L2s of 100,000 sessions)
    for row in rows:
        for v in row:
            if v.__class__ is str and v.startswith(_MARK):
                return [
                    tuple(unescape_text(v) if isinstance(v, str) else v for v in row)
                    for row in rows
                ]
    return rows


def _rolled_back(conn: Any) -> Generator[Call, Any, None]:
    """The steps that roll back the transaction of `conn`, either side's; not on a lost
    connection (the server ended its transaction), and a failure is ignored."""
    if not (conn.broken or conn.closed):
        with contextlib.suppress(psycopg.Error):
            yield Call(conn.execute, conn.execute, ("ROLLBACK",))


_ROLLBACK_TO = "ROLLBACK TO SAVEPOINT stello_{0}; RELEASE SAVEPOINT stello_{0}"
"""Undo a savepoint's work and drop it, in one round trip."""


class _Hooks:
    """The transaction hooks of one tree (its advisory lock `key`) on a `Link`."""

    def __init__(self, link: Link, key: int) -> None:
        self._link, self._key = link, key


class SyncHooks(_Hooks):
    """`TransactionHooks` on the sync side of a `Link`."""

    def begin(self, *, wait: bool) -> bool:
        link = self._link
        conn = link.acquire()
        try:
            begun = link.run(conn, Query(link.begin_sql(self._key, wait=wait)), 2)
            if begun.rows[0][0] or wait:  # the lock taken (the waiting lock returns void)
                link.txn = conn
                return True
        except BaseException:
            self._abandon(conn)
            raise
        self._abandon(conn)
        return False

    def _abandon(self, conn: psycopg.Connection[Any]) -> None:
        try:
            run(_rolled_back(conn), self._link)
        finally:
            self._link.release(conn)

    def commit(self) -> None:
        link = self._link
        conn = link.txn
        assert conn is not None, "commit without begin"
        link.run(conn, Query("COMMIT"))  # on failure the transaction stays for rollback()
        link.txn = None
        link.release(conn)

    def rollback(self) -> None:
        link = self._link
        conn, link.txn = link.txn, None
        if conn is not None:
            self._abandon(conn)

    def savepoint(self, depth: int) -> None:
        self._link.execute(Query(f"SAVEPOINT stello_{int(depth)}"))

    def release(self, depth: int) -> None:
        self._link.execute(Query(f"RELEASE SAVEPOINT stello_{int(depth)}"))

    def rollback_to(self, depth: int) -> None:
        link = self._link
        if link.atxn is not None or (link.txn is not None and _usable(link.txn)):
            link.execute(Query(_ROLLBACK_TO.format(int(depth))))


class AsyncHooks(_Hooks):
    """The async twins of `SyncHooks`, on the loop's `AsyncConnection`."""

    async def begin(self, *, wait: bool) -> bool:
        link = self._link
        conn = await link.aacquire()
        try:
            begun = await link.arun(conn, Query(link.begin_sql(self._key, wait=wait)), 2)
            if begun.rows[0][0] or wait:
                link.atxn = (asyncio.get_running_loop(), conn)
                return True
        except BaseException:
            await arun(_rolled_back(conn), link)
            raise
        await arun(_rolled_back(conn), link)
        return False

    async def commit(self) -> None:
        link = self._link
        assert link.atxn is not None, "commit without begin"
        await link.arun(link.atxn[1], Query("COMMIT"))
        link.atxn = None

    async def rollback(self) -> None:
        link = self._link
        found, link.atxn = link.atxn, None
        if found is not None:
            await arun(_rolled_back(found[1]), link)

    async def savepoint(self, depth: int) -> None:
        await self._link.aexecute(Query(f"SAVEPOINT stello_{int(depth)}"))

    async def release(self, depth: int) -> None:
        await self._link.aexecute(Query(f"RELEASE SAVEPOINT stello_{int(depth)}"))

    async def rollback_to(self, depth: int) -> None:
        link = self._link
        if link.txn is not None or (link.atxn is not None and _usable(link.atxn[1])):
            await link.aexecute(Query(_ROLLBACK_TO.format(int(depth))))


def _usable(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether the connection is still in its transaction (an error may have ended it)."""
    status = conn.info.transaction_status
    return status in (pq.TransactionStatus.INTRANS, pq.TransactionStatus.INERROR)
