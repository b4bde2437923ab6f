"""Calling user functions that may be sync or async, from sync or async code.

Sync code calling an async function runs it on a private event loop in a worker thread (never
`asyncio.run` on the caller's thread: Jupyter already runs a loop there). Async code calling a
sync function runs it in a worker thread so the caller's loop is never blocked.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

__all__ = ["call_async", "call_sync"]

T = TypeVar("T")


def _run_in_thread(awaitable: Awaitable[T]) -> T:
    box: dict[str, Any] = {}

    async def runner() -> None:
        box["value"] = await awaitable

    def target() -> None:
        try:
            asyncio.run(runner())
        except BaseException as exc:  # re-raised on the calling thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="stello-async-call", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return cast(T, box["value"])


def call_sync(fn: Callable[..., Any], *args: Any) -> Any:
    """Call `fn(*args)` from sync code; an awaitable result is awaited on a private loop."""
    result = fn(*args)
    if inspect.isawaitable(result):
        return _run_in_thread(result)
    return result


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
    )


async def call_async(fn: Callable[..., Any], *args: Any) -> Any:
    """Call `fn(*args)` from async code.

    An object with an `acall` method (the LLM-backed defaults) is called through it; an async
    function is awaited; a sync function runs in a worker thread.
    """
    acall = getattr(fn, "acall", None)
    if callable(acall):
        return await acall(*args)
    if _is_async(fn):
        return await fn(*args)
    result = await asyncio.to_thread(fn, *args)
    if inspect.isawaitable(result):
        return await result
    return result
