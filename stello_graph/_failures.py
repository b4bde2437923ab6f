"""Background failures: `BackgroundFailure`, and where a scheduler keeps them (`FailureLog`,
`StorageFailureLog`: in the tree's storage, so they outlive the process and every agent on
the tree sees them)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from functools import partial
from typing import Any, Literal, Protocol

from stello_graph._flow import Atomic, Call, Flow, Storage, arun, run
from stello_graph.models import utcnow
from stello_graph.storage import MainStorage

__all__ = ["FAILURES_KEY", "BackgroundFailure", "FailureLog", "JobKind", "StorageFailureLog"]

JobKind = Literal["consolidate", "integrate", "store"]
"""What a background job (or failure) is: a consolidation, an integration, or a store write
mirroring memory already written (`stello_graph.nodes._store`)."""


@dataclass(frozen=True, slots=True)
class BackgroundFailure:
    """A background job that failed after all its attempts."""

    kind: JobKind
    session_id: str | None
    error_type: str
    message: str
    attempts: int
    at: datetime = field(default_factory=utcnow)
    traceback: str = ""

    def as_dict(self, *, traceback_chars: int | None = None) -> dict[str, Any]:
        """The failure as JSON-ready data (the traceback's last `traceback_chars`, if given)."""
        tail = self.traceback if traceback_chars is None else self.traceback[-traceback_chars:]
        return {**asdict(self), "at": self.at.isoformat(), "traceback": tail}


FAILURES_KEY = "stello:background_failures"
"""The global key under which `StorageFailureLog` keeps a tree's background failures."""
_KEPT_FAILURES = 200
_TRACEBACK_CHARS = 4000


class FailureLog(Protocol):
    """Where a `Scheduler` keeps the failures of its jobs beyond its own memory.

    The async API (`afailures`, `aclear_failures`) awaits a log's `aread` / `aclear` when
    it has them, else runs `read` / `clear` in a worker thread: a log with sync methods only
    must work from any thread (and from two at once).
    """

    def append(self, failure: BackgroundFailure) -> None: ...
    def read(self, session_id: str | None = None) -> list[BackgroundFailure]: ...
    def clear(self, session_id: str | None = None) -> int: ...


def _of(failures: Iterable[BackgroundFailure], session_id: str | None) -> list[BackgroundFailure]:
    return [f for f in failures if session_id is None or f.session_id == session_id]


def _failure_from(value: object) -> BackgroundFailure | None:
    if not isinstance(value, dict):
        return None
    try:
        return BackgroundFailure(
            kind=value["kind"],
            session_id=value.get("session_id"),
            error_type=str(value["error_type"]),
            message=str(value["message"]),
            attempts=int(value["attempts"]),
            at=datetime.fromisoformat(value["at"]),
            traceback=str(value.get("traceback", "")),
        )
    except (KeyError, TypeError, ValueError):
        return None  # written by something else: not ours to read


class StorageFailureLog:
    """Background failures kept in the storage (the global `stello:background_failures` of
    the tree): they survive the process, and every agent on the tree sees them. The newest
    200 are kept."""

    def __init__(self, storage: MainStorage) -> None:
        self._storage = storage

    def append(self, failure: BackgroundFailure) -> None:
        with self._storage.transaction():
            kept = run(_stored(), self._storage)
            kept.append(failure.as_dict(traceback_chars=_TRACEBACK_CHARS))
            self._storage.put_global(FAILURES_KEY, kept[-_KEPT_FAILURES:])

    def read(self, session_id: str | None = None) -> list[BackgroundFailure]:
        return run(_read(session_id), self._storage)

    async def aread(self, session_id: str | None = None) -> list[BackgroundFailure]:
        """Async twin of `read`."""
        return await arun(_read(session_id), self._storage)

    def clear(self, session_id: str | None = None) -> int:
        return run(_cleared(session_id), self._storage)

    async def aclear(self, session_id: str | None = None) -> int:
        """Async twin of `clear`."""
        return await arun(_cleared(session_id), self._storage)


def _stored() -> Flow[list[Any]]:
    """The stored entries (dicts, unless something else wrote them)."""
    value = yield Storage(MainStorage.get_global, FAILURES_KEY)
    return list(value) if isinstance(value, list) else []


def _read(session_id: str | None) -> Flow[list[BackgroundFailure]]:
    stored = yield from _stored()
    return _of((f for f in map(_failure_from, stored) if f is not None), session_id)


def _clear(session_id: str | None) -> Flow[int]:
    """`clear`'s steps (in one transaction): drop the failures it does not keep."""
    stored = yield from _stored()
    kept = [  # none, without a session
        v
        for v in stored
        if session_id is not None
        and not (isinstance(v, dict) and v.get("session_id") == session_id)
    ]
    if len(kept) != len(stored):
        yield Storage(MainStorage.put_global, FAILURES_KEY, kept)
    return len(stored) - len(kept)


def _cleared(session_id: str | None) -> Flow[int]:
    """`clear`: its steps in one transaction."""
    return int((yield Atomic(_clear(session_id))))


def log_call(log: FailureLog, name: str, *args: Any) -> Call:
    """A call of the log's method `name` as a flow step. Driven async, it awaits the log's
    `a<name>`; a log without one (a `FailureLog` needs only the sync methods) has `name` run
    in a worker thread: its I/O (a file, a database) never blocks the event loop."""
    sync = getattr(log, name)
    return Call(sync, getattr(log, f"a{name}", None) or partial(asyncio.to_thread, sync), args)
