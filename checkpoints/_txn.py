"""One lock, re-entrant transactions, and the sync/async shells every storage call runs in.

A storage has one `threading.Lock`. Whoever holds it *owns* the storage: the thread of a sync
`transaction()`, or the asyncio task of an `atransaction()`. Ownership is a token kept in a
`ContextVar`, so storage calls made inside a transaction (from the same thread, from awaited
code of the same task, or from a thread started with a copy of that context such as
`asyncio.to_thread`) run inline instead of waiting for a lock their caller holds; every other
thread or task waits. A sync transaction also records its thread, so a thread that inherited a
copy of its context but runs concurrently with it waits too.

The backend supplies the transaction primitives (`TransactionHooks`): SQLite maps them to
`BEGIN IMMEDIATE` / `SAVEPOINT`, the in-memory storage to an undo log.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, ParamSpec, Protocol, TypeVar

from stello_graph.errors import StorageError

__all__ = ["TransactionHooks", "Transactions"]

P = ParamSpec("P")
T = TypeVar("T")

_OWNED: ContextVar[frozenset[object]] = ContextVar("stello_owned_transactions", default=frozenset())
"""Tokens of the transactions the current thread / task owns (of any storage)."""


class TransactionHooks(Protocol):
    """What a backend does at each transaction boundary; called with the lock held."""

    def begin(self, *, wait: bool) -> bool:
        """Open a write transaction; with `wait=False` return `False` instead of waiting."""
        ...

    def commit(self) -> None: ...

    def rollback(self) -> None: ...

    def savepoint(self, depth: int) -> None: ...

    def release(self, depth: int) -> None: ...

    def rollback_to(self, depth: int) -> None:
        """Undo everything since `savepoint(depth)` and drop that savepoint."""
        ...


@dataclass(slots=True)
class _Owner:
    token: object
    thread_id: int | None
    """The owning thread of a sync transaction; `None` for a task-owned async one."""
    loop: asyncio.AbstractEventLoop | None = None
    """The event loop of the owning task of an async transaction."""
    depth: int = 0


class Transactions:
    """The lock of one storage and the transactions run under it."""

    def __init__(self, hooks: TransactionHooks) -> None:
        self._hooks = hooks
        self._lock = threading.Lock()
        # Serialises inline calls of owners running in two threads at once (a task-owned
        # transaction whose body awaits `asyncio.to_thread(storage.some_sync_method)`).
        self._inline = threading.RLock()
        self._owner: _Owner | None = None

    def owns(self) -> bool:
        """Whether the caller runs inside a transaction of this storage."""
        owner = self._owner
        return (
            owner is not None
            and owner.token in _OWNED.get()
            and (owner.thread_id is None or owner.thread_id == threading.get_ident())
        )

    # -- transactions ---------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Atomic block: outermost = lock + begin/commit, nested = a savepoint."""
        if self.owns():
            with self._savepoint():
                yield
            return
        self._acquire()
        try:
            self._hooks.begin(wait=True)
            with self._owning(threading.get_ident()), self._committing():
                yield
        finally:
            self._lock.release()

    @asynccontextmanager
    async def atransaction(self) -> AsyncIterator[None]:
        """The async twin of `transaction`: never blocks the event loop while waiting."""
        if self.owns():
            with self._savepoint():
                yield
            return
        await self._acquire_and_begin()
        try:
            with self._owning(None, asyncio.get_running_loop()), self._committing():
                yield
        finally:
            self._lock.release()

    # -- the shells every storage call runs in --------------------------------------------
    def read(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run `fn` under the lock (inline when the caller owns it)."""
        if self.owns():
            with self._inline:
                return fn(*args, **kwargs)
        self._acquire()
        try:
            return fn(*args, **kwargs)
        finally:
            self._lock.release()

    def write(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run `fn` atomically: its own transaction, or a savepoint of the caller's."""
        with self.transaction():
            return fn(*args, **kwargs)

    async def aread(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`read` without blocking the loop: inline when the lock is free, else in a thread."""
        if self.owns():
            with self._inline:
                return fn(*args, **kwargs)
        if self._lock.acquire(blocking=False):
            try:
                return fn(*args, **kwargs)
            finally:
                self._lock.release()
        return await asyncio.to_thread(functools.partial(self.read, fn, *args, **kwargs))

    async def awrite(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`write` without blocking the loop: inline when nothing has to wait, else in a thread."""
        if self.owns():
            with self._savepoint():
                return fn(*args, **kwargs)
        if self._lock.acquire(blocking=False):
            try:
                if self._hooks.begin(wait=False):
                    with self._owning(threading.get_ident()), self._committing():
                        return fn(*args, **kwargs)
            finally:
                self._lock.release()
        return await asyncio.to_thread(functools.partial(self.write, fn, *args, **kwargs))

    def close(self, fn: Callable[[], None]) -> None:
        """Run `fn` (closing the backend) once no transaction is running."""
        if self.owns():
            raise StorageError("A storage cannot be closed inside its own transaction.")
        self._acquire()
        try:
            fn()
        finally:
            self._lock.release()

    # -- internals ------------------------------------------------------------------------
    def _acquire(self) -> None:
        """Take the lock for a sync caller, refusing to wait where waiting cannot end."""
        if self._lock.acquire(blocking=False):
            return
        owner = self._owner
        if owner is not None and owner.loop is not None and owner.loop is _running_loop():
            # The owning task runs on this very loop, which this call would block for good.
            raise StorageError(
                "A sync storage method was called on the event loop while a task of that "
                "loop holds `atransaction()`: it would wait forever. Await the async twin "
                "(`aget_session`, ...) instead."
            )
        self._lock.acquire()

    @contextmanager
    def _owning(
        self, thread_id: int | None, loop: asyncio.AbstractEventLoop | None = None
    ) -> Iterator[None]:
        owner = _Owner(object(), thread_id, loop)
        self._owner = owner
        reset = _OWNED.set(_OWNED.get() | {owner.token})
        try:
            yield
        finally:
            _OWNED.reset(reset)
            self._owner = None

    @contextmanager
    def _committing(self) -> Iterator[None]:
        try:
            yield
        except BaseException:
            with self._inline:
                self._hooks.rollback()
            raise
        with self._inline:
            try:
                self._hooks.commit()
            except BaseException:
                self._hooks.rollback()
                raise

    @contextmanager
    def _savepoint(self) -> Iterator[None]:
        owner = self._owner
        assert owner is not None
        owner.depth += 1
        depth = owner.depth
        try:
            with self._inline:
                self._hooks.savepoint(depth)
            try:
                yield
            except BaseException:
                with self._inline:
                    self._hooks.rollback_to(depth)
                raise
            with self._inline:
                self._hooks.release(depth)
        finally:
            owner.depth -= 1

    async def _acquire_and_begin(self) -> None:
        """Take the lock and begin, on the loop when nothing waits, else in a thread."""
        if self._lock.acquire(blocking=False):
            try:
                if self._hooks.begin(wait=False):
                    return
            except BaseException:
                self._lock.release()
                raise
            self._lock.release()
        await _in_thread_undoable(self._blocking_acquire_and_begin, undo=self._abandon)

    def _blocking_acquire_and_begin(self) -> None:
        self._lock.acquire()
        try:
            self._hooks.begin(wait=True)
        except BaseException:
            self._lock.release()
            raise

    def _abandon(self) -> None:
        """Undo `_blocking_acquire_and_begin` for a task that was cancelled meanwhile."""
        try:
            self._hooks.rollback()
        finally:
            self._lock.release()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def _in_thread_undoable(fn: Callable[[], None], *, undo: Callable[[], None]) -> None:
    """Await `fn` in a worker thread; if the caller is cancelled, `undo` it once it is done.

    A thread cannot be interrupted: without this, a cancelled `atransaction()` would leave
    the lock taken by its worker thread forever.
    """
    future = asyncio.ensure_future(asyncio.to_thread(fn))
    try:
        await asyncio.shield(future)
    except asyncio.CancelledError:

        def undo_if_done(done: asyncio.Future[Any]) -> None:
            if not done.cancelled() and done.exception() is None:
                undo()

        future.add_done_callback(undo_if_done)
        raise
