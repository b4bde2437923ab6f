"""`StelloMiddleware`: a stello session behind LangChain v1's `create_agent`.

The agent keeps running as LangChain runs it (its model, its tools, its other middleware);
the middleware gives each run a session of a stello tree and the session's context:

* The run's session is the one its `StelloContext` names (LangGraph's `context=`), else the
  thread's: a thread's first run makes a new child of the main session, labelled from its
  first message, and later runs on the thread continue it (the binding is kept in the
  agent's state, `stello_session_id`).
* Every model call is shown what a stello turn shows (the session's system message with its
  insight and compression summary, L3 with tool-call groups whole) and then the run's own
  messages; the agent's own system prompt comes first.
* At the run's end its messages are committed to L3 in one storage call, under the session's
  lease; a run that fails or stops at an interrupt commits nothing and keeps the insight.
* `trim_state=True` keeps only the current run's messages in the agent's state: L3 holds
  the whole conversation, so checkpoints stay as large as one run.

Example:
    >>> from langchain.agents import create_agent
    >>> from stello_graph.checkpoints import InMemoryMainStorage
    >>> from stello_graph.testing import ScriptedChatModel
    >>> from langgraph.checkpoint.memory import InMemorySaver
    >>> stello = StelloMiddleware(storage=InMemoryMainStorage())
    >>> agent = create_agent(ScriptedChatModel(default="Hi!"), [], middleware=[stello],
    ...                      checkpointer=InMemorySaver())
    >>> out = agent.invoke({"messages": [{"role": "user", "content": "Hello"}]},
    ...                    {"configurable": {"thread_id": "t1"}})
    >>> [m.text for m in stello.session(out["stello_session_id"]).messages()]
    ['Hello', 'Hi!']
"""

from __future__ import annotations

import os
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Annotated, Any, NotRequired

from langchain.agents.middleware.types import (
    AgentMiddleware,
    AgentState,
    ModelRequest,
    ModelResponse,
    OmitFromInput,
    PrivateStateAttr,
)
from langchain_core.messages import BaseMessage, RemoveMessage, SystemMessage
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from langgraph.runtime import Runtime
from typing_extensions import Unpack

from stello_graph._base import TurnContext
from stello_graph._context import message_text, sanitize_history
from stello_graph._flow import Call, Flow, arun, run
from stello_graph.config import StelloConfig, StelloSettings
from stello_graph.errors import InvalidInputError, StelloError
from stello_graph.main_session import MainSession
from stello_graph.nodes._commit import make_commit_node
from stello_graph.nodes.builtin_tools import CreateSessionArgs, _description
from stello_graph.nodes.deps import StelloRuntime, tool_error_message
from stello_graph.nodes.ops import arun_fork, run_fork
from stello_graph.nodes.state import StelloContext
from stello_graph.schedule import BackgroundFailure, kept_failures
from stello_graph.session import Session
from stello_graph.storage import MainStorage

__all__ = ["StelloContext", "StelloMiddleware", "StelloMiddlewareState"]

_LABEL = 60  # characters of the first message a thread's session is labelled with


class StelloMiddlewareState(AgentState[Any]):
    """The agent's state, with the thread's session and where its uncommitted run begins."""

    stello_session_id: NotRequired[Annotated[str, OmitFromInput]]
    stello_start: NotRequired[Annotated[int, PrivateStateAttr]]
    stello_insight: NotRequired[Annotated[str | None, PrivateStateAttr]]
    stello_tree_id: NotRequired[Annotated[str, PrivateStateAttr]]


def _named(runtime: Runtime[Any] | None, key: str) -> str | None:
    context = getattr(runtime, "context", None)
    value = context.get(key) if isinstance(context, dict) else getattr(context, key, None)
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise InvalidInputError(f"StelloContext {key!r} must be a non-empty string, got {value!r}.")
    return value


def _label(messages: Sequence[BaseMessage]) -> str:
    text = " ".join(message_text(messages[0].content).split()) if messages else ""
    return (text[: _LABEL - 1] + "…" if len(text) > _LABEL else text) or "Thread"


