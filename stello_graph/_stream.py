"""Stream objects returned by `Session.stream` / `astream`: text chunks, then `.result`;
`stoppable`, which lets the caller of a sync stream stop it at any moment; and
`in_own_context`, which lets any thread close it."""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator
from typing import Any, TypeVar

from stello_graph.errors import StreamNotFinishedError
from stello_graph.models import SendResult

__all__ = ["AsyncSessionStream", "SessionStream", "in_own_context", "stoppable"]

T = TypeVar("T")


def stoppable(
    make: Callable[[], Iterator[T]], stop: Callable[[], None]
) -> Generator[T, None, None]:
    """Iterate `make()` in a worker thread, so that its caller can stop at any moment.

    A sync LangGraph stream that is closed, or interrupted by Ctrl-C, while it waits for a
    node waits for that node to finish before it lets go. Here the caller only ever waits
    on a queue. The source is advanced only when the caller asks for the next item, as if
    the caller iterated it itself (a caller that stops reading stops the run). When it stops
    early (`close()`, or an exception such as KeyboardInterrupt while it waits), `stop()` is
    called, which must make the source end soon (cancel its model call), and the worker is
    waited for, so that what the source holds is released by the time this returns. The
    worker runs in a copy of the caller's context.
    """
    items: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
    wanted = threading.Semaphore(0)
    stopping = threading.Event()

    def produce() -> None:
        try:
            source = make()
            try:
                while wanted.acquire() and not stopping.is_set():
                    items.put((True, next(source)))
            finally:
                getattr(source, "close", lambda: None)()
        except StopIteration:
            items.put((False, None))
        except BaseException as exc:  # raised again in the caller's thread
            items.put((False, exc))

    context = contextvars.copy_context()
    worker = threading.Thread(target=context.run, args=(produce,), name="stello-stream")
    worker.daemon = True
    worker.start()
    ended = False
    try:
        while True:
            wanted.release()
            more, value = items.get()
            if more:
                yield value
                continue
            ended = True
            if value is not None:
                raise value
            return
    finally:
        if not ended:
            stopping.set()
            stop()
            wanted.release()
        worker.join()


def in_own_context(source: Generator[T, None, None]) -> Generator[T, None, None]:
    """`source`, each step run in a context of its own (a copy of its caller's).

    A sync stream holds its session (context variables set when it starts, reset when it
    ends) across its yields. Run in the caller's context, a stream closed from another
    thread (a UI's stop button) reset them in the closer's context, which raised
    `ValueError` there and left the session held in the starter's. Here they are set and
    reset in the stream's own context, whichever thread advances or closes it.
    """
    context = contextvars.copy_context()
    try:
        while True:
            try:
                item = context.run(next, source)
            except StopIteration:
                return
            yield item
    finally:
        context.run(source.close)


class _Ends:
    """What both streams share: the `SendResult` the stream ends with."""

    _result: SendResult | None = None

    @property
    def done(self) -> bool:
        """Whether the stream ended and the turn was committed."""
        return self._result is not None

    @property
    def result(self) -> SendResult:
        """The final `SendResult`; raises `StreamNotFinishedError` before the stream ends."""
        if self._result is None:
            raise StreamNotFinishedError(
                "The stream has not finished: iterate it to the end before reading .result."
            )
        return self._result


class SessionStream(_Ends, Iterator[str]):
    """Iterates over the reply's text chunks (`str`); `result` is the `SendResult` afterwards.

    Example:
        >>> stream = session.stream("Hello")  # doctest: +SKIP
        >>> text = "".join(stream)  # doctest: +SKIP
        >>> stream.result.content == text  # doctest: +SKIP
        True
    """

    def __init__(self, source: Generator[str | SendResult, None, None]) -> None:
        self._source = in_own_context(source)

    def __iter__(self) -> SessionStream:
        return self

    def __next__(self) -> str:
        if self._result is None:
            item = next(self._source)
            if not isinstance(item, SendResult):
                return item
            self._result = item
        raise StopIteration

    def close(self) -> None:
        """Stop early: nothing of the turn is committed and a pending insight is kept."""
        self._source.close()

    def __enter__(self) -> SessionStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncSessionStream(_Ends, AsyncIterator[str]):
    """Async twin of `SessionStream`: `async for chunk in stream`, then `stream.result`."""

    def __init__(self, source: AsyncGenerator[str | SendResult, None]) -> None:
        self._source = source

    def __aiter__(self) -> AsyncSessionStream:
        return self

    async def __anext__(self) -> str:
        if self._result is None:
            item = await anext(self._source)
            if not isinstance(item, SendResult):
                return item
            self._result = item
        raise StopAsyncIteration

    async def aclose(self) -> None:
        """Stop early: nothing of the turn is committed and a pending insight is kept."""
        await self._source.aclose()

    async def __aenter__(self) -> AsyncSessionStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
