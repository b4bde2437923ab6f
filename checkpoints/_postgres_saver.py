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

from typing import Any

import psycopg
import psycopg_pool
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg.rows import dict_row

from stello_graph.checkpoints._postgres_conn import describe
from stello_graph.checkpoints._threaded_saver import AsyncInThreads
from stello_graph.errors import StorageUnavailableError

__all__ = ["StelloPostgresSaver", "postgres_saver"]

SETUP_LOCK = 0x5374_656C_6C6F_0002
"""The advisory lock held while LangGraph's checkpoint tables are set up: its migrations do
not guard against two processes running them at once."""


class StelloPostgresSaver(AsyncInThreads, PostgresSaver):
    """`PostgresSaver` whose async methods work too (each runs the sync one in a thread)."""

    def close(self) -> None:
        """Close the saver's connection pool (or connection)."""
        self.conn.close()


def postgres_saver(conninfo: str, *, connect_timeout: float = 10.0) -> StelloPostgresSaver:
    """A `StelloPostgresSaver` on a pool of its own to `conninfo`, its tables set up.

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
    except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
        pool.close()
        raise StorageUnavailableError(
            f"Cannot set up LangGraph's checkpoint tables at {where}: {exc}"
        ) from exc
    except BaseException:
        pool.close()
        raise
    return saver
