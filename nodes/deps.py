"""`StelloDeps`: what the stello nodes need at run time (storage, models, tools, scheduler).

The node factories in `stello_graph.nodes` close over one `StelloDeps`; `build_stello_graph`
makes one for you. Build one yourself to use the nodes in a graph of your own.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool
from langgraph.prebuilt import ToolNode
from langgraph.store.base import BaseStore
from langgraph.types import RetryPolicy

from stello_graph._base import SessionBase
from stello_graph._validate import check_id
from stello_graph.errors import InvalidInputError, SessionNotFoundError
from stello_graph.events import EventBus
from stello_graph.main_session import MainSession
from stello_graph.memory import ConsolidateFn, IntegrateFn
from stello_graph.models import SessionMeta
from stello_graph.nodes._model_call import check_model_timeout, model_retry_policy
from stello_graph.schedule import Schedule, Scheduler
from stello_graph.session import Session
from stello_graph.storage import MainStorage

__all__ = ["BUILTIN_TOOLS", "StelloDeps", "tool_error_message"]

BUILTIN_TOOLS = ("create_session",)
"""Names of the built-in tools a session's model can be given."""


def tool_error_message(exc: Exception) -> str:
    """What the model sees when a tool raises: the error, and an invitation to recover."""
    return f"Error: {type(exc).__name__}: {exc}. Fix the arguments or try another approach."


@dataclass(frozen=True, slots=True)
class _Overrides:
    model: BaseChatModel | None = None
    tools: tuple[Any, ...] | None = None


@dataclass(kw_only=True, eq=False)
class StelloDeps:
    """Run-time dependencies shared by the stello nodes.

    Attributes:
        storage: the tree's `MainStorage`.
        model: the default chat model of every session.
        tools: tools every session's model is given (LangChain tools or callables).
        builtin_tools: built-in tools to add (`"create_session"`).
        max_tool_rounds: tool rounds one turn may take before it fails.
        consolidate_fn: consolidate function of the consolidate node and the scheduler.
        integrate_fn: integrate function of the integrate node and the scheduler.
        schedule: background work after turns (`None`: none).
        store: a LangGraph store that L2, synthesis and insights are also published to.
        model_timeout: seconds each model call of a turn may take (`None`: no limit).
        model_retry: a LangGraph `RetryPolicy` for the turn's failed model calls.
        bus: where events go besides the `custom` stream.
    """

    storage: MainStorage
    model: BaseChatModel | None = None
    tools: Sequence[Any] = ()
    builtin_tools: Sequence[str] = BUILTIN_TOOLS
    max_tool_rounds: int = 8
    consolidate_fn: ConsolidateFn | None = None
    integrate_fn: IntegrateFn | None = None
    schedule: Schedule | None = None
    store: BaseStore | None = None
    model_timeout: float | None = None
    model_retry: RetryPolicy | None = None
    bus: EventBus = field(default_factory=EventBus)
    _overrides: dict[str, _Overrides] = field(default_factory=dict, init=False)
    _sessions: dict[str, SessionBase] = field(default_factory=dict, init=False)
    _tool_nodes: dict[tuple[int, ...], ToolNode] = field(default_factory=dict, init=False)
    _builtins: list[BaseTool] = field(default_factory=list, init=False)
    _scheduler: Scheduler | None = field(default=None, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.max_tool_rounds, int) or self.max_tool_rounds < 0:
            raise InvalidInputError(
                f"max_tool_rounds must be an int >= 0, got {self.max_tool_rounds!r}."
            )
        self.model_timeout = check_model_timeout(self.model_timeout)
        model_retry_policy(self.model_retry)  # refuses anything but a RetryPolicy
        unknown = [name for name in self.builtin_tools if name not in BUILTIN_TOOLS]
        if unknown:
            raise InvalidInputError(
                f"Unknown built-in tool(s) {unknown!r}; available: {list(BUILTIN_TOOLS)}."
            )
        from stello_graph.nodes.builtin_tools import make_builtin_tools

        self._builtins = make_builtin_tools(self, self.builtin_tools)
        if self.schedule is not None:
            self._scheduler = Scheduler(self.schedule, self.bus)

    @property
    def scheduler(self) -> Scheduler | None:
        return self._scheduler

    # -- per-session models and tools -------------------------------------------------------
    def override(
        self,
        session_id: str,
        *,
        model: BaseChatModel | None = None,
        tools: Sequence[Any] | None = None,
    ) -> None:
        """Give one session its own model and/or tools (kept in memory, not in storage)."""
        with self._lock:
            self._overrides[session_id] = _Overrides(
                model, tuple(tools) if tools is not None else None
            )
            self._sessions.pop(session_id, None)

    def session_model(self, session_id: str) -> BaseChatModel | None:
        found = self._overrides.get(session_id)
        return found.model if found is not None and found.model is not None else self.model

    def session_tools(self, session_id: str) -> list[Any]:
        """The tools a session's model is shown: its own (or the default ones) + built-ins."""
        found = self._overrides.get(session_id)
        own = found.tools if found is not None and found.tools is not None else self.tools
        return [*own, *self._builtins]

    def tool_node(self, session_id: str) -> ToolNode:
        """A `ToolNode` running the tools of `session_id` (cached per tool set)."""
        tools = self.session_tools(session_id)
        key = tuple(id(t) for t in tools)
        with self._lock:
            node = self._tool_nodes.get(key)
            if node is None:
                node = ToolNode(
                    tools, messages_key="pending", handle_tool_errors=tool_error_message
                )
                self._tool_nodes[key] = node
        return node

    # -- sessions ---------------------------------------------------------------------------
    def _make(self, meta: SessionMeta) -> SessionBase:
        model = self.session_model(meta.id)
        tools = self.session_tools(meta.id)
        if meta.role == "main":
            return MainSession(
                meta, self.storage, model=model, tools=tools, integrate_fn=self.integrate_fn
            )
        return Session(
            meta, self.storage, model=model, tools=tools, consolidate_fn=self.consolidate_fn
        )

    def _cached(self, session_id: str, meta: SessionMeta | None) -> SessionBase:
        if meta is None:
            raise SessionNotFoundError(session_id)
        with self._lock:
            found = self._sessions.get(session_id)
            if found is None:
                found = self._sessions[session_id] = self._make(meta)
        return found

    def session(self, session_id: object) -> SessionBase:
        """The `Session` or `MainSession` object for `session_id` (cached)."""
        sid = check_id(session_id)
        with self._lock:
            found = self._sessions.get(sid)
        if found is not None:
            return found
        return self._cached(sid, self.storage.get_session(sid))

    async def asession(self, session_id: object) -> SessionBase:
        """Async twin of `session`."""
        sid = check_id(session_id)
        with self._lock:
            found = self._sessions.get(sid)
        if found is not None:
            return found
        return self._cached(sid, await self.storage.aget_session(sid))

    def forget(self, session_id: str) -> None:
        """Drop cached objects of a session (after it was removed)."""
        with self._lock:
            self._sessions.pop(session_id, None)
            self._overrides.pop(session_id, None)
