"""The session lease: turns on one session run one at a time, wherever they come from.

A turn holds its session through a lease stored with the session (`SessionStorage.acquire_lease`):
an owner, an expiry and a fencing token. Threads, asyncio tasks, two agents and two processes
on one database all go through it, so every turn sees every turn committed before it started
and an insight is shown to exactly one turn. While a turn runs, a keeper thread renews its
lease; a holder that died is taken over: at once when it was a process of this machine that
no longer exists, otherwise when its lease expires. A turn commits only while its token is
still the stored one (`check_lease` inside the commit's transaction), so a holder that lost
its lease cannot commit.

A lease also knows where it is held: inside a turn's tools (and inside `StelloAgent.hold`)
the session counts as held by the running code, and anything that would wait for it there
(a tool that archives, or asks, its own session) fails at once with `SessionBusyError`
instead of waiting for itself.

Example:
    >>> from stello_graph.checkpoints import InMemoryMainStorage
    >>> from stello_graph.models import SessionMeta
    >>> storage = InMemoryMainStorage()
    >>> storage.put_session(SessionMeta(id="s1", label="Ideas"))
    >>> leases = SessionLeases(storage)
    >>> with leases.hold("s1") as lease:
    ...     storage.get_lease("s1") == lease
    True
    >>> storage.get_lease("s1") is None
    True
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from stello_graph._cancelled import CallCancelled
from stello_graph._flow import Call, Flow, Storage, arun, run
from stello_graph._ids import add_live, discard_live, new_owner, owner_is_dead
from stello_graph.errors import (
    InvalidInputError,
    SessionBusyError,
    SessionNotFoundError,
    StorageError,
)
from stello_graph.models import Lease
from stello_graph.storage import SessionStorage

__all__ = [
    "DEFAULT_LEASE_TTL",
    "Handback",
    "SessionLeases",
    "check_lease_ttl",
    "new_owner",
    "owner_is_dead",
]

DEFAULT_LEASE_TTL = 30.0
"""Seconds a lease lasts unless renewed; a running turn renews it every third of that."""

_MAX_PAUSE = 0.05
# Woken whenever this process releases a lease, so local waiters need not poll.
_released = threading.Condition()


@dataclass(slots=True)
class Handback:
    """A lender's leave for the graph run it lends its lease to: the run's commit may free
    the lease in its own transaction (one write transaction fewer per turn) while `allowed`
    says nothing the lender does after the run needs the session held. `released` tells the
    lender it was freed, so it does not release it again; `committed` that the turn is
    stored."""

    allowed: bool = False
    released: bool = False
    prefetched: Any = None
    """What the lender read of the session under the lease for the run's opening step
    (`SessionStorage.read_session`): that step takes it (once) instead of reading again."""
    committed: dict[str, Any] | None = None
    """The state of the turn the run committed, set as soon as its commit's transaction
    returned: whatever fails after (a checkpoint write) fails a turn that is stored, and the
    lender answers with this turn's reply instead of an error (`StelloAgent.turn`)."""

    def take_prefetched(self) -> Any:
        """The prefetched read, once (`None` after, or when there is none)."""
        found, self.prefetched = self.prefetched, None
        return found


@dataclass(frozen=True, slots=True)
class _Hold:
    lease: Lease
    busy: bool
    """The code running now is part of the holder's work (a tool of its turn, a block inside
    `hold`): waiting for the session here would wait for itself."""
    handback: Handback | None = None


_HELD: ContextVar[Mapping[tuple[str, str], _Hold] | None] = ContextVar(
    "stello_held_leases", default=None
)


def _held() -> Mapping[tuple[str, str], _Hold]:
    return _HELD.get() or {}


