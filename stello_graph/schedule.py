"""Background consolidation and integration: `Schedule` (what to run when) and `Scheduler`.

Scheduled work runs on a small pool of worker threads, never on the caller's path, so it adds
no latency to a turn. A failure never reaches the turn that triggered it: it is retried as the
schedule says, then kept (readable per session with `failures()`) and published as a
`background_error` event. With a `FailureLog` the kept failures are stored with the topology,
so they outlive the process. `drain()` waits until all scheduled work is done.
"""

from __future__ import annotations

import asyncio
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from stello_graph.errors import InvalidInputError
from stello_graph.events import EventBus, emit
from stello_graph.models import utcnow
from stello_graph.storage import MainStorage

__all__ = ["BackgroundFailure", "FailureLog", "Schedule", "Scheduler", "StorageFailureLog"]

JobKind = Literal["consolidate", "integrate", "store"]
"""What a background job (or failure) is: a consolidation, an integration, or a store write
mirroring memory already written (`stello_graph.nodes._store`)."""


def _positive(value: int | None, name: str) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise InvalidInputError(f"{name} must be a positive int or None, got {value!r}.")


@dataclass(frozen=True, kw_only=True, slots=True)
class Schedule:
    """When background consolidation and integration run.

    Attributes:
        consolidate_every_n_turns: consolidate a session after every N-th user turn on it
            (counted exactly, from the turns committed to storage).
        consolidate_on_switch: consolidate a session when the next turn goes to another one.
        consolidate_on_archive: consolidate a session when it is archived. The archive
            takes effect at once; the consolidation runs in the background, and the
            integration it triggers (with `integrate_after_consolidate`) includes the
            session's final L2, although integration otherwise reads active sessions only.
        integrate_after_consolidate: integrate after every scheduled consolidation.
        integrate_every_n_turns: integrate after every N-th user turn of the whole tree.
        max_concurrency: worker threads for background work.
        retry_attempts: attempts per job (1 = no retry).
        retry_backoff: seconds before the first retry; doubled for each further one.
    """

    consolidate_every_n_turns: int | None = None
    consolidate_on_switch: bool = False
    consolidate_on_archive: bool = True
    integrate_after_consolidate: bool = False
    integrate_every_n_turns: int | None = None
    max_concurrency: int = 4
    retry_attempts: int = 1
    retry_backoff: float = 0.5

    def __post_init__(self) -> None:
        _positive(self.consolidate_every_n_turns, "consolidate_every_n_turns")
        _positive(self.integrate_every_n_turns, "integrate_every_n_turns")
        _positive(self.max_concurrency, "max_concurrency")
        _positive(self.retry_attempts, "retry_attempts")
        if not isinstance(self.retry_backoff, int | float) or self.retry_backoff < 0:
            raise InvalidInputError(f"retry_backoff must be >= 0, got {self.retry_backoff!r}.")


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
        return {
            "kind": self.kind,
            "session_id": self.session_id,
            "error_type": self.error_type,
            "message": self.message,
            "attempts": self.attempts,
            "at": self.at.isoformat(),
            "traceback": tail,
        }


Job = Callable[[], object]

FAILURES_KEY = "stello:background_failures"
"""The global key under which `StorageFailureLog` keeps a tree's background failures."""
_KEPT_FAILURES = 200
_TRACEBACK_CHARS = 4000


