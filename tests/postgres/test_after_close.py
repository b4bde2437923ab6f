"""A `PostgresMainStorage` used after `close()` still answers, and leaves no connection open
(each call runs on a connection of its own, closed when it returns)."""

from __future__ import annotations

import asyncio
import time

import psycopg

from stello_graph.checkpoints import PostgresMainStorage
from stello_graph.models import SessionMeta


def _backends(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        found = conn.execute(
            "SELECT COUNT(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
    assert found is not None
    return int(found[0])


def _settled(dsn: str, expected: int) -> int:
    """The count of other backends, once it is `expected` (a closed connection's backend
    leaves `pg_stat_activity` a moment after the client hangs up) or after 5 s."""
    deadline = time.monotonic() + 5
    while (found := _backends(dsn)) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def test_calls_after_close_leave_no_connection_open(postgres_dsn: str) -> None:
    before = _backends(postgres_dsn)
    storage = PostgresMainStorage(postgres_dsn)
    storage.put_session(SessionMeta(id="s", label="S"))
    assert _settled(postgres_dsn, before + 1) == before + 1  # the storage's own connection
    storage.close()
    meta = storage.get_session("s")
    assert meta is not None and meta.label == "S"
    assert asyncio.run(storage.aget_session("s")) == meta
    assert _settled(postgres_dsn, before) == before
