"""Background consolidation and integration: `Schedule` (what to run when) and `Scheduler`.

Scheduled work runs on a small pool of worker threads, never on the caller's path, so it adds
no latency to a turn. A failure never reaches the turn that triggered it: it is retried as the
schedule says, then kept (readable per session with `failures()`) and published as a
`background_error` event. With a `FailureLog` the kept failures are stored with the topology,
so they outlive the process. `drain()` waits until all scheduled work is done.

Beyond one process (several LangGraph Server workers, restarts), nothing due is kept only in
memory. What makes a job due is stored: a session's user turns since its L2's cursor, an
archived session's unconsolidated turns, the tree's turns and requests since the last
scheduled integration (`stello_graph.nodes.scheduling`). A scheduler scans for due work when
it starts and every `Schedule.recover_every` seconds, so a job that a stopped or killed
process never ran is run by the next one. Before a job runs, its scheduler claims it in the
storage (`JobClaims`): across workers a job never runs twice at once,
and the worker that finds it claimed skips it, since another one is doing it.
"""

from __future__ import annotations

import asyncio
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext, suppress
from dataclasses import dataclass

from stello_graph._claims import JobClaims
from stello_graph._failures import (
    BackgroundFailure,
    FailureLog,
    JobKind,
    StorageFailureLog,
    _cleared,
    _of,
    _read,
    log_call,
)
from stello_graph._flow import Flow, arun, run
from stello_graph.errors import InvalidInputError
from stello_graph.events import EventBus, emit