def check_lease_ttl(value: object) -> float:
    """A lease ttl in seconds: a number in [1, 3600]."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 1 <= value <= 3600:
        raise InvalidInputError(f"lease_ttl must be seconds between 1 and 3600, got {value!r}.")
    return float(value)


def _scope(storage: SessionStorage) -> str:
    """Which database and tree a storage reads: two storages of one file share a scope."""
    path = getattr(storage, "path", None)
    if isinstance(path, str) and path not in ("", ":memory:"):
        # resolved when the storage opened: resolving it here would stat on the event loop
        where = getattr(storage, "realpath", None) or os.path.realpath(path)
    else:
        where = f"object:{id(storage)}"
    return f"{type(storage).__name__}:{where}:{storage.tree_id}"


@dataclass(slots=True)
class _Kept:
    renew: Callable[[], object]
    """Renews the lease (or claim): `None`, or an error, when it was lost."""
    ttl: float
    due: float
    lost: bool = False


@dataclass
class _Keeper:
    """One daemon thread per process renewing the leases of running turns and the claims of
    running jobs (`stello_graph._claims`)."""

    kept: dict[int, _Kept] = field(default_factory=dict)
    cond: threading.Condition = field(default_factory=threading.Condition)
    pid: int = 0
    counter: int = 0

    def add(self, renew: Callable[[], object], ttl: float) -> int:
        with self.cond:
            self.counter += 1
            self.kept[self.counter] = _Kept(renew, ttl, time.monotonic() + ttl / 3)
            if self.pid != os.getpid():  # first use, or a forked child: no thread yet
                self.pid = os.getpid()
                threading.Thread(target=self._run, name="stello-lease", daemon=True).start()
            self.cond.notify()
            return self.counter

    def drop(self, key: int) -> None:
        with self.cond:
            self.kept.pop(key, None)

    def _run(self) -> None:
        while True:
            with self.cond:
                now = time.monotonic()
                due = [k for k in self.kept.values() if k.due <= now and not k.lost]
                if not due:
                    wake = min((k.due for k in self.kept.values() if not k.lost), default=None)
                    self.cond.wait(None if wake is None else max(0.0, wake - now))
                    continue
            for kept in due:
                try:
                    renewed = kept.renew()
                except Exception:  # a closed or failing storage: it lapses, as a lost one
                    renewed = None
                kept.lost = renewed is None
                kept.due = time.monotonic() + kept.ttl / 3


_keeper = _Keeper()


@contextmanager
def renewing(renew: Callable[[], object], ttl: float) -> Iterator[None]:
    """Call `renew` every third of `ttl` seconds (in the keeper's thread) while the block runs,
    until it returns `None` or fails (what it renews was lost)."""
    key = _keeper.add(renew, ttl)
    try:
        yield
    finally:
        _keeper.drop(key)


class SessionLeases:
    """Acquire, hold and release session leases on one storage.

    Args:
        storage: the tree's storage (it stores the leases).
        ttl: seconds a lease lasts without renewal (a turn's keeper renews it meanwhile).
        wait: seconds to wait for a busy session before `SessionBusyError` (`None`: as long
            as it takes).
    """

    def __init__(
        self, storage: SessionStorage, *, ttl: float = DEFAULT_LEASE_TTL, wait: float | None = None
    ) -> None:
        self.storage = storage
        self.ttl = check_lease_ttl(ttl)
        if wait is not None and (isinstance(wait, bool) or not isinstance(wait, int | float)):
            raise InvalidInputError(f"wait must be seconds or None, got {wait!r}.")
        self.wait = wait
        self.scope = _scope(storage)

    # -- where the session is held ----------------------------------------------------------
    def held(self, session_id: str) -> Lease | None:
        """The lease this call chain already holds on the session and may use, if any.

        Raises:
            SessionBusyError: the session is held by work this call is part of (a tool of
                its turn): waiting for it would never end.
        """
        hold = _held().get((self.scope, session_id))
        if hold is None:
            return None
        if hold.busy:
            raise self._reentrant(session_id)
        return hold.lease

    def busy(self, lease: Lease) -> AbstractContextManager[None]:
        """Mark the session held by the code run inside (a turn's tools): an attempt to
        take it there fails at once instead of waiting for itself."""
        return self._marked(lease, busy=True)

    def lending(
        self, lease: Lease, handback: Handback | None = None
    ) -> AbstractContextManager[None]:
        """Let the graph run inside use `lease` (the agent holds it for the whole run); with
        `handback`, its commit may also free it (see `Handback`)."""
        return self._marked(lease, busy=False, handback=handback)

    def handback(self, session_id: str) -> Handback | None:
        """The lender's `Handback` of the lease this call chain was lent, if it gave one
        (the commit asks its `allowed` when it commits)."""
        hold = _held().get((self.scope, session_id))
        back = None if hold is None or hold.busy else hold.handback
        return back if back is not None and not back.released else None

    @contextmanager
    def _marked(
        self, lease: Lease, *, busy: bool, handback: Handback | None = None
    ) -> Iterator[None]:
        held = dict(_held())
        held[(self.scope, lease.session_id)] = _Hold(lease, busy, handback)
        reset = _HELD.set(held)
        try:
            yield
        finally:
            _HELD.reset(reset)

    def _refuse_reentry(self, session_id: str) -> None:
        if (self.scope, session_id) in _held():
            raise self._reentrant(session_id)

    @staticmethod
    def _reentrant(session_id: str) -> SessionBusyError:
        return SessionBusyError(
            session_id,
            "this call runs inside that session's own turn (a tool of the turn, or code "
            "inside StelloAgent.hold), which waits for it: waiting here would never end. "
            "Do it after the turn ends.",
        )

    # -- acquire and release ----------------------------------------------------------------
    def _taking(
        self, session_id: str, owner: str, replace: str | None, into: Handback | None
    ) -> Flow[Lease | None]:
        """One ask for the lease; with `into`, of an active session, read with the lease
        (one transaction: `lease_session`) into `into.prefetched`."""
        if into is None:
            lease: Lease | None = yield Storage(
                SessionStorage.acquire_lease, session_id, owner, self.ttl, replace=replace
            )
            return lease
        taken = yield Storage(
            SessionStorage.lease_session, session_id, owner, self.ttl, replace=replace
        )  # refusing "a turn" of a missing or archived session
        if taken is None:
            return None
        lease, into.prefetched = taken
        return lease

    def _free_later(self, taken: object, owner: str) -> None:
        """Release `owner`'s lease in `taken` (a step's result: a `Lease`, `(lease, snapshot)`,
        anything else) in a task of its own. It leaves the owner's liveness alone: the asker that
        failed was forgotten at once, and the same owner may have asked again meanwhile (a
        turn's node resumed with the owner of its state), which must not count as dead."""
        lease = taken[0] if isinstance(taken, tuple) else taken
        if not isinstance(lease, Lease) or lease.owner != owner:
            return  # not a lease this asker took (the holder's, read by `get_lease`)
        key = (self.scope, lease.session_id, lease.owner)
        task = asyncio.get_running_loop().create_task(self._afree(lease))
        _freeing.setdefault(key, set()).add(task)
        task.add_done_callback(partial(_freed, key))

    async def _after_frees(self, session_id: str, owner: str) -> None:
        """Wait for the background frees of `owner`'s earlier asks of the session: the same
        owner asking again renews a lease it holds, keeping its token, and a free that came
        after would release the renewed lease (storages that run calls side by side, as a
        connection pool does, keep no order between the two)."""
        pending = _freeing.get((self.scope, session_id, owner), ())
        loop = asyncio.get_running_loop()
        for task in list(pending):
            if not task.done() and task.get_loop() is loop:
                with suppress(Exception):
                    await asyncio.shield(task)

    async def _afree(self, lease: Lease) -> None:
        try:
            await self.storage.arelease_lease(lease)
        finally:
            _wake_waiters()

    def _asking(self, session_id: str, owner: str, into: Handback | None) -> Flow[Lease]:
        """Ask for the lease until it is taken (over from a holder that died, too), waiting
        between asks for a release of this process (or the next pause) until `wait` runs
        out."""
        deadline = None if self.wait is None else time.monotonic() + self.wait
        pause = 0.001
        while True:
            lease = yield from self._taking(session_id, owner, None, into)
            if lease is None:
                current = yield Storage(SessionStorage.get_lease, session_id)
                if current is not None and owner_is_dead(current.owner):
                    lease = yield from self._taking(session_id, owner, current.owner, into)
            if lease is not None:
                return lease
            if deadline is not None and time.monotonic() >= deadline:
                raise SessionBusyError(
                    session_id, f"another turn held it for longer than {self.wait:g} s."
                )
            yield Call(_wait_released, asyncio.sleep, (pause,))
            pause = min(pause * 2, _MAX_PAUSE)

    def acquire(
        self, session_id: str, *, owner: str | None = None, into: Handback | None = None
    ) -> Lease:
        """Take the session's lease, waiting while another turn holds it.

        With the `owner` of a lease held before, renew it (or take it again if it lapsed).
        With `into`, the session must be active: a missing or archived one is refused
        (`SessionNotFoundError` / `SessionArchivedError`) before anything is written, and
        its `read_session`, read with the lease (one transaction where the storage has
        `lease_session`), is left in `into.prefetched` for the run's opening step.
        """
        self._refuse_reentry(session_id)
        owner = owner or new_owner()
        add_live(owner)
        try:
            return run(self._asking(session_id, owner, into), self.storage)
        except BaseException as error:
            try:
                if _frees_place(error):
                    # an asker that gives up (its wait ran out, it was interrupted) leaves
                    # the next-to-hold place it may keep: the others would wait for it
                    with suppress(Exception):
                        self.storage.release_lease(_never_held(session_id, owner))
            finally:
                discard_live(owner)
            raise

    async def aacquire(
        self, session_id: str, *, owner: str | None = None, into: Handback | None = None
    ) -> Lease:
        """Async twin of `acquire`: waiting never blocks the event loop."""
        self._refuse_reentry(session_id)
        owner = owner or new_owner()
        await self._after_frees(session_id, owner)  # none for a new owner
        add_live(owner)
        try:
            return await arun(self._asking(session_id, owner, into), self.storage)
        except BaseException as error:
            try:
                if isinstance(error, asyncio.CancelledError):
                    # The cancellation goes on at once; the place is freed in the background,
                    # and so is a lease a take cancelled while it ran in the storage's worker
                    # thread (which went on) may have taken: else the session stays held by a
                    # gone owner until the ttl lapses.
                    if isinstance(error, CallCancelled):
                        self._free_later(error.result, owner)
                    self._free_later(_never_held(session_id, owner), owner)
                elif _frees_place(error):
                    with suppress(Exception):
                        await self.storage.arelease_lease(_never_held(session_id, owner))
            finally:
                discard_live(owner)  # even when freeing the place is itself cancelled
            raise

    def release(self, lease: Lease) -> None:
        """Free the session (if `lease` still holds it) and wake local waiters."""
        run(_releasing(lease), self.storage)

    async def arelease(self, lease: Lease) -> None:
        """Async twin of `release`."""
        await arun(_releasing(lease), self.storage)

    def forget(self, lease: Lease) -> None:
        """Wake local waiters after `lease` was released inside a caller's transaction."""
        _released_by(lease.owner)

    def keep(self, lease: Lease) -> AbstractContextManager[None]:
        """Renew `lease` in the background while the block runs."""
        return renewing(partial(self.storage.renew_lease, lease, self.ttl), self.ttl)

    @contextmanager
    def hold(
        self, session_id: str, *, handback: Handback | None = None, prefetch: bool = False
    ) -> Iterator[Lease]:
        """Hold the session for the block: acquired (waiting), renewed, released.

        The block counts as the holder's own work: taking the session again inside it fails
        with `SessionBusyError`, except for a graph run it lends the lease to (`lending`).
        A lease the run freed itself (`handback.released`) is not released again. With
        `prefetch` (and a `handback`), the session is read with its lease into
        `handback.prefetched`, and refused when missing or archived (see `acquire`).
        """
        lease = self.acquire(session_id, into=_prefetch_into(handback, prefetch))
        try:
            with self.keep(lease), self.busy(lease):
                yield lease
        finally:
            run(_releasing(lease, handback), self.storage)

    @asynccontextmanager
    async def ahold(
        self, session_id: str, *, handback: Handback | None = None, prefetch: bool = False
    ) -> AsyncIterator[Lease]:
        """Async twin of `hold`."""
        lease = await self.aacquire(session_id, into=_prefetch_into(handback, prefetch))
        try:
            with self.keep(lease), self.busy(lease):
                yield lease
        finally:
            await arun(_releasing(lease, handback), self.storage)


def _releasing(lease: Lease, handback: Handback | None = None) -> Flow[None]:
    """Free the session, unless the run it was lent to freed it (`handback.released`), and
    wake local waiters."""
    try:
        if handback is None or not handback.released:
            yield Storage(SessionStorage.release_lease, lease)
    finally:
        _released_by(lease.owner)


def _never_held(session_id: str, owner: str) -> Lease:
    """What `release_lease` takes to free only `owner`'s next-to-hold place: no lease has
    token 0."""
    return Lease(session_id, owner, 0, 0.0)


def _frees_place(error: BaseException) -> bool:
    """Whether an asker that failed with `error` frees the place it may keep: not when the
    session is gone or the storage failed (a release would fail, or find nothing)."""
    return not isinstance(error, SessionNotFoundError | StorageError)


_freeing: dict[tuple[str, str, str], set[asyncio.Task[None]]] = {}
"""Releases of cancelled asks' leases and places, by `(scope, session, owner)`: kept alive
until they end, and waited for by an owner that asks again (`_after_frees`)."""


def _pending_frees() -> list[asyncio.Task[None]]:
    """Every release `_freeing` holds."""
    return [task for tasks in _freeing.values() for task in tasks]


def _freed(key: tuple[str, str, str], task: asyncio.Task[None]) -> None:
    tasks = _freeing.get(key, set())
    tasks.discard(task)
    if not tasks:
        _freeing.pop(key, None)
    if not task.cancelled():
        task.exception()  # retrieved: a release that failed leaves the lease to its ttl


def _prefetch_into(handback: Handback | None, prefetch: bool) -> Handback | None:
    if prefetch and handback is None:
        raise InvalidInputError("prefetch needs a handback to leave the session's read in.")
    return handback if prefetch else None


def _released_by(owner: str) -> None:
    discard_live(owner)
    _wake_waiters()


def _wait_released(pause: float) -> None:
    """Wait `pause` seconds, or less when this process releases a lease."""
    with _released:
        _released.wait(pause)


def _wake_waiters() -> None:
    with _released:
        _released.notify_all()