class StelloMiddleware(AgentMiddleware[AgentState[Any], Any]):
    """A stello session per thread (or per `StelloContext`) for `create_agent`.

    Args:
        storage: a `MainStorage`, a SQLite path or a `postgresql://` URL (as `StelloAgent`
            takes it); a path or URL opens whichever tree a run's `StelloContext` names.
        trim_state: keep only the current run's messages in the agent's state.
        config: the settings (`StelloConfig`). The agent's own model answers and its own
            tools run; the middleware uses `model` (a chat model or its `"provider:model"`
            name) for compression and the memory functions, and `consolidate_fn`,
            `integrate_fn`, `schedule`, `compression`, `store`, `profiles`, `split_guard`,
            `unique_labels`, `topology_slot`, `lease_ttl`, `tree_id` (the tree a path
            opens by default) and, for a tree it creates, `system_prompt` and `main_label`.
        **settings: fields of `StelloConfig` as keywords, overriding `config`'s.

    Call `close` (or use it as a context manager) to finish background work and close the
    storage it opened.
    """

    state_schema = StelloMiddlewareState

    def __init__(
        self,
        *,
        storage: MainStorage | str | os.PathLike[str] | None = None,
        trim_state: bool = False,
        config: StelloConfig | None = None,
        **settings: Unpack[StelloSettings],
    ) -> None:
        super().__init__()
        self._config = StelloConfig.merge(config, settings)
        self._storage = storage
        self._trim = trim_state
        self._runtimes: dict[str, tuple[StelloRuntime, str]] = {}
        self._lock = threading.Lock()
        tree = self._tree(None)[0]  # a bad storage or tree fails here, not in the first run
        self.tools = [] if tree._builtins._create is None else [self._create_session_tool(tree)]

    # -- the tree and the run's session -----------------------------------------------------
    def _tree(self, tree_id: str | None) -> tuple[StelloRuntime, str]:
        """The runtime and main session id of `tree_id` (default: the middleware's tree)."""
        tree = tree_id or self._config.tree_id
        with self._lock:  # two first runs on a tree open it once
            if tree not in self._runtimes:
                self._runtimes[tree] = self._open(tree)
        return self._runtimes[tree]

    def _open(self, tree: str) -> tuple[StelloRuntime, str]:
        """Open a tree of the storage, creating its main session if it has none."""
        from stello_graph.agent import _open_tree

        given = self._storage
        if not isinstance(given, str | os.PathLike | None) and given.tree_id != tree:
            raise InvalidInputError(
                f"StelloContext names tree {tree!r}, but the middleware's storage holds "
                f"tree {given.tree_id!r}: pass a path or URL to open any tree."
            )
        with _open_tree(given, self._config, tree) as opened:
            return opened

    def drain(self, timeout: float | None = None) -> bool:
        """Wait for the schedule's background work; False on timeout."""
        scheduled = [r.scheduler for r, _ in self._runtimes.values() if r.scheduler is not None]
        drained = [scheduler.drain(timeout) for scheduler in scheduled]  # each one, always
        return all(drained)

    def failures(self, tree_id: str | None = None) -> list[BackgroundFailure]:
        """The schedule's failures kept so far in a tree (default: the middleware's)."""
        runtime = self._tree(tree_id)[0]
        return run(kept_failures(runtime.scheduler), runtime.storage)

    def close(self) -> None:
        """Finish background work; close the storages opened from a path or URL."""
        for runtime, _ in self._runtimes.values():
            runtime.close(storage=not hasattr(self._storage, "get_tree"))
        self._runtimes.clear()

    def __enter__(self) -> StelloMiddleware:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def session(self, session_id: str, tree_id: str | None = None) -> Session | MainSession:
        """The `Session` (or `MainSession`) of a session of a tree (default: the middleware's).

        Raises:
            SessionNotFoundError: the tree has no such session.
        """
        found = self._tree(tree_id)[0].session(session_id)
        assert isinstance(found, Session | MainSession)
        return found

    def _start(self, state: Mapping[str, Any]) -> int:
        return min(int(state.get("stello_start") or 0), len(state["messages"]))

    def _run_tree(self, state: Mapping[str, Any]) -> StelloRuntime:
        """The tree of the run under way (a resumed run names no context again)."""
        return self._tree(state.get("stello_tree_id"))[0]

    def _opened(
        self, state: Mapping[str, Any], tree: StelloRuntime, sid: str, insight: str | None
    ) -> dict[str, Any]:
        update: dict[str, Any] = {"stello_session_id": sid, "stello_insight": insight}
        update["stello_tree_id"] = tree.storage.tree_id
        if self._trim:
            run = state["messages"][self._start(state) :]
            update["messages"] = [RemoveMessage(id=REMOVE_ALL_MESSAGES), *run]
            update["stello_start"] = 0
        return update

    def _fork_state(self, state: Mapping[str, Any], main: str) -> Any:
        label = _label(state["messages"][self._start(state) :])
        return {"session_id": main, "fork": {"label": label}}

    def _bound(
        self, state: Mapping[str, Any], runtime: Runtime[Any]
    ) -> tuple[StelloRuntime, str, str | None]:
        """The run's tree, its main session, and the session the run names or the thread
        is bound to (`None`: a new one to fork)."""
        named, bound = _named(runtime, "tree_id"), state.get("stello_tree_id")
        tree, main = self._tree(named or bound)
        same = named is None or tree.storage.tree_id == bound
        sid = _named(runtime, "session_id") or (state.get("stello_session_id") if same else None)
        return tree, main, sid

    def before_agent(
        self, state: Mapping[str, Any], runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        tree, main, sid = self._bound(state, runtime)
        if sid is None:
            sid = run_fork(tree, self._fork_state(state, main))["forked"]["session_id"]
        insight = tree.session(sid).open_turn(operation="an agent run")
        return self._opened(state, tree, sid, insight)

    async def abefore_agent(
        self, state: Mapping[str, Any], runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        tree, main, sid = self._bound(state, runtime)
        if sid is None:
            forked = await arun_fork(tree, self._fork_state(state, main))
            sid = forked["forked"]["session_id"]
        session = await tree.asession(sid)
        return self._opened(state, tree, sid, await session.aopen_turn(operation="an agent run"))

    # -- the model's create_session (`stello_graph.nodes.builtin_tools`) ---------------------
    def _create_session(self, args: Mapping[str, Any]) -> Flow[dict[str, str] | str]:
        state = args["state"]
        builtins = self._run_tree(state)._builtins
        # the tool's arguments as the turn graph's `create_session` takes them
        run = {"session_id": state["stello_session_id"], "pending": self._records(state)}
        fork = {**args, "state": run}
        try:
            forked: dict[str, str] = yield Call(builtins._fork, builtins._afork, (fork,))
            return forked
        except StelloError as exc:  # the model reads it and can try again
            return tool_error_message(exc)

    def _create_session_tool(self, tree: StelloRuntime) -> BaseTool:
        def create_session(**args: Any) -> dict[str, str] | str:
            return run(self._create_session(args), None)

        async def acreate_session(**args: Any) -> dict[str, str] | str:
            return await arun(self._create_session(args), None)

        return StructuredTool.from_function(
            func=create_session,
            coroutine=acreate_session,
            name="create_session",
            description=_description(tree),
            args_schema=CreateSessionArgs,
        )

    # -- the model call ---------------------------------------------------------------------
    def _request(self, request: ModelRequest, ctx: TurnContext) -> ModelRequest:
        state: Any = request.state
        run = sanitize_history(request.messages[self._start(state) :])
        parts = [m.text for m in (request.system_message, ctx.system) if m is not None]
        system = SystemMessage("\n\n".join(parts)) if parts else None
        messages: list[Any] = [*ctx.history, *run]
        return request.override(messages=messages, system_message=system)

    def wrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]
    ) -> ModelResponse:
        state: Any = request.state
        session = self._run_tree(state).session(state["stello_session_id"])
        insight = state.get("stello_insight")
        ctx = session.turn_context(operation="an agent run", insight=insight)
        return handler(self._request(request, ctx))

    async def awrap_model_call(
        self,
        request: ModelRequest,
        handler: Callable[[ModelRequest], Awaitable[ModelResponse]],
    ) -> ModelResponse:
        state: Any = request.state
        session = await self._run_tree(state).asession(state["stello_session_id"])
        insight = state.get("stello_insight")
        ctx = await session.aturn_context(operation="an agent run", insight=insight)
        return await handler(self._request(request, ctx))

    # -- the commit: the `commit` node (`stello_graph.nodes._commit`) ---------------------
    def _records(self, state: Mapping[str, Any]) -> list[BaseMessage]:
        """The run's messages, whole tool-call groups only (a run that failed or was left at
        an interrupt before this one leaves its messages to it, its open calls dropped)."""
        return sanitize_history(state["messages"][self._start(state) :])

    def _turn(self, state: Mapping[str, Any]) -> dict[str, Any] | None:
        """The `commit` node's state of the run's turn; `None`: the run has nothing to commit."""
        records = self._records(state)
        if not records:
            return None
        sid, insight = state["stello_session_id"], state.get("stello_insight")
        return {"session_id": sid, "pending": records, "insight": insight}

    def after_agent(self, state: Mapping[str, Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        turn = self._turn(state)
        if turn is not None:
            make_commit_node(self._run_tree(state)).func(turn)
        return {"stello_start": len(state["messages"]), "stello_insight": None}

    async def aafter_agent(
        self, state: Mapping[str, Any], runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        turn = self._turn(state)
        if turn is not None:
            await make_commit_node(self._run_tree(state)).afunc(turn)
        return {"stello_start": len(state["messages"]), "stello_insight": None}
