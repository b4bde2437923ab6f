"""Async calls of sync code run in order by one drain in a worker thread.

Tasks of one event loop asking at once (the leases and checkpoint reads of a gathered round
of turns) would each cost a hand-off to a thread and back, every hand-off waiting for the GIL
that the loop holds. Here the calls queued while a drain runs are run by that same drain:
one hand-off serves them all. Used where the calls serialise anyway (one connection under
one lock), so running them in one thread loses no parallelism.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

__all__ = ["CallQueue"]

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(slots=True)
class _Queued:
    call: Callable[[], Any]
    done: asyncio.Future[Any]


class CallQueue:
    """A FIFO of calls, run by `drain` in a thread; `start(loop)` gets a drain going.

    `start` is called, on the caller's loop, when a call is queued and no drain is under
    way (nor about to be): it arranges for `drain()` to run in a thread, after whatever must
    come first (taking a lock). If it cannot, `abandon(loop)` hands the queue on.
    """

    def __init__(self, start: Callable[[asyncio.AbstractEventLoop], None]) -> None:
        self._start = start
        self._queued: deque[_Queued] = deque()
        self._lock = threading.Lock()
        self._leading = False
        """Whether a drain is under way or on its way."""

    def put(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> asyncio.Future[T]:
        """Queue `fn(*args, **kwargs)` with the caller's context; the future of its result
        (settled on the caller's loop; never cancelled unless its loop goes away first)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        with self._lock:
            self._queued.append(_Queued(call, done))
            lead, self._leading = not self._leading, True
        if lead:
            self._start(loop)
        return done

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`put` and await: `asyncio.to_thread` through the queue. Cancelled before it
        runs, the call is taken off the queue; cancelled while it runs, it goes on in its
        thread and its result is dropped (as with `to_thread`)."""
        done = self.put(fn, *args, **kwargs)
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            self.withdraw(done)
            raise

    def withdraw(self, done: asyncio.Future[Any]) -> bool:
        """Take the call of `done` off the queue, if it has not started (then `True`:
        `done` is cancelled)."""
        with self._lock:
            found = next((queued for queued in self._queued if queued.done is done), None)
            if found is not None:
                self._queued.remove(found)
        if found is None:
            return False
        done.cancel()
        return True

    def drain(self, ended: Callable[[], None] | None = None) -> None:
        """Run the queued calls in order, those queued meanwhile included (in a thread).
        `ended()` is called once the queue is empty, before the last result is posted: a
        caller resuming with it finds what the drain held (a lock) given back."""
        queued = self._next(ended)
        while queued is not None:
            settle: Callable[[asyncio.Future[Any], Any], None] = _succeed
            try:
                result = queued.call()
            except BaseException as exc:  # the caller's to raise
                result, settle = exc, _fail
            following = self._next(ended)
            _post(queued.done, settle, result)
            queued = following

    def _next(self, ended: Callable[[], None] | None) -> _Queued | None:
        """The next queued call; at the end of the queue `None`, after `ended()`."""
        with self._lock:
            if self._queued:
                return self._queued.popleft()
            self._leading = False
        if ended is not None:
            ended()
        return None

    def abandon(self, loop: asyncio.AbstractEventLoop) -> None:
        """A drain started from `loop` will not run (the loop is going away): cancel that
        loop's calls, and start one from the loop of the first call left."""
        with self._lock:
            mine = [queued for queued in self._queued if queued.done.get_loop() is loop]
            for queued in mine:
                self._queued.remove(queued)
            other = self._queued[0].done.get_loop() if self._queued else None
            self._leading = other is not None
        for queued in mine:
            queued.done.cancel()
        if other is not None:
            try:
                other.call_soon_threadsafe(self._start, other)
            except RuntimeError:  # closed too: nobody is left to wait for its calls
                self.abandon(other)


def _post(done: asyncio.Future[Any], settle: Callable[[Any, Any], None], value: Any) -> None:
    """Settle `done` on its loop, from the drain's thread (a closed loop waits for nothing)."""
    with suppress(RuntimeError):
        done.get_loop().call_soon_threadsafe(settle, done, value)


def _succeed(done: asyncio.Future[Any], result: Any) -> None:
    if not done.done():
        done.set_result(result)


def _fail(done: asyncio.Future[Any], exc: BaseException) -> None:
    if not done.done():
        done.set_exception(exc)
