"""LangGraph checkpointers on the same PostgreSQL database as the `PostgresMainStorage`
(`open_postgres` in `stello_graph.checkpoints.postgres` opens both).

`StelloPostgresSaver` is LangGraph's `PostgresSaver` (from `langgraph-checkpoint-postgres`)
on a small connection pool of its own (a lost connection is replaced), with working async
methods (each runs the sync one in a worker thread, as `StelloSqliteSaver` does), so one agent
can be driven both from threads and from asyncio. For a LangGraph application that is async
only, LangGraph's own `AsyncPostgresSaver` works with the storage as well.

This module imports LangGraph and psycopg; `stello_graph.checkpoints` loads it only when one of
its names is used.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import psycopg
import psycopg_pool
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from stello_graph.checkpoints._postgres_conn import check_idle, describe
from stello_graph.checkpoints._postgres_schema import SESSIONS
from stello_graph.checkpoints._threaded_saver import AsyncInThreads
from stello_graph.errors import InvalidInputError, StorageError, StorageUnavailableError

__all__ = ["StelloPostgresSaver", "postgres_saver"]

SETUP_LOCK = 0x5374_656C_6C6F_0002
"""The advisory lock held while LangGraph's checkpoint tables are set up: its migrations do
not guard against two processes running them at once."""


_BYTE = "%[89AB][0-9A-F]"  # a UTF-8 continuation byte, as `_ids.compose` escapes it
_CHARACTER = "|".join(
    (
        "[A-Za-z0-9_.~-]",
        "%(0[1-9A-F]|[1-7][0-9A-F])",
        f"%(C[2-9A-F]|D[0-9A-F]){_BYTE}",
        f"%E0%[AB][0-9A-F]{_BYTE}|%(E[1-9A-CEF]){_BYTE}{_BYTE}|%ED%[89][0-9A-F]{_BYTE}",
        f"%F0%[9AB][0-9A-F]{_BYTE}{_BYTE}|%F[1-3]{_BYTE}{_BYTE}{_BYTE}|%F4%8[0-9A-F]{_BYTE}{_BYTE}",
    )
)
_PART = f"({_CHARACTER})+".replace("%", "%%")
"""A part of a thread id `_ids.compose` can make of a text PostgreSQL stores (UTF-8, no NUL):
any other thread id (which a stello session cannot have) is not decoded, and written."""


def _decoded(part: str) -> str:
    """SQL: the text `part` (an SQL expression, a part of `_ids.compose`) percent-decoded."""
    return f"""(SELECT convert_from(string_agg(CASE WHEN left(m[1], 1) = '%%'
        THEN decode(substr(m[1], 2), 'hex') ELSE convert_to(m[1], 'UTF8') END,
        '\\x'::bytea ORDER BY n), 'UTF8')
        FROM regexp_matches({part}, '%%[0-9A-Fa-f]{{2}}|[^%%]+', 'g') WITH ORDINALITY AS p(m, n))"""


def _guarded(table: str, columns: str, conflict: str) -> str:
    """LangGraph's insert into `table` (`columns`: "name type, ..." in its parameters' order)
    as one statement that inserts nothing of a stello session's turn thread (`_ids.thread_id`)
    whose tree is stored on the database without that session. It reads the session's row
    `FOR KEY SHARE`: a removal under way (which deletes the session's row, then its threads,
    in one transaction) is waited for, and its deleted row is then not found; a removal
    after it waits for this transaction, and deletes what it wrote."""
    names = ", ".join(column.split()[0] for column in columns.split(", "))
    values = ", ".join(f"%s::{column.split()[1]}" for column in columns.split(", "))
    return f"""INSERT INTO {table} ({names})
        SELECT v.* FROM (VALUES ({values})) AS v({names})
        LEFT JOIN LATERAL (
            SELECT {_decoded("split_part(v.thread_id, '/', 2)")} AS tree_id,
                {_decoded("split_part(v.thread_id, '/', 3)")} AS id
            WHERE v.thread_id ~ '^stello/{_PART}/{_PART}$') AS k ON true
        WHERE k.tree_id IS NULL
            OR EXISTS (SELECT 1 FROM {SESSIONS} AS s WHERE s.tree_id = k.tree_id AND s.id = k.id
                FOR KEY SHARE)
            OR NOT EXISTS (SELECT 1 FROM {SESSIONS} AS s WHERE s.tree_id = k.tree_id)
        {conflict}"""


_BLOBS = _guarded(
    "checkpoint_blobs",
    "thread_id text, checkpoint_ns text, channel text, version text, type text, blob bytea",
    "ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING",
)
_CHECKPOINTS = _guarded(
    "checkpoints",
    "thread_id text, checkpoint_ns text, checkpoint_id text, parent_checkpoint_id text, "
    "checkpoint jsonb, metadata jsonb",
    """ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id)
        DO UPDATE SET checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata""",
)
_WRITES_COLUMNS = (
    "thread_id text, checkpoint_ns text, checkpoint_id text, task_id text, task_path text, "
    "idx integer, channel text, type text, blob bytea"
)
_WRITES_KEY = "ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)"
_UPSERT_WRITES = _guarded(
    "checkpoint_writes",
    _WRITES_COLUMNS,
    f"{_WRITES_KEY} DO UPDATE SET channel = EXCLUDED.channel, type = EXCLUDED.type, "
    "blob = EXCLUDED.blob",
)
_INSERT_WRITES = _guarded("checkpoint_writes", _WRITES_COLUMNS, f"{_WRITES_KEY} DO NOTHING")


class StelloPostgresSaver(AsyncInThreads, PostgresSaver):
    """`PostgresSaver` whose async methods work too (each runs the sync one in a thread),
    and whose failures are stello's typed errors.

    Made by `postgres_saver` on a database that holds the stello storage (as `open_postgres`
    and `StelloAgent` make it), it writes nothing of a stello session's turn thread whose
    session the storage no longer has: a turn that runs on while its session is removed (by
    another process) stores none of its text. Each insert checks the session in the same
    statement, and the removal deletes the session's threads in its own transaction.
    """

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """A failure of the database in the block, raised as `StorageUnavailableError` (a
        connection lost, refused or not given in time: the pool replaces it for the next
        call) or `StorageError` (anything else of the database), the original its
        `__cause__`."""
        try:
            yield
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            conninfo = getattr(self.conn, "conninfo", None)
            try:
                where = describe(conninfo) if isinstance(conninfo, str) else "its database"
            except InvalidInputError:
                where = "its database"
            state = getattr(exc, "sqlstate", None)
            if isinstance(exc, psycopg.InterfaceError | psycopg_pool.PoolTimeout) or (
                isinstance(exc, psycopg.OperationalError)
                and (
                    state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03")
                )
            ):
                if isinstance(self.conn, ConnectionPool):
                    # the pool's other connections died with this one: the next call gets a
                    # new one (once the server is back), not the next dead one
                    with suppress(psycopg.Error, psycopg_pool.PoolTimeout):
                        self.conn.check()
                raise StorageUnavailableError(
                    f"The connection to PostgreSQL at {where} was lost or refused ({exc}). "
                    "Nothing of the unfinished operation was stored; retry it once the server "
                    "is back."
                ) from exc
            raise StorageError(f"PostgreSQL failed at {where}: {exc}") from exc


def postgres_saver(conninfo: str, *, connect_timeout: float = 10.0) -> StelloPostgresSaver:
    """A `StelloPostgresSaver` on a pool of its own to `conninfo`, its tables set up; when the
    database holds the stello storage, it writes nothing of a removed session's turn thread.

    Raises:
        StorageUnavailableError: the server cannot be reached.
    """
    where = describe(conninfo)
    pool: psycopg_pool.ConnectionPool[Any] = psycopg_pool.ConnectionPool(
        conninfo,
        min_size=1,
        max_size=4,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        open=False,
        timeout=max(1.0, connect_timeout),
        name="stello-checkpoints",
        check=check_idle,
    )
    saver = StelloPostgresSaver(pool)
    try:
        pool.open(wait=True, timeout=max(1.0, connect_timeout))
        with pool.connection() as conn:
            conn.execute(f"SELECT pg_advisory_lock({SETUP_LOCK})")
            try:
                saver.setup()
            finally:
                conn.execute(f"SELECT pg_advisory_unlock({SETUP_LOCK})")
            stored = conn.execute("SELECT to_regclass(%s) AS found", (SESSIONS,)).fetchone()
        if stored is not None and stored["found"] is not None:  # the storage is on it
            # write nothing of a stello turn thread whose session is gone: LangGraph's
            # inserts, guarded (they need the `stello_sessions` table)
            saver.UPSERT_CHECKPOINT_BLOBS_SQL = _BLOBS
            saver.UPSERT_CHECKPOINTS_SQL = _CHECKPOINTS
            saver.UPSERT_CHECKPOINT_WRITES_SQL = _UPSERT_WRITES
            saver.INSERT_CHECKPOINT_WRITES_SQL = _INSERT_WRITES
    except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
        pool.close()
        raise StorageUnavailableError(
            f"Cannot set up LangGraph's checkpoint tables at {where}: {exc}"
        ) from exc
    except BaseException:
        pool.close()
        raise
    return saver