__all__ = [
    "BackgroundFailure",
    "FailureLog",
    "JobClaims",
    "Schedule",
    "Scheduler",
    "StorageFailureLog",
]


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
        recover_every: seconds between scans for due work stored by any process (turns
            committed by another worker, jobs a stopped process never ran); `None` scans
            only when the scheduler starts. A job that keeps failing is tried again at
            each scan.
    """

    consolidate_every_n_turns: int | None = None
    consolidate_on_switch: bool = False
    consolidate_on_archive: bool = True
    integrate_after_consolidate: bool = False
    integrate_every_n_turns: int | None = None
    max_concurrency: int = 4
    retry_attempts: int = 1
    retry_backoff: float = 0.5
    recover_every: float | None = 60.0

    def __post_init__(self) -> None:
        _positive(self.consolidate_every_n_turns, "consolidate_every_n_turns")
        _positive(self.integrate_every_n_turns, "integrate_every_n_turns")
        _positive(self.max_concurrency, "max_concurrency")
        _positive(self.retry_attempts, "retry_attempts")
        if not isinstance(self.retry_backoff, int | float) or self.retry_backoff < 0:
            raise InvalidInputError(f"retry_backoff must be >= 0, got {self.retry_backoff!r}.")
        every = self.recover_every
        if every is not None and (
            isinstance(every, bool) or not isinstance(every, int | float) or every <= 0
        ):
            raise InvalidInputError(f"recover_every must be seconds > 0 or None, got {every!r}.")


Job = Callable[[], object]


Key = tuple[JobKind, str | None]


class Scheduler:
    """Runs background jobs with de-duplication, retries and failure records.

    Jobs with the same key (kind, session) never run at once: a request that comes while its
    key runs is kept (once) and runs when that run ends, covering everything up to then. A
    session consolidated after every turn thus never has two consolidations racing on its
    L2, and turns that follow each other faster than the model answers cause one
    consolidation per model call, not one per turn.

    With `claims`, each job first claims its key in the storage and is skipped when
    another scheduler (another process on the tree) holds it; `recover` scans for due work.
    """

    def __init__(
        self,
        schedule: Schedule,
        bus: EventBus | None = None,
        log: FailureLog | None = None,
        *,
        claims: JobClaims | None = None,
    ) -> None:
        self.schedule = schedule
        self._bus = bus
        self._log = log
        self._claims = claims
        self._stop = threading.Event()
        self._scanner: threading.Thread | None = None
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
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self.schedule.max_concurrency, thread_name_prefix="stello-bg"
                )
            pool = self._pool
        pool.submit(self._run, key, job)
        return True

    def _run(self, key: Key, job: Job) -> None:
        kind, session_id = key
        with self._lock:
            self._queued.discard(key)  # from now on a new request waits for this run
            self._running.add(key)
        # run `job` while holding its claim; skip it when another scheduler holds it
        hold = nullcontext(True) if self._claims is None else self._claims.hold(kind, session_id)
        try:
            with hold as claim:
                if claim is not None:
                    self._attempt(kind, session_id, job)
        except Exception as exc:  # the claim could not be read or written
            self._record(kind, session_id, exc, 1)
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
        if pool is not None:
            with suppress(RuntimeError):  # the pool was shut down meanwhile
                pool.submit(self._run, key, follow)
                return
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
        saved = False  # else kept in memory: the log is missing, closed or failing
        if self._log is not None:
            with suppress(Exception):
                self._log.append(failure)
                saved = True
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

    # -- recovering -------------------------------------------------------------------------
    def recover(self, scan: Callable[[], object]) -> None:
        """Run `scan` (which submits the due jobs it finds) now, then every
        `Schedule.recover_every` seconds until `close`. The first scan counts as queued
        work: `drain` waits for it and for what it submits. A failing scan (a storage that
        is closing, say) is tried again at the next one."""
        with self._lock:
            if self._closed or self._scanner is not None:
                return
            self._active += 1
            self._scanner = threading.Thread(
                target=self._scan_loop, args=(scan,), name="stello-recover", daemon=True
            )
        self._scanner.start()

    def _scan_loop(self, scan: Callable[[], object]) -> None:
        # a failing scan is retried at the next one; the jobs record their own failures
        try:
            with suppress(Exception):
                scan()
        finally:
            with self._lock:
                self._active -= 1
                self._lock.notify_all()
        every = self.schedule.recover_every
        while every is not None and not self._stop.wait(every):
            with suppress(Exception):
                scan()

    # -- reading ----------------------------------------------------------------------------
    def failures(self, session_id: str | None = None) -> list[BackgroundFailure]:
        """Failures kept so far, oldest first; only those of `session_id` when given."""
        return run(self._read_failures(session_id), None)

    async def afailures(self, session_id: str | None = None) -> list[BackgroundFailure]:
        """Async twin of `failures`."""
        return await arun(self._read_failures(session_id), None)

    def _read_failures(self, session_id: str | None) -> Flow[list[BackgroundFailure]]:
        """The stored failures and those this process could not store, oldest first."""
        try:
            stored = None if self._log is None else (yield log_call(self._log, "read", session_id))
        except Exception:  # the storage is closed: what this process kept is still known
            stored = None
        with self._lock:
            own = _of((f for f, saved in self._failures if stored is None or not saved), session_id)
        return sorted([*(stored or ()), *own], key=lambda f: f.at)

    def clear_failures(self, session_id: str | None = None) -> int:
        """Forget the kept failures (of one session, when given); return how many."""
        return run(self._clear_failures(session_id), None)

    async def aclear_failures(self, session_id: str | None = None) -> int:
        """Async twin of `clear_failures`."""
        return await arun(self._clear_failures(session_id), None)

    def _clear_failures(self, session_id: str | None) -> Flow[int]:
        cleared: int = 0 if self._log is None else (yield log_call(self._log, "clear", session_id))
        with self._lock:
            kept = [
                (f, saved) for f, saved in self._failures if session_id not in (None, f.session_id)
            ]
            gone = [saved for f, saved in self._failures if session_id in (None, f.session_id)]
            self._failures = kept
        return cleared + gone.count(False)

    @property
    def busy(self) -> bool:
        """Whether any job is queued or running."""
        with self._lock:
            return self._active > 0

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until no job is queued or running; False on timeout. Never raises failures."""
        with self._lock:
            return self._lock.wait_for(lambda: self._active == 0, timeout)

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
            scanner = self._scanner
        self._stop.set()
        if scanner is not None and scanner is not threading.current_thread():
            scanner.join()
        if pool is not None:
            pool.shutdown(wait=wait)


def kept_failures(
    scheduler: Scheduler | None, session_id: str | None = None
) -> Flow[list[BackgroundFailure]]:
    """The kept failures (driven with the tree's storage): the scheduler's, else the tree's
    stored ones (`StorageFailureLog`)."""
    return _read(session_id) if scheduler is None else scheduler._read_failures(session_id)


def clear_kept_failures(scheduler: Scheduler | None, session_id: str | None = None) -> Flow[int]:
    """Forget the kept failures (driven with the tree's storage), as `kept_failures` reads them."""
    return _cleared(session_id) if scheduler is None else scheduler._clear_failures(session_id)
