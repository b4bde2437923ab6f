"""One lock, re-entrant transactions, and the sync/async drivers every storage call runs in.

A storage has one `threading.Lock`. Whoever holds it *owns* the storage: the thread of a sync
`transaction()`, or the asyncio task of an `atransaction()`. Ownership is a token kept in a
`ContextVar`, so storage calls made inside a transaction (from the same thread, from awaited
code of the same task, or from a thread started with a copy of that context such as
`asyncio.to_thread`) run inline instead of waiting for a lock their caller holds; every other
thread or task waits. A sync transaction also records its thread, so a thread that inherited a
copy of its context but runs concurrently with it waits too.

Each storage call is a flow of primitives (`_flows`), run here in one of three ways:

* sync: in the caller's thread (`drive` over the backend's `op_*`);
* async over a native async backend (an `AsyncStorageBackend`): on the event loop, awaiting
  its `aop_*` primitives and `AsyncTransactionHooks`;
* async over a sync-only backend (SQLite): in the storage's own worker thread, so backend I/O
  never runs on the event loop. One worker per storage: its connection is used by one thread
  at a time (under the lock), and it never waits for the lock itself. The calls of tasks
  (outside a transaction) are queued and run in order by one drain, under one taking of the
  lock by a leader task that waits for it on the loop: tasks asking at once share one
  hand-off to the worker and back.

Async callers wait for the lock on the loop (a future woken when it is released), never in a
thread: a task holding the lock can always get its work done. The owner's callers running at
once (tasks of an `asyncio.gather`, worker threads of `asyncio.to_thread`) take turns on the
inline lock for each call, and for the whole of a nested write (savepoints are a stack); a task
waits for it on the loop too, since a worker's statement on a native async backend runs on
that loop. A task cancelled while its
work runs in the worker waits for that work to end (a thread cannot be interrupted) before
it unwinds, so the lock is never released under a running statement.

The backend supplies the transaction primitives (`TransactionHooks`, and their async twins):
SQLite maps them to `BEGIN IMMEDIATE` / `SAVEPOINT`, PostgreSQL to its own transactions.

A nested block is a savepoint, except inside an all-or-nothing block (`savepoints=False`):
there nested blocks set none, and the first failure among them breaks the all-or-nothing
block, which then refuses every further call (its partial writes are still there: a read
would see, and a record cache keep, what the rollback is about to undo) and rolls back.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from stello_graph._cancelled import CallCancelled, running_loop
from stello_graph.checkpoints._primitives import Flow, adrive, drive
from stello_graph.checkpoints._queue import CallQueue
from stello_graph.checkpoints.backend import TransactionHooks
from stello_graph.errors import StorageError

if TYPE_CHECKING:
    from stello_graph.checkpoints.backend import AsyncTransactionHooks

__all__ = ["Transactions"]

P = ParamSpec("P")
T = TypeVar("T")

_OWNED: ContextVar[frozenset[object]] = ContextVar("stello_owned_transactions", default=frozenset())
"""Tokens of the transactions the current thread / task owns (of any storage)."""


@dataclass(slots=True)
class _Owner:
    token: object
    thread_id: int | None
    """The owning thread of a sync transaction; `None` for a task-owned async one."""
    loop: asyncio.AbstractEventLoop | None = None
    """The event loop of the owning task of an async transaction."""
    depth: int = 0
    nested: asyncio.Lock | None = None
    """Serialises the owner's concurrent nested writes on a native async backend (created on
    first use, on the owner's loop): savepoints are a stack, so two tasks of one transaction
    (`asyncio.gather` of writes) must not interleave theirs."""
    whole_at: int | None = None
    """The depth of the all-or-nothing block the owner is in (`savepoints=False`), if any:
    the blocks nested in it set no savepoint of their own, since its undo covers them."""
    broken: BaseException | None = None
    """What a block nested in the all-or-nothing one raised: that block is then undone as a
    whole, even if the failure was caught inside it, and takes no further call."""

    def refuse_broken(self) -> None:
        """Refuse a call in an all-or-nothing block whose nested block failed: its writes
        are still there (no savepoint undid them) until the block rolls back."""
        if self.broken is not None:
            raise StorageError(_BROKEN) from self.broken


_BROKEN = (
    "A block inside an all-or-nothing transaction (savepoints=False) failed and the failure "
    "was caught: the all-or-nothing block is rolled back and takes no further call."
)


class Transactions:
    """The lock of one storage, its transactions, and the drivers of its calls.

    Args:
        backend: the sync primitives (`op_*`), always present.
        hooks: their transaction hooks.
        abackend: the async primitives (`aop_*`) of a native async backend, or `None`.
        ahooks: their async transaction hooks (given together with `abackend`).
    """

    def __init__(
        self,
        backend: object,
        hooks: TransactionHooks,
        abackend: object | None = None,
        ahooks: AsyncTransactionHooks | None = None,
    ) -> None:
        self._backend = backend
        self._hooks = hooks
        self._abackend = abackend
        self._ahooks = ahooks
        self._lock = threading.Lock()
        # Serialises inline calls of owners running in two threads at once (a task-owned
        # transaction whose body awaits `asyncio.to_thread(storage.some_sync_method)`).
        self._inline = threading.RLock()
        self._owner: _Owner | None = None
        self._waiters: set[asyncio.Future[None]] = set()
        self._worker: ThreadPoolExecutor | None = None
        """Created on first use, by a caller holding the lock (so only once)."""
        self._queue = CallQueue(self._start_leader)
        """Async calls over a sync-only backend, run in order by the worker."""
        self._leaders: set[asyncio.Task[None]] = set()

    def has(self, primitive: Callable[..., object], *, in_async: bool = False) -> bool:
        """Whether the backend has the optional `primitive` (`in_async`: what an async call
        runs, its `aop_` twin on a native async backend)."""
        if in_async and self.native:
            return callable(getattr(self._abackend, f"a{primitive.__name__}", None))
        return callable(getattr(self._backend, primitive.__name__, None))

    @property
    def native(self) -> bool:
        """Whether async calls await the backend's async primitives (else: a worker thread)."""
        return self._ahooks is not None

    def owns(self) -> bool:
        """Whether the caller runs inside a transaction of this storage."""
        owner = self._owner
        return (
            owner is not None
            and owner.token in _OWNED.get()
            and (owner.thread_id is None or owner.thread_id == threading.get_ident())
        )

    # -- sync -----------------------------------------------------------------------------
    @contextmanager
    def transaction(self, *, savepoints: bool = True) -> Iterator[None]:
        """Atomic block: outermost = lock + begin/commit, nested = a savepoint.

        With `savepoints=False` the block is all or nothing: the blocks nested in it (every
        storage call) set no savepoint of their own, and when one fails the whole block is
        undone, even if the failure is caught inside it (`StorageError` on leaving it then).
        """
        if self.owns():
            # savepoints are a stack: a nested block of one of the owner's threads runs
            # whole before another caller of the owner (a task, a worker thread) opens its own
            with self._inline, self._savepoint(whole=not savepoints):
                yield
            return
        self._acquire()
        try:
            with self._outermost(whole=not savepoints):
                yield
        finally:
            self._release()

    def read(self, flow: Flow[T]) -> T:
        """Run `flow` under the lock (inline when the caller owns it)."""
        if self.owns():
            assert self._owner is not None
            self._owner.refuse_broken()
            return self._inline_read(flow)
        return self._locked(flow)

    def alone(self, flow: Flow[T]) -> T:
        """Run `flow`, an operation atomic by itself (`op_lease`, `op_commit_turn`): a
        nested write inside the caller's transaction; else under the lock, outside any
        transaction, for the backend to make its own (one round trip on PostgreSQL)."""
        return self.write(flow) if self.owns() else self._locked(flow)

    def _locked(self, flow: Flow[T]) -> T:
        self._acquire()
        try:
            return drive(flow, self._backend)
        finally:
            self._release()

    def write(self, flow: Flow[T]) -> T:
        """Run `flow` atomically: its own transaction, or a savepoint of the caller's."""
        with self.transaction():
            return drive(flow, self._backend)

    def close(self, fn: Callable[[], None]) -> None:
        """Run `fn` (closing the backend) once no transaction is running."""
        if self.owns():
            raise StorageError("A storage cannot be closed inside its own transaction.")
        self._acquire()
        try:
            fn()
            worker, self._worker = self._worker, None
        finally:
            self._release()
        if worker is not None:
            worker.shutdown(wait=False)

    # -- async ----------------------------------------------------------------------------
    @asynccontextmanager
    async def atransaction(self, *, savepoints: bool = True) -> AsyncIterator[None]:
        """The async twin of `transaction`: waiting and backend I/O never block the loop."""
        if self.owns():
            async with self._asavepoint(whole=not savepoints):
                yield
            return
        await self._alock()
        try:
            with self._owning(None, asyncio.get_running_loop(), whole=not savepoints) as owner:
                await self._abegin()
                try:
                    yield
                except BaseException:
                    await self._aend(commit=False)
                    raise
                await self._aend(commit=owner.broken is None)
                owner.refuse_broken()
        finally:
            self._release()

    async def aread(self, flow: Flow[T]) -> T:
        """`read` without blocking the loop."""
        if self.owns():
            assert self._owner is not None
            self._owner.refuse_broken()
            return await self._ainline(flow)
        return await self._alocked(flow)

    async def aalone(self, flow: Flow[T]) -> T:
        """`alone` without blocking the loop."""
        return await (self.awrite(flow) if self.owns() else self._alocked(flow))

    async def _alocked(self, flow: Flow[T]) -> T:
        if not self.native:
            return await self._aqueued(drive, flow, self._backend)
        await self._alock()
        try:
            with self._owning(None, asyncio.get_running_loop()):
                return await adrive(flow, self._abackend)
        finally:
            self._release()

    async def awrite(self, flow: Flow[T]) -> T:
        """`write` without blocking the loop."""
        if self.owns():
            if not self.native:
                return await self._in_worker(self._nested_write, flow)
            owner = self._owner
            assert owner is not None
            if owner.nested is None:
                owner.nested = asyncio.Lock()
            # the whole nested write holds `_inline`: a worker thread's nested write (a sync
            # call in `asyncio.to_thread`) must not interleave its savepoint with this one
            async with owner.nested, self._aheld_inline(), self._asavepoint():
                return await self._ainline(flow)
        if not self.native:
            return await self._aqueued(self._write_one, flow)
        async with self.atransaction():
            return await self._ainline(flow)

    # -- the lock -------------------------------------------------------------------------
    def _acquire(self) -> None:
        """Take the lock for a sync caller, refusing to wait where waiting cannot end."""
        if self._lock.acquire(blocking=False):
            return
        owner = self._owner
        if owner is not None and owner.loop is not None and owner.loop is running_loop():
            # The owning task runs on this very loop, which this call would block for good.
            raise StorageError(
                "A sync storage method was called on the event loop while a task of that "
                "loop holds `atransaction()`: it would wait forever. Await the async twin "
                "(`aget_session`, ...) instead."
            )
        self._lock.acquire()

    async def _alock(self) -> None:
        """Take the lock for a task: wait on the loop, woken by each release."""
        loop = asyncio.get_running_loop()
        while not self._lock.acquire(blocking=False):
            woken: asyncio.Future[None] = loop.create_future()
            self._waiters.add(woken)
            try:
                if self._lock.acquire(blocking=False):  # released before we were listed
                    return
                await woken
            finally:
                self._waiters.discard(woken)

    def _release(self) -> None:
        self._lock.release()
        for woken in tuple(self._waiters):
            _wake(woken)

    @contextmanager
    def _owning(
        self, thread_id: int | None, loop: asyncio.AbstractEventLoop | None, whole: bool = False
    ) -> Iterator[_Owner]:
        """Own the lock taken (the thread of a sync transaction, or the task on `loop`)."""
        owner = _Owner(object(), thread_id, loop, whole_at=0 if whole else None)
        self._owner = owner
        reset = _OWNED.set(_OWNED.get() | {owner.token})
        try:
            yield owner
        finally:
            _OWNED.reset(reset)
            self._owner = None

    # -- sync transaction steps -----------------------------------------------------------
    @contextmanager
    def _outermost(self, whole: bool = False) -> Iterator[None]:
        """Begin, own and commit the outermost transaction (the lock taken)."""
        self._hooks.begin(wait=True)
        with self._owning(threading.get_ident(), None, whole) as owner:
            try:
                yield
            except BaseException:
                self._end(commit=False)
                raise
            self._end(commit=owner.broken is None)
            owner.refuse_broken()

    def _end(self, *, commit: bool) -> None:
        with self._inline:
            if not commit:
                self._hooks.rollback()
                return
            try:
                self._hooks.commit()
            except BaseException:
                self._hooks.rollback()
                raise

    @contextmanager
    def _level(self, whole: bool) -> Iterator[tuple[_Owner, int | None]]:
        """A nested block of the owner (`whole`: an all-or-nothing one) and the depth of its
        savepoint; `None` inside an all-or-nothing block, whose undo covers it."""
        owner = self._owner
        assert owner is not None
        if owner.whole_at is not None:
            with _part_of_whole(owner, whole):
                yield owner, None
            return
        owner.depth += 1
        if whole:
            owner.whole_at = owner.depth
        try:
            yield owner, owner.depth
        finally:
            owner.depth -= 1
            if whole:
                owner.whole_at, owner.broken = None, None

    @contextmanager
    def _savepoint(self, whole: bool = False) -> Iterator[None]:
        with self._level(whole) as (owner, depth):
            if depth is None:
                yield
                return
            self._hook(TransactionHooks.savepoint, depth)
            try:
                yield
            except BaseException:
                self._hook(TransactionHooks.rollback_to, depth)
                raise
            self._hook(_leaving(owner), depth)
            owner.refuse_broken()

    # -- the queue of async calls (sync-only backends) ------------------------------------
    async def _aqueued(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(*args, **kwargs)` in the worker, through the queue. The calls queued while one
        runs are run under one taking of the lock (`_lead`): tasks asking at once (the leases
        of a gathered round of turns) cost one hand-off to the worker and back, not one each
        with the lock passed on in between. Cancelled before it runs, the call is taken off
        the queue; once it runs, as `_settle` says."""
        done = self._queue.put(fn, *args, **kwargs)
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            if self._queue.withdraw(done):
                raise
        return await self._settle(done, cancelled=True)

    def _start_leader(self, loop: asyncio.AbstractEventLoop) -> None:
        task = loop.create_task(self._lead(loop))
        self._leaders.add(task)
        task.add_done_callback(self._leaders.discard)

    async def _lead(self, loop: asyncio.AbstractEventLoop) -> None:
        """Take the lock on the loop, then have the worker drain the queue under it (the
        drain gives the lock back once the queue is empty)."""
        try:
            await self._alock()
        except BaseException:  # cancelled: the loop is going away
            self._queue.abandon(loop)
            raise
        try:
            self._submit(self._queue.drain, self._release)
        except BaseException:  # no worker (the loop's executor is going away)
            self._release()
            self._queue.abandon(loop)
            raise

    # -- what the worker thread runs (sync-only backends) ---------------------------------
    def _write_one(self, flow: Flow[T]) -> T:
        with self._outermost():
            return drive(flow, self._backend)

    def _nested_write(self, flow: Flow[T]) -> T:
        with self._inline, self._savepoint():
            return drive(flow, self._backend)

    def _inline_read(self, flow: Flow[T]) -> T:
        with self._inline:
            return drive(flow, self._backend)

    def _hook(self, hook: Callable[[TransactionHooks, int], None], depth: int) -> None:
        with self._inline:
            getattr(self._hooks, hook.__name__)(depth)

    async def _in_worker(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Await `fn` in the storage's worker thread, with the caller's context (ownership).

        Cancellation waits for `fn` to end, then raises `CancelledError`: the caller unwinds
        (releasing what it holds) only once nothing runs on its behalf.
        """
        return await self._settle(self._submit(fn, *args, **kwargs))

    def _submit(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> asyncio.Future[T]:
        worker = self._worker
        if worker is None:
            worker = self._worker = ThreadPoolExecutor(1, thread_name_prefix="stello-storage")
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return asyncio.get_running_loop().run_in_executor(worker, call)

    async def _settle(self, done: asyncio.Future[T], cancelled: bool = False) -> T:
        """The result of `done`; a cancellation meanwhile (or before: `cancelled`) is raised
        once `done` is, as a `CallCancelled` holding its result when it had one."""
        while not done.done():
            try:
                await asyncio.shield(done)
            except asyncio.CancelledError:
                cancelled = True
            except BaseException:
                break  # what `fn` raised: raised again below
        if cancelled:
            if done.cancelled() or done.exception() is not None:
                raise asyncio.CancelledError
            raise CallCancelled(done.result())
        return done.result()

    # -- async transaction steps ----------------------------------------------------------
    async def _abegin(self) -> None:
        if self._ahooks is not None:
            await self._ahooks.begin(wait=True)
            return
        try:
            await self._in_worker(self._hooks.begin, wait=True)
        except asyncio.CancelledError:
            # cancelled once the transaction had begun (or not: rolling back is harmless)
            await self._in_worker(self._end, commit=False)
            raise

    async def _aend(self, *, commit: bool) -> None:
        hooks = self._ahooks
        if hooks is None:
            await self._in_worker(self._end, commit=commit)
            return
        if not commit:
            await hooks.rollback()
            return
        try:
            await hooks.commit()
        except BaseException:
            await hooks.rollback()
            raise

    async def _ainline(self, flow: Flow[T]) -> T:
        """Run `flow` for the owner of the lock."""
        if not self.native:
            return await self._in_worker(self._inline_read, flow)
        async with self._aheld_inline():
            return await adrive(flow, self._abackend)

    async def _ahook(self, hook: Callable[[TransactionHooks, int], None], depth: int) -> None:
        """The savepoint `hook` (`TransactionHooks.savepoint`, ...) or its async twin."""
        if self._ahooks is None:
            await self._in_worker(self._hook, hook, depth)
            return
        async with self._aheld_inline():
            await getattr(self._ahooks, hook.__name__)(depth)

    @asynccontextmanager
    async def _aheld_inline(self) -> AsyncIterator[None]:
        """`_inline` for a task of the owner, waited for on the loop: a worker thread of the
        same transaction (`asyncio.to_thread(storage.some_sync_method)`) may hold it while
        its statement waits for this very loop to run it, so blocking the loop here would
        never end. Taken and released on the loop's thread (tasks of one loop share it, as
        before: the reentrant lock keeps out the other threads only)."""
        pause = 0.0005
        while not self._inline.acquire(blocking=False):
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.01)
        try:
            yield
        finally:
            self._inline.release()

    @asynccontextmanager
    async def _asavepoint(self, whole: bool = False) -> AsyncIterator[None]:
        with self._level(whole) as (owner, depth):
            if depth is None:
                yield
                return
            await self._ahook(TransactionHooks.savepoint, depth)
            try:
                yield
            except BaseException:
                await self._ahook(TransactionHooks.rollback_to, depth)
                raise
            await self._ahook(_leaving(owner), depth)
            owner.refuse_broken()


def _leaving(owner: _Owner) -> Callable[[TransactionHooks, int], None]:
    """The hook that ends a savepoint: undo it when a block nested in it failed."""
    return TransactionHooks.release if owner.broken is None else TransactionHooks.rollback_to


@contextmanager
def _part_of_whole(owner: _Owner, whole: bool) -> Iterator[None]:
    """A block nested in an all-or-nothing one: no savepoint; its failure breaks that one."""
    owner.refuse_broken()
    try:
        yield
    except BaseException as exc:
        owner.broken = owner.broken or exc
        raise
    if whole:  # an all-or-nothing block in another fails as that one does
        owner.refuse_broken()


def _wake(woken: asyncio.Future[None]) -> None:
    """Resolve a waiter's future from any thread (its loop may be another one, or closed)."""
    loop = woken.get_loop()
    if loop is running_loop():
        _resolve(woken)
        return
    with suppress(RuntimeError):  # a closed loop has no waiter left to wake
        loop.call_soon_threadsafe(_resolve, woken)


def _resolve(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)
