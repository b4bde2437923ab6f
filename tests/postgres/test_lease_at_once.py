"""`PostgresMainStorage` takes and gives back a session lease in one round trip: the same
decisions as SQLite's read-then-write (`_flows.choose_lease`), checked side by side on random
scripts, and one statement sent per call."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from stello_graph.checkpoints import InMemoryMainStorage, PostgresMainStorage
from stello_graph.errors import SessionArchivedError, SessionNotFoundError
from stello_graph.models import Lease, SessionMeta

OWNERS = ("a", "b", "c")
FIELDS = ("lease_owner", "lease_token", "lease_waiter")


@pytest.fixture
def storage(postgres_dsn: str) -> Iterator[PostgresMainStorage]:
    with PostgresMainStorage(postgres_dsn) as opened:
        for sid in ("fast", "shell"):
            opened.put_session(SessionMeta(id=sid, label=sid))
        yield opened


def _fields(storage: Any, sid: str) -> tuple[Any, ...]:
    found = storage.op_read_session(sid, FIELDS, False)
    assert found is not None
    return tuple(found[1])


def _step(storage: Any, sid: str, op: tuple[Any, ...], held: dict[str, Lease]) -> object:
    """Run one scripted operation on `sid` of `storage`."""
    kind, owner = op[0], op[1]
    if kind == "acquire":
        lease = storage.acquire_lease(sid, owner, 600.0, replace=op[2])
        if lease is not None:
            held[owner] = lease
        return None if lease is None else (lease.owner, lease.token)
    if kind == "release":
        return storage.release_lease(held.get(owner) or Lease(sid, owner, 0, 0.0))
    if kind == "expire":  # the holder's lease lapses
        storage.op_set_fields(sid, {"lease_expires": 0.0})
    elif kind == "unqueue":  # the waiter stopped asking
        storage.op_set_fields(sid, {"lease_wait_until": 0.0})
    return None


@pytest.mark.parametrize("seed", range(6))
def test_the_one_statement_lease_decides_as_sqlite_does(
    storage: PostgresMainStorage, seed: int
) -> None:
    rng = random.Random(seed)
    kinds = ["acquire"] * 5 + ["release"] * 3 + ["expire", "unqueue"]
    script = [
        (rng.choice(kinds), rng.choice(OWNERS), rng.choice([None, None, *OWNERS]))
        for _ in range(60)
    ]
    held: dict[str, dict[str, Lease]] = {"fast": {}, "sqlite": {}}
    with InMemoryMainStorage() as sqlite:
        sqlite.put_session(SessionMeta(id="fast", label="fast"))
        for n, op in enumerate(script):
            results = {}
            for name, on in (("fast", storage), ("sqlite", sqlite)):
                results[name] = _step(on, "fast", op, held[name])
            assert results["fast"] == results["sqlite"], (n, op)
            fast, other = (_fields(on, "fast") for on in (storage, sqlite))
            assert fast == other, (n, op, fast, other)


def test_acquire_and_release_each_send_one_statement(
    storage: PostgresMainStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[str] = []
    original = psycopg.Cursor.execute  # every statement goes through it (client cursors too)

    def counting(self: Any, query: Any, *args: Any, **kw: Any) -> Any:
        sent.append(str(query))
        return original(self, query, *args, **kw)

    monkeypatch.setattr(psycopg.Cursor, "execute", counting)
    lease = storage.acquire_lease("fast", "me", 30.0)
    assert lease is not None and len(sent) == 1
    assert storage.acquire_lease("fast", "other", 30.0) is None and len(sent) == 2
    assert storage.release_lease(lease) and len(sent) == 3
    assert not storage.release_lease(lease)  # already free
    assert storage.get_lease("fast") is None


def test_a_missing_session_is_refused_and_a_failed_statement_stores_nothing(
    storage: PostgresMainStorage,
) -> None:
    with pytest.raises(SessionNotFoundError):
        storage.acquire_lease("nope", "me", 30.0)
    assert not storage.release_lease(Lease("nope", "me", 1, 0.0))
    lease = storage.acquire_lease("fast", "me", 30.0)  # the connection is usable afterwards
    assert lease is not None and storage.get_lease("fast") == lease


def test_inside_a_transaction_the_lease_commits_with_it(storage: PostgresMainStorage) -> None:
    def taken_then_rolled_back() -> None:
        with storage.transaction():
            assert storage.acquire_lease("fast", "me", 30.0) is not None
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        taken_then_rolled_back()
    assert storage.get_lease("fast") is None


async def test_lease_session_is_one_statement_and_refuses_an_archived_session(
    storage: PostgresMainStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[str] = []
    original = psycopg.Cursor.execute

    def counting(self: Any, query: Any, *args: Any, **kw: Any) -> Any:
        sent.append(str(query))
        return original(self, query, *args, **kw)

    storage.read_session("fast")  # its records cached, as a turn finds them
    monkeypatch.setattr(psycopg.Cursor, "execute", counting)
    taken = storage.lease_session("fast", "me", 30.0)
    assert taken is not None and len(sent) == 1  # the lease's UPDATE returns the read
    assert taken[0] == storage.get_lease("fast") and taken[1] == storage.read_session("fast")
    storage.release_lease(taken[0])
    storage._steps.cache.clear()  # not cached: the session is read under the lease
    sent.clear()
    taken = storage.lease_session("fast", "me", 30.0)
    assert taken is not None and len(sent) == 3  # the lease, the session's read, its records
    assert taken[1] == storage.read_session("fast")
    storage.release_lease(taken[0])
    for sid in ("fast", "shell"):
        storage.put_session(SessionMeta(id=sid, label=sid, status="archived"))
    with pytest.raises(SessionArchivedError):
        storage.lease_session("fast", "me", 30.0)
    assert _fields(storage, "fast") == (None, 2, None)  # token kept, nobody queued
    sent.clear()
    with pytest.raises(SessionArchivedError):
        await storage.alease_session("fast", "me", 30.0)
    assert storage.get_lease("fast") is None


async def test_lease_session_gives_the_lease_back_when_its_read_finds_the_session_archived(
    storage: PostgresMainStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a storage call that bypassed the lease can archive the session between the
    lease and a read of its own (its records not cached): the lease taken is freed before
    the refusal."""
    archived = SessionMeta(id="fast", label="fast", status="archived")

    def archive_first(read: Any) -> Any:
        def call(session_id: str, **kw: Any) -> Any:
            found = read(session_id, **kw)
            return dataclasses.replace(found, meta=archived)

        return call

    def aarchive_first(read: Any) -> Any:
        async def call(session_id: str, **kw: Any) -> Any:
            found = await read(session_id, **kw)
            return dataclasses.replace(found, meta=archived)

        return call

    monkeypatch.setattr(storage, "read_session", archive_first(storage.read_session))
    monkeypatch.setattr(storage, "aread_session", aarchive_first(storage.aread_session))
    with pytest.raises(SessionArchivedError):
        storage.lease_session("fast", "me", 30.0)
    assert storage.get_lease("fast") is None
    storage._steps.cache.clear()
    with pytest.raises(SessionArchivedError):
        await storage.alease_session("fast", "me", 30.0)
    assert storage.get_lease("fast") is None


async def test_lease_session_gives_the_lease_back_when_its_read_fails(
    storage: PostgresMainStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fails(session_id: str, **kw: Any) -> Any:
        raise RuntimeError("the connection dropped")

    async def afails(session_id: str, **kw: Any) -> Any:
        raise asyncio.CancelledError

    monkeypatch.setattr(storage, "read_session", fails)
    monkeypatch.setattr(storage, "aread_session", afails)
    with pytest.raises(RuntimeError, match="dropped"):
        storage.lease_session("fast", "me", 30.0)
    assert storage.get_lease("fast") is None
    with pytest.raises(asyncio.CancelledError):
        await storage.alease_session("fast", "me", 30.0)
    assert storage.get_lease("fast") is None
