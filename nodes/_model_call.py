"""Bounding a turn's model calls: a time limit per call, and a retry policy for failures.

Both are off by default. `model_timeout` bounds each model call of a turn (provider clients
have timeouts of their own, but not all do, and a stalled call otherwise holds its session's
turn lock for good). `model_retry` is a LangGraph `RetryPolicy` for the `model` node that
judges the *provider's* exception (the `__cause__` of the `ModelCallError`), so its default
`retry_on` works as it does for any LangGraph node; a call that timed out is always
retryable. Nothing of a failed attempt is stored, so retrying never duplicates records.

A sync run can also be stopped from outside (`CallCancel`, passed in the run's config under
`CANCEL_KEY`; `StelloAgent.stream` does when its caller closes the stream or presses Ctrl-C).
LangGraph runs a sync run's nodes in worker threads and waits for the running ones when the
run ends early, so without it a streamed reply ran to its end first (and the provider never
saw the client go away). With it, the node waiting on its model call fails at once, and the
call itself stops at its next token, which closes the provider's HTTP stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Iterator, Sequence
from typing import Any, cast

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tracers.context import register_configure_hook
from langgraph.types import RetryPolicy

from stello_graph._base import SessionBase, ToolChoice
from stello_graph._validate import check_model_timeout
from stello_graph.config import check_retry_policy
from stello_graph.errors import ModelCallError

__all__ = [
    "CANCEL_KEY",
    "CallCancel",
    "ainvoke_model",
    "check_model_timeout",
    "invoke_model",
    "model_retry_policy",
    "run_cancel",
]

CANCEL_KEY = "stello_cancel"
"""The `configurable` key of a sync run's `CallCancel`."""


class CallCancel:
    """Stops the model calls of one sync run, at once and from any thread (`cancel()`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.cancelled = False
        """Whether `cancel()` was called; set once, never cleared."""
        self._waiters: set[threading.Event] = set()

    def cancel(self) -> None:
        """Stop the run's model call in flight (it fails) and any later one (it never starts)."""
        with self._lock:
            self.cancelled = True
            waiters = list(self._waiters)
        for waiter in waiters:
            waiter.set()

    @contextlib.contextmanager
    def waking(self, event: threading.Event) -> Iterator[None]:
        """Set `event` too when the run is cancelled, while the block runs."""
        with self._lock:
            self._waiters.add(event)
            if self.cancelled:
                event.set()
        try:
            yield
        finally:
            with self._lock:
                self._waiters.discard(event)


def run_cancel(config: RunnableConfig | None) -> CallCancel | None:
    """The `CallCancel` of the run `config` belongs to, if it has one."""
    found = ((config or {}).get("configurable") or {}).get(CANCEL_KEY)
    return found if isinstance(found, CallCancel) else None


class _StopOnCancel(BaseCallbackHandler):
    """Fails the model call at its next token once the run is cancelled: the provider's
    stream is then closed (LangChain closes the response as the exception unwinds)."""

    raise_error = True

    def __init__(self, cancel: CallCancel) -> None:
        self.cancel = cancel

    def on_llm_new_token(self, token: Any, **kwargs: Any) -> None:
        if self.cancel.cancelled:
            raise _Stopped()


class _Stopped(BaseException):
    """Raised inside a cancelled model call (whose result nobody reads any more).

    A `BaseException`, as `asyncio.CancelledError` is: LangChain's callback managers log
    every `Exception` a handler raises as a failing handler before raising it again.
    """


# every callback manager configured where this is set (the model call's thread) gets it
_stop_on_cancel: contextvars.ContextVar[_StopOnCancel | None] = contextvars.ContextVar(
    "stello_stop_on_cancel", default=None
)
register_configure_hook(_stop_on_cancel, inheritable=True)


def _timed_out(session: SessionBase, limit: float) -> ModelCallError:
    return ModelCallError(
        f"The model call of session {session.id!r} did not answer within "
        f"model_timeout={limit:g} s.",
        session_id=session.id,
    )


def _stopped(session: SessionBase) -> ModelCallError:
    return ModelCallError(
        f"The model call of session {session.id!r} was stopped: its run was cancelled "
        "(the stream was closed).",
        session_id=session.id,
    )


def invoke_model(
    session: SessionBase,
    prompt: Sequence[BaseMessage],
    limit: float | None,
    tool_choice: ToolChoice = None,
    cancel: CallCancel | None = None,
) -> AIMessage:
    """`session.invoke(prompt)`, given up after `limit` seconds or when `cancel` is set.

    A sync call cannot be interrupted from outside: it runs in a daemon thread (with the
    caller's context, so callbacks and LangGraph streaming still see it), which is
    abandoned on timeout. On `cancel` it is abandoned too, and stops at its next token.
    """
    if limit is None and cancel is None:
        return session.invoke(prompt, tool_choice=tool_choice)
    if cancel is not None and cancel.cancelled:
        raise _stopped(session)
    box: dict[str, Any] = {}
    done = threading.Event()
    context = contextvars.copy_context()
    if cancel is not None:
        context.run(_stop_on_cancel.set, _StopOnCancel(cancel))

    def call() -> None:
        try:
            box["reply"] = context.run(lambda: session.invoke(prompt, tool_choice=tool_choice))
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc
        finally:
            done.set()

    worker = threading.Thread(target=call, name="stello-model-call", daemon=True)
    with cancel.waking(done) if cancel is not None else contextlib.nullcontext():
        worker.start()
        finished = done.wait(limit)
    if cancel is not None and cancel.cancelled:
        raise _stopped(session)
    if not finished:
        assert limit is not None
        raise _timed_out(session, limit) from TimeoutError()
    if "error" in box:
        raise box["error"]
    return cast(AIMessage, box["reply"])


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
    if isinstance(retry_on, type | Sequence):  # exception types, or a callable judging one
        return isinstance(exc, retry_on if isinstance(retry_on, type) else tuple(retry_on))
    return bool(retry_on(exc))


def model_retry_policy(policy: RetryPolicy | None) -> RetryPolicy | None:
    """`policy` for the `model` node: it retries model failures only (not a session that
    was archived meanwhile, nor the tool-round limit), judged by the provider's exception.
    """
    policy = check_retry_policy(policy)
    if policy is None:
        return None
    retry_on = policy.retry_on

    def model_failure(exc: Exception) -> bool:
        if not isinstance(exc, ModelCallError):
            return False
        cause = exc.__cause__
        if isinstance(cause, TimeoutError):
            return True
        return isinstance(cause, Exception) and _accepts(retry_on, cause)

    return policy._replace(retry_on=model_failure)