class FailureLog(Protocol):
    """Where a `Scheduler` keeps the failures of its jobs beyond its own memory."""

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

    def _stored(self) -> list[Any]:
        return _listed(self._storage.get_global(FAILURES_KEY))

    async def _astored(self) -> list[Any]:
        return _listed(await self._storage.aget_global(FAILURES_KEY))

    def append(self, failure: BackgroundFailure) -> None:
        with self._storage.transaction():
            kept = [*self._stored(), failure.as_dict(traceback_chars=_TRACEBACK_CHARS)][
                -_KEPT_FAILURES:
            ]
            self._storage.put_global(FAILURES_KEY, kept)

    def read(self, session_id: str | None = None) -> list[BackgroundFailure]:
        return _of((f for f in map(_failure_from, self._stored()) if f is not None), session_id)

    async def aread(self, session_id: str | None = None) -> list[BackgroundFailure]:
        """Async twin of `read`."""
        stored = await self._astored()
        return _of((f for f in map(_failure_from, stored) if f is not None), session_id)

    def clear(self, session_id: str | None = None) -> int:
        with self._storage.transaction():
            stored = self._stored()
            kept = _kept(stored, session_id)
            if len(kept) != len(stored):
                self._storage.put_global(FAILURES_KEY, kept)
        return len(stored) - len(kept)

    async def aclear(self, session_id: str | None = None) -> int:
        """Async twin of `clear`."""
        async with self._storage.atransaction():
            stored = await self._astored()
            kept = _kept(stored, session_id)
            if len(kept) != len(stored):
                await self._storage.aput_global(FAILURES_KEY, kept)
        return len(stored) - len(kept)


def _async(log: FailureLog, name: str, sync: str) -> Callable[..., Awaitable[Any]]:
    """The log's async method `name`; a log without one (a `FailureLog` needs only the sync
    methods) has its sync method `sync` called."""
    found = getattr(log, name, None)
    if found is not None:
        return found  # type: ignore[no-any-return]
    method = getattr(log, sync)

    async def call(*args: Any) -> Any:
        return method(*args)

    return call


