"""Calling user functions that may be sync or async, from sync or async code.

Sync code calling an async function runs it on a private event loop in a worker thread (never
`asyncio.run` on the caller's thread: Jupyter already runs a loop there), in a copy of the
caller's context (LangGraph's run config, stello's session holds), as `asyncio.to_thread`
does the other way. Async code calling a sync function runs it in a worker thread so the
caller's loop is never blocked.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

from stello_graph.errors import StelloError

__all__ = ["call_async", "call_sync", "failing_as", "sync_tool"]

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

    context = contextvars.copy_context()
    thread = threading.Thread(
        target=context.run, args=(target,), name="stello-async-call", daemon=True
    )
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


def sync_tool(tool: Any) -> Any:
    """`tool`, runnable on a sync path too.

    An async-only tool (a `StructuredTool` with a coroutine and no function: `@tool async
    def`, `StructuredTool.from_function(coroutine=...)`, every MCP tool; or a bare async
    function, which LangGraph's `ToolNode` makes into one) refuses `invoke` with
    `NotImplementedError`. Its twin is a copy whose function runs the coroutine to the end
    on a private loop in a worker thread, in the caller's context (so `interrupt()` and the
    injected `ToolRuntime` work); name, description, argument schema and every other field
    are the tool's, and `ainvoke` still awaits the coroutine itself. Other tools are
    returned as they are.
    """
    from langchain_core.tools import BaseTool, StructuredTool
    from langchain_core.tools import tool as make_tool

    if not isinstance(tool, BaseTool) and _is_async(tool):
        tool = make_tool(tool)
    if isinstance(tool, StructuredTool) and tool.func is None and tool.coroutine is not None:
        return tool.model_copy(update={"func": _blocking(tool.coroutine)})
    return tool


def _blocking(coroutine: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    @functools.wraps(coroutine)  # the same signature and hints: LangChain reads them
    def run(*args: Any, **kwargs: Any) -> Any:
        return _run_in_thread(coroutine(*args, **kwargs))

    return run


@contextmanager
def failing_as(error: Callable[[Exception], StelloError]) -> Iterator[None]:
    """Any exception of the block but stello's own, raised again as `error(exc)` (a user
    function's or a model's failure, named for the operation it failed)."""
    try:
        yield
    except StelloError:
        raise
    except Exception as exc:
        raise error(exc) from exc
