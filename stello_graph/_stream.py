"""Stream objects returned by `Session.stream` / `astream`: text chunks, then `.result`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from types import TracebackType

from stello_graph.errors import StreamNotFinishedError
from stello_graph.models import SendResult

__all__ = ["AsyncSessionStream", "SessionStream"]


class SessionStream(Iterator[str]):
    """Iterates over the reply's text chunks (`str`); `result` is the `SendResult` afterwards.

    Example:
        >>> stream = session.stream("Hello")  # doctest: +SKIP
        >>> text = "".join(stream)  # doctest: +SKIP
        >>> stream.result.content == text  # doctest: +SKIP
        True
    """

    def __init__(self, source: Iterator[str | SendResult]) -> None:
        self._source = source
        self._result: SendResult | None = None

    def __iter__(self) -> SessionStream:
        return self

    def __next__(self) -> str:
        if self._result is not None:
            raise StopIteration
        item = next(self._source)
        if isinstance(item, SendResult):
            self._result = item
            raise StopIteration
        return item

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

    def close(self) -> None:
        """Stop early: nothing of the turn is committed and a pending insight is kept."""
        close = getattr(self._source, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> SessionStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncSessionStream(AsyncIterator[str]):
    """Async twin of `SessionStream`: `async for chunk in stream`, then `stream.result`."""

    def __init__(self, source: AsyncIterator[str | SendResult]) -> None:
        self._source = source
        self._result: SendResult | None = None

    def __aiter__(self) -> AsyncSessionStream:
        return self

    async def __anext__(self) -> str:
        if self._result is not None:
            raise StopAsyncIteration
        item = await anext(self._source)
        if isinstance(item, SendResult):
            self._result = item
            raise StopAsyncIteration
        return item

    @property
    def done(self) -> bool:
        return self._result is not None

    @property
    def result(self) -> SendResult:
        """The final `SendResult`; raises `StreamNotFinishedError` before the stream ends."""
        if self._result is None:
            raise StreamNotFinishedError(
                "The stream has not finished: iterate it to the end before reading .result."
            )
        return self._result

    async def aclose(self) -> None:
        """Stop early: nothing of the turn is committed and a pending insight is kept."""
        aclose = getattr(self._source, "aclose", None)
        if aclose is not None:
            await aclose()

    async def __aenter__(self) -> AsyncSessionStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