def _listed(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else []


def _kept(stored: list[Any], session_id: str | None) -> list[Any]:
    """The stored failures `clear(session_id)` keeps (none, without a session)."""
    return [
        v
        for v in stored
        if session_id is not None
        and not (isinstance(v, dict) and v.get("session_id") == session_id)
    ]


Key = tuple[JobKind, str | None]


class Scheduler:
    """Runs background jobs with de-duplication, retries and failure records.

    Jobs with the same key (kind, session) never run at once: a request that comes while its
    key runs is kept (once) and runs when that run ends, covering everything up to then. A
    session consolidated after every turn thus never has two consolidations racing on its
    L2, and turns that follow each other faster than the model answers cause one
    consolidation per model call, not one per turn.
    """

    def __init__(
        self, schedule: Schedule, bus: EventBus | None = None, log: FailureLog | None = None
    ) -> None:
        self.schedule = schedule
        self._bus = bus
        self._log = log
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Condition()
        self._queued: set[Key] = set()
        self._running: set[Key] = set()
        self._next: dict[Key, Job] = {}
        self._active = 0
        self._failures: list[tuple[BackgroundFailure, bool]] = []  # (failure, in the log)
        self._closed = False

    # -- submitting -------------------------------------------------------------------------
    def submit(self, kind: JobKind, session_id: str | None, job: Job) -> bool:
        """Queue `job` unless the same (kind, session) job is already waiting to run; while
        that job runs, keep `job` to run after it. Return whether `job` was accepted."""
        key = (kind, session_id)
        with self._lock:
            if self._closed or key in self._queued or key in self._next:
                return False
            self._active += 1
            if key in self._running:
                self._next[key] = job
                return True
            self._queued.add(key)
            pool = self._ensure_pool()
        pool.submit(self._run, key, job)
        return True

    def _ensure_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                self.schedule.max_concurrency, thread_name_prefix="stello-bg"
            )
        return self._pool

    def _run(self, key: Key, job: Job) -> None:
        kind, session_id = key
        with self._lock:
            self._queued.discard(key)  # from now on a new request waits for this run
            self._running.add(key)
        try:
            self._attempt(kind, session_id, job)
        finally:
            self._finished(key)

    def _finished(self, key: Key) -> None:
        with self._lock:
            self._running.discard(key)
            self._active -= 1
            follow = self._next.pop(key, None)
            if follow is not None:
                self._queued.add(key)
            pool = self._pool
            self._lock.notify_all()
        if follow is None:
            return
        try:
            if pool is not None:
                pool.submit(self._run, key, follow)
                return
        except RuntimeError:  # the pool was shut down meanwhile
            pass
        self._run(key, follow)  # closing: no new work is taken, but what was accepted runs

    def _attempt(self, kind: JobKind, session_id: str | None, job: Job) -> None:
        attempts = self.schedule.retry_attempts
        delay = self.schedule.retry_backoff
        for attempt in range(1, attempts + 1):
            try:
                job()
                return
            except Exception as exc:
                if attempt == attempts:
                    self._record(kind, session_id, exc, attempt)
                    return
                time.sleep(delay)
                delay *= 2

    def _record(self, kind: JobKind, session_id: str | None, exc: Exception, attempts: int) -> None:
        failure = BackgroundFailure(
            kind=kind,
            session_id=session_id,
            error_type=type(exc).__name__,
            message=str(exc),
            attempts=attempts,
            traceback="".join(traceback.format_exception(exc)),
        )
        saved = self._save(failure)
        with self._lock:
            self._failures.append((failure, saved))
        emit(
            self._bus,
            "background_error",
            session_id,
            stream=False,
            kind=kind,
            error_type=failure.error_type,
            message=failure.message,
            attempts=attempts,
        )

    def _save(self, failure: BackgroundFailure) -> bool:
        """Store `failure` in the log; False (kept in memory instead) when that fails."""
        if self._log is None:
            return False
        try:
            self._log.append(failure)
        except Exception:  # the storage is closed or failing: never lose the failure
            return False
        return True

    # -- reading ----------------------------------------------------------------------------
    def failures(self, session_id: str | None = None) -> list[BackgroundFailure]:
        """Failures kept so far, oldest first; only those of `session_id` when given."""
        try:
            stored = self._log.read(session_id) if self._log is not None else None
        except Exception:  # the storage is closed: what this process kept is still known
            stored = None
        return self._with_own(stored, session_id)

    async def afailures(self, session_id: str | None = None) -> list[BackgroundFailure]:
        """Async twin of `failures`."""
        try:
            stored = (
                await _async(self._log, "aread", "read")(session_id)
                if self._log is not None
                else None
            )
        except Exception:
            stored = None
        return self._with_own(stored, session_id)

    def _with_own(
        self, stored: list[BackgroundFailure] | None, session_id: str | None
    ) -> list[BackgroundFailure]:
        """The stored failures and those this process could not store, oldest first."""
        with self._lock:
            own = _of((f for f, saved in self._failures if stored is None or not saved), session_id)
        return sorted([*(stored or ()), *own], key=lambda f: f.at)

    def clear_failures(self, session_id: str | None = None) -> int:
        """Forget the kept failures (of one session, when given); return how many."""
        cleared = self._log.clear(session_id) if self._log is not None else 0
        return cleared + self._forget_own(session_id)

    async def aclear_failures(self, session_id: str | None = None) -> int:
        """Async twin of `clear_failures`."""
        cleared = (
            await _async(self._log, "aclear", "clear")(session_id) if self._log is not None else 0
        )
        return cleared + self._forget_own(session_id)

    def _forget_own(self, session_id: str | None) -> int:
        with self._lock:
            gone = [
                saved
                for f, saved in self._failures
                if session_id is None or f.session_id == session_id
            ]
            self._failures = [
                (f, saved)
                for f, saved in self._failures
                if session_id is not None and f.session_id != session_id
            ]
        return gone.count(False)

    @property
    def busy(self) -> bool:
        """Whether any job is queued or running."""
        with self._lock:
            return self._active > 0

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until no job is queued or running; False on timeout. Never raises failures."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._active > 0:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._lock.wait(remaining)
        return True

    async def adrain(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109
        """Async twin of `drain` (polls, so the event loop keeps running)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.busy:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.005)
        return True

    def close(self, *, wait: bool = True) -> None:
        """Stop accepting jobs; with `wait`, finish the queued ones first."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=wait)
