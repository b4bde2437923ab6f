"""Bounding a turn's model calls: a time limit per call, and a retry policy for failures.

Both are off by default. `model_timeout` bounds each model call of a turn (provider clients
have timeouts of their own, but not all do, and a stalled call otherwise holds its session's
turn lock for good). `model_retry` is a LangGraph `RetryPolicy` for the `model` node that
judges the *provider's* exception (the `__cause__` of the `ModelCallError`), so its default
`retry_on` works as it does for any LangGraph node; a call that timed out is always
retryable. Nothing of a failed attempt is stored, so retrying never duplicates records.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage
from langgraph.types import RetryPolicy

from stello_graph._base import SessionBase, ToolChoice
from stello_graph.errors import InvalidInputError, ModelCallError

__all__ = ["ainvoke_model", "check_model_timeout", "invoke_model", "model_retry_policy"]


def check_model_timeout(value: object) -> float | None:
    """`None`, or a positive number of seconds."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise InvalidInputError(f"model_timeout must be a number of seconds > 0, got {value!r}.")
    return float(value)


def _timed_out(session: SessionBase, limit: float) -> ModelCallError:
    return ModelCallError(
        f"The model call of session {session.id!r} did not answer within "
        f"model_timeout={limit:g} s.",
        session_id=session.id,
    )


def invoke_model(
    session: SessionBase,
    prompt: Sequence[BaseMessage],
    limit: float | None,
    tool_choice: ToolChoice = None,
) -> AIMessage:
    """`session.invoke(prompt)`, given up after `limit` seconds.

    A sync call cannot be cancelled: it runs in a daemon thread (with the caller's context,
    so callbacks and LangGraph streaming still see it), which is abandoned on timeout.
    """
    if limit is None:
        return session.invoke(prompt, tool_choice=tool_choice)
    box: dict[str, Any] = {}
    context = contextvars.copy_context()

    def call() -> None:
        try:
            box["reply"] = context.run(lambda: session.invoke(prompt, tool_choice=tool_choice))
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=call, name="stello-model-call", daemon=True)
    worker.start()
    worker.join(limit)
    if worker.is_alive():
        raise _timed_out(session, limit) from TimeoutError()
    if "error" in box:
        raise box["error"]
    reply: AIMessage = box["reply"]
    return reply


async def ainvoke_model(
    session: SessionBase,
    prompt: Sequence[BaseMessage],
    limit: float | None,
    tool_choice: ToolChoice = None,
) -> AIMessage:
    """Async twin of `invoke_model`; the call is cancelled when `limit` is reached."""
    if limit is None:
        return await session.ainvoke(prompt, tool_choice=tool_choice)
    try:
        async with asyncio.timeout(limit):
            return await session.ainvoke(prompt, tool_choice=tool_choice)
    except TimeoutError as exc:
        raise _timed_out(session, limit) from exc


def _accepts(retry_on: Any, exc: Exception) -> bool:
    if isinstance(retry_on, type):
        return isinstance(exc, retry_on)
    if isinstance(retry_on, Sequence):
        return isinstance(exc, tuple(retry_on))
    check: Callable[[Exception], bool] = retry_on
    return bool(check(exc))


def model_retry_policy(policy: RetryPolicy | None) -> RetryPolicy | None:
    """`policy` for the `model` node: it retries model failures only (not a session that
    was archived meanwhile, nor the tool-round limit), judged by the provider's exception.
    """
    if policy is None:
        return None
    if not isinstance(policy, RetryPolicy):
        raise InvalidInputError(
            f"model_retry must be a langgraph.types.RetryPolicy, got {type(policy).__name__}."
        )
    retry_on = policy.retry_on

    def model_failure(exc: Exception) -> bool:
        if not isinstance(exc, ModelCallError):
            return False
        cause = exc.__cause__
        if isinstance(cause, TimeoutError):
            return True
        return isinstance(cause, Exception) and _accepts(retry_on, cause)

    return policy._replace(retry_on=model_failure)
