"""`PostgresMainStorage.commit_records` (and its async twin) commit a turn in one statement
(`op_commit_turn`): the same results, errors and stored state as SQLite's commit, checked side
by side on every case a turn's commit meets."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from stello_graph.checkpoints import InMemoryMainStorage, PostgresMainStorage
from stello_graph.errors import LeaseLostError, SessionArchivedError, SessionNotFoundError
from stello_graph.models import Lease, SessionMeta
from stello_graph.storage import MainStorage

STATE = ("insight", "lease_owner", "lease_token", "lease_expires", "turn_count")
CASES = {
    # case: (the lease to commit under, insight named, release, archived first)
    "held, insight shown, released": ("held", "tip", True, False),
    "held, another insight, kept": ("held", "old tip", False, False),
    "no lease": (None, None, True, False),
    "lease lost": ("lost", "tip", True, False),
    "archived": ("held", "tip", True, True),
    "missing session": ("missing", None, False, False),
}


@pytest.fixture
def storage(postgres_dsn: str) -> Iterator[PostgresMainStorage]:
    with PostgresMainStorage(postgres_dsn) as opened:
        yield opened


def _prepare(storage: MainStorage, sid: str, archived: bool) -> Lease:
    storage.put_session(SessionMeta(id=sid, label=sid))
    storage.append_records(sid, [HumanMessage("before"), AIMessage("ok")], user_turn=True)
    storage.put_insight(sid, "tip")
    lease = storage.acquire_lease(sid, "owner", 600.0)
    assert lease is not None
    if archived:
        storage.put_session(SessionMeta(id=sid, label=sid, status="archived"))
    return lease


def _commit(storage: MainStorage, how: str, sid: str, case: tuple[Any, ...]) -> object:
    kind, insight, release, archived = case
    held = _prepare(storage, sid, archived)
    leases = {"held": held, "lost": Lease(sid, "owner", held.token + 1, held.expires_at)}
    lease = leases.get(kind)
    target = "nobody" if kind == "missing" else sid
    turn = [HumanMessage("asked", id=f"u-{sid}"), AIMessage("answered", id=f"a-{sid}")]
    kwargs: dict[str, Any] = {
        "user_turn": True, "turn_id": f"u-{sid}", "insight": insight, "lease": lease,
        "release": release,
    }  # fmt: skip
    try:
        if how == "async":
            return asyncio.run(storage.acommit_records(target, turn, **kwargs))
        return storage.commit_records(target, turn, **kwargs)
    except (LeaseLostError, SessionArchivedError, SessionNotFoundError) as exc:
        return type(exc).__name__


def _stored(storage: Any, sid: str) -> tuple[Any, ...]:
    found = storage.op_read_session(sid, STATE, False)
    assert found is not None
    fields = found[1]
    insight, owner, token, expires, turns = fields
    records = [(type(m).__name__, m.content) for m in storage.list_records(sid)]
    return insight, owner, token, expires > 0, turns, records


@pytest.mark.parametrize("how", ["one statement", "async"])
@pytest.mark.parametrize("name", list(CASES))
def test_a_commit_in_one_statement_is_the_shells_commit(
    storage: PostgresMainStorage, how: str, name: str
) -> None:
    case = CASES[name]
    with InMemoryMainStorage() as reference:
        expected_result = _commit(reference, "sync", "s", case)
        fast = _commit(storage, how, "s", case)
        assert fast == expected_result
        if case[0] == "missing":
            assert fast == "SessionNotFoundError"
            return
        assert _stored(storage, "s") == _stored(reference, "s")
    expected = {"lease lost": "LeaseLostError", "archived": "SessionArchivedError"}
    assert fast == expected.get(name, 2)  # the session's user turns after the commit


def test_the_record_cache_stays_exact_after_a_commit(storage: PostgresMainStorage) -> None:
    lease = _prepare(storage, "s", archived=False)
    assert len(storage.list_records("s")) == 2  # read: cached with its stamp
    turn = [HumanMessage("asked"), AIMessage("answered")]
    storage.commit_records("s", turn, user_turn=True, turn_id="t2", lease=lease)
    assert [m.content for m in storage.list_records("s")] == ["before", "ok", "asked", "answered"]
    assert [m.content for m in asyncio.run(storage.alist_records("s"))][-1] == "answered"
