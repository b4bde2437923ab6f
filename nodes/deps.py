"""`StelloRuntime`: what the stello nodes share at run time (settings, caches, scheduler).

The node factories in `stello_graph.nodes` close over one `StelloRuntime`;
`build_stello_graph` makes one for you. Build one yourself to use the nodes in a graph of your own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

from langchain_core.language_models import BaseChatModel
from langgraph.prebuilt import ToolNode
from langgraph.store.base import BaseStore
from langgraph.types import RetryPolicy
from typing_extensions import Unpack

from stello_graph._base import SessionBase
from stello_graph._calls import sync_tool
from stello_graph._claims import JobClaims
from stello_graph._flow import Flow, Storage, arun, run
from stello_graph._validate import check_chat_model, check_id, check_tools
from stello_graph.compression import CompressionPolicy
from stello_graph.config import BUILTIN_TOOLS, StelloConfig, StelloSettings
from stello_graph.errors import (
    FunctionNotConfiguredError,
    InvalidInputError,
    SessionNotFoundError,
)
from stello_graph.events import EventBus
from stello_graph.lease import SessionLeases
from stello_graph.main_session import FINAL_L2S_KEY, MainSession, final_ids
from stello_graph.memory import (
    CompressFn,
    ConsolidateFn,
    IntegrateFn,
    llm_compressor,
    llm_consolidator,
    llm_integrator,
)
from stello_graph.models import SessionMeta
from stello_graph.nodes.forking import PROFILE_KEY, SKILLS_KEY
from stello_graph.profiles import ForkProfile, SplitGuard, UnknownProfileError
from stello_graph.schedule import Schedule, Scheduler, StorageFailureLog
from stello_graph.session import Session
from stello_graph.skills import Skill
from stello_graph.storage import MainStorage, SessionSnapshot

__all__ = ["BUILTIN_TOOLS", "StelloDeps", "StelloRuntime", "tool_error_message"]


def tool_error_message(exc: Exception) -> str:
    """What the model sees when a tool raises: the error, and an invitation to recover."""
    detail = str(exc).rstrip(". \n")
    return f"Error: {type(exc).__name__}: {detail}. Fix the arguments or try another approach."


def _shape(settings: Mapping[str, Any]) -> tuple[Any, ...]:
    """The stored settings a session object is built from: its profile and skills allow-list.

    Other settings (the split guard's bookkeeping, say) change often and shape nothing.
    """
    return settings.get(PROFILE_KEY), settings.get(SKILLS_KEY)


@dataclass(frozen=True, slots=True)
class _Cached:
    session: SessionBase
    shape: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class _Overrides:
    model: BaseChatModel | None = None
    tools: tuple[Any, ...] | None = None


class StelloRuntime:
    """What the stello nodes share at run time: the settings, and the state that changes.

    The settings are one frozen `StelloConfig` (`runtime.config`; each of its fields reads
    as an attribute too, `runtime.model`, ...). The runtime alone holds what changes while
    the graph runs: the cached session objects and tool nodes, per-session overrides, the
    registered profiles, the event bus, the scheduler and the session leases. Nobody
    configures it: `build_stello_graph` and `StelloAgent` make one from their config.

    Args:
        storage: the tree's `MainStorage`.
        config: the settings (default: `StelloConfig()`).
        bus: where events go besides the `custom` stream (default: a new `EventBus`).
        **settings: fields of `StelloConfig`, overriding `config`'s.
    """

    def __init__(
        self,
        storage: MainStorage,
        config: StelloConfig | None = None,
        *,
        bus: EventBus | None = None,
        **settings: Unpack[StelloSettings],
    ) -> None:
        self.config: StelloConfig = StelloConfig.merge(config, settings)
        """The settings (frozen)."""
        self.storage: MainStorage = storage
        self.bus: EventBus = EventBus() if bus is None else bus
        model = self.model
        self.consolidate_fn: ConsolidateFn | None = self.config.consolidate_fn or (
            llm_consolidator(model) if model is not None else None
        )
        """The consolidate function (the config's, else LLM-backed with the model)."""
        self.integrate_fn: IntegrateFn | None = self.config.integrate_fn or (
            llm_integrator(model) if model is not None else None
        )
        """The integrate function (the config's, else LLM-backed with the model)."""
        self.profile_map: dict[str, ForkProfile] = self.config.profile_map()
        """The registered profiles, by name."""
        self.skill_map: dict[str, Skill] = self.config.skill_map()
        """The registered skills, by name."""
        self.leases = SessionLeases(self.storage, ttl=self.config.lease_ttl)
        """The session leases that serialise turns (`stello_graph.lease`)."""
        self._overrides: dict[str, _Overrides] = {}
        self._sessions: dict[str, _Cached] = {}
        self._tool_nodes: dict[tuple[int, ...], ToolNode] = {}
        self._lock = threading.RLock()
        self._runs = 0
        from stello_graph.nodes.builtin_tools import BuiltinTools

        self._builtins = BuiltinTools(self)
        self._scheduler: Scheduler | None = None
        if self.config.schedule is not None:
            log, claims = StorageFailureLog(storage), JobClaims(storage, ttl=self.lease_ttl)
            self._scheduler = Scheduler(self.config.schedule, self.bus, log, claims=claims)
            from stello_graph.nodes.scheduling import recover

            self._scheduler.recover(lambda: recover(self))

    # -- runs in flight ----------------------------------------------------------------------
    @property
    def runs(self) -> int:
        """How many runs of graphs built on this runtime are in flight (`running`)."""
        return self._runs

    @contextmanager
    def running(self) -> Iterator[None]:
        """Count one run in flight while the block runs (`runs`). The compiled graph of
        `build_graph` counts each of its runs here, so whoever closes a runtime's storage
        (the server's `stello_graph.server`, closing trees nobody uses) can tell a tree a
        run still uses from an idle one."""
        with self._lock:
            self._runs += 1
        try:
            yield
        finally:
            with self._lock:
                self._runs -= 1

    # -- the settings, read-only (documented on `StelloConfig`) ---------------------------
    @property
    def model(self) -> BaseChatModel | None:
        return cast("BaseChatModel | None", self.config.model)  # a name is built by then

    @property
    def tools(self) -> tuple[Any, ...]:
        return tuple(self.config.tools)

    @property
    def builtin_tools(self) -> Sequence[str]:
        return self.config.builtin_tools

    @property
    def max_tool_rounds(self) -> int:
        return self.config.max_tool_rounds

    @property
    def schedule(self) -> Schedule | None:
        return self.config.schedule

    @property
    def store(self) -> BaseStore | None:
        return self.config.store

    @property
    def split_guard(self) -> SplitGuard | None:
        return self.config.split_guard

    @property
    def compression(self) -> CompressionPolicy | None:
        return self.config.compression

    @property
    def model_timeout(self) -> float | None:
        return self.config.model_timeout

    @property
    def model_retry(self) -> RetryPolicy | None:
        return self.config.model_retry

    @property
    def lease_ttl(self) -> float:
        return self.config.lease_ttl

    @property
    def scheduler(self) -> Scheduler | None:
        return self._scheduler

    def close(self, *, storage: bool = True) -> None:
        """Finish the scheduler's queued background jobs and stop it, then close the storage
        (`storage=False`: leave it open, for whoever opened it)."""
        if self._scheduler is not None:
            self._scheduler.close(wait=True)
        if storage:
            self.storage.close()

    def hold_final_l2(self, session_id: str) -> None:
        """Have the next integration (scheduled or called, flat or tree, in any process) bring
        this archived session's final L2 (see `on_archive`). Kept with the tree, so a process that
        stops before that integration leaves the note for the next one."""
        s = self.storage
        with s.transaction():
            held = set(final_ids(s.get_global(FINAL_L2S_KEY)))
            s.put_global(FINAL_L2S_KEY, sorted(held | {session_id}))

    def final_l2s(self) -> list[str]:
        """The archived sessions whose final L2 no integration has included yet."""
        return final_ids(self.storage.get_global(FINAL_L2S_KEY))

    def integrate_function(self) -> IntegrateFn:
        """The integrate function, or a clear error when none was given."""
        if self.integrate_fn is None:
            raise FunctionNotConfiguredError(
                "No integrate function: pass integrate_fn= (e.g. llm_integrator(model))."
            )
        return self.integrate_fn

    def compress_function(self) -> CompressFn:
        """The compress function of `context="compress"` forks, or a clear error."""
        if self.compression is not None and self.compression.compress_fn is not None:
            return self.compression.compress_fn
        if self.model is None:
            raise FunctionNotConfiguredError(
                "A fork with context='compress' needs a compress function: pass "
                "compression=CompressionPolicy(compress_fn=...) or a model."
            )
        return llm_compressor(self.model)

    # -- profiles ---------------------------------------------------------------------------
    def profile(self, name: str) -> ForkProfile:
        """The registered profile `name`."""
        found = self.profile_map.get(name)
        if found is None:
            raise UnknownProfileError(name, sorted(self.profile_map))
        return found

    def register_profile(self, profile: ForkProfile) -> None:
        """Add (or replace) a profile; models see it in `create_session` from now on."""
        if not isinstance(profile, ForkProfile):
            raise InvalidInputError(f"Expected a ForkProfile, got {type(profile).__name__}.")
        with self._lock:
            self.profile_map[profile.name] = profile
            self._builtins.refresh()
            self._sessions.clear()

    # -- per-session models and tools -------------------------------------------------------
    def override(
        self,
        session_id: str,
        *,
        model: BaseChatModel | str | None = None,
        tools: Sequence[Any] | None = None,
    ) -> None:
        """Give one session its own model (or a model's name, `check_chat_model`) and/or
        tools (kept in memory, not in storage)."""
        own: BaseChatModel | None = None if model is None else check_chat_model(model)
        checked = None if tools is None else tuple(check_tools(tools))
        with self._lock:
            self._overrides[session_id] = _Overrides(own, checked)
            self._sessions.pop(session_id, None)

    def _setup(
        self, session_id: str, settings: Mapping[str, Any]
    ) -> tuple[BaseChatModel | None, list[Any]]:
        """The model and tools of a session: its override, else its profile's, else defaults."""
        found = self._overrides.get(session_id)
        profile = self.profile_map.get(str(settings.get("profile")))
        model = (
            (found.model if found is not None else None)
            or (profile.model if profile is not None else None)
            or self.model
        )
        own: Sequence[Any] = self.tools
        if found is not None and found.tools is not None:
            own = found.tools
        elif profile is not None and profile.tools is not None:
            own = profile.tools
        return model, [*own, *self._builtins.for_session(settings)]

    def tool_node(self, session_id: str) -> ToolNode:
        """A `ToolNode` running the tools of `session_id` (cached per tool set)."""
        return self._tool_node(self.session(session_id).tools)

    async def atool_node(self, session_id: str) -> ToolNode:
        """Async twin of `tool_node` (a session not cached yet is read without blocking the
        event loop: a resumed turn starts at its tools)."""
        return self._tool_node((await self.asession(session_id)).tools)

    def _tool_node(self, tools: list[Any]) -> ToolNode:
        key = tuple(id(t) for t in tools)
        with self._lock:
            node = self._tool_nodes.get(key)
            if node is None:
                node = ToolNode(  # async-only tools run on sync turns too (`sync_tool`)
                    [sync_tool(t) for t in tools],
                    messages_key="messages",  # the turn so far (`turn._tool_input`)
                    handle_tool_errors=tool_error_message,
                )
                self._tool_nodes[key] = node
        return node

    # -- sessions ---------------------------------------------------------------------------
    def _make(self, meta: SessionMeta, settings: Mapping[str, Any]) -> SessionBase:
        model, tools = self._setup(meta.id, settings)
        if meta.role == "main":
            return MainSession(
                meta, self.storage, model=model, tools=tools, integrate_fn=self.integrate_fn,
                compression=self.compression,
            )  # fmt: skip
        return Session(
            meta, self.storage, model=model, tools=tools, consolidate_fn=self.consolidate_fn,
            compression=self.compression, topology_slot=self.config.topology_slot,
        )  # fmt: skip

    def _lookup(self, session_id: str, settings: Mapping[str, Any] | None = None) -> _Cached | None:
        with self._lock:
            found = self._sessions.get(session_id)
        if found is None or (settings is not None and found.shape != _shape(settings)):
            return None
        return found

    def session(self, session_id: object) -> SessionBase:
        """The `Session` or `MainSession` object for `session_id` (cached).

        The cached object keeps the tools its settings gave it when it was made; a turn
        starts with `turn_session`, which checks them against storage.
        """
        sid = check_id(session_id)
        found = self._lookup(sid)
        return found.session if found is not None else run(self._read(sid), self.storage)

    async def asession(self, session_id: object) -> SessionBase:
        """Async twin of `session`."""
        sid = check_id(session_id)
        found = self._lookup(sid)
        return found.session if found is not None else await arun(self._read(sid), self.storage)

    def turn_session(
        self, session_id: object, snapshot: SessionSnapshot | None = None
    ) -> SessionBase:
        """The session object a new turn uses, true to the session's stored settings.

        Reads the settings (one small read; none when the turn's `snapshot` of the session,
        `read_session`, is given) and rebuilds the cached object when its profile or skills
        allow-list changed since it was made, whoever changed them (another agent on the
        same storage, another process), so the turn offers exactly what is stored.
        """
        sid = check_id(session_id)
        if snapshot is not None:
            return self._for_turn(sid, snapshot.meta, snapshot.settings)
        return run(self._read(sid), self.storage)

    async def aturn_session(
        self, session_id: object, snapshot: SessionSnapshot | None = None
    ) -> SessionBase:
        """Async twin of `turn_session`."""
        sid = check_id(session_id)
        if snapshot is not None:
            return self._for_turn(sid, snapshot.meta, snapshot.settings)
        return await arun(self._read(sid), self.storage)

    def _read(self, sid: str) -> Flow[SessionBase]:
        settings = yield Storage(MainStorage.get_settings, sid)
        found = self._lookup(sid, settings)
        if found is not None:
            return found.session
        return self._for_turn(sid, (yield Storage(MainStorage.get_session, sid)), settings)

    def _for_turn(
        self, sid: str, meta: SessionMeta | None, settings: Mapping[str, Any]
    ) -> SessionBase:
        """The cached object of a session, made from `meta` and `settings` if there is none
        or if the one cached was made from other settings (unless another thread remade it)."""
        stale = self._lookup(sid)
        if stale is not None and stale.shape == _shape(settings):
            return stale.session
        if meta is None:
            raise SessionNotFoundError(sid)
        with self._lock:
            found = self._sessions.get(sid)
            if found is None or found is stale:
                found = _Cached(self._make(meta, settings), _shape(settings))
                self._sessions[sid] = found
        return found.session

    def refresh(self, session_id: str) -> None:
        """Rebuild a session's object on next use (after its settings changed)."""
        with self._lock:
            self._sessions.pop(session_id, None)

    def forget(self, session_id: str) -> None:
        """Drop cached objects of a session (after it was removed or reconfigured)."""
        with self._lock:
            self._sessions.pop(session_id, None)
            self._overrides.pop(session_id, None)


StelloDeps = StelloRuntime
"""The earlier name of `StelloRuntime`."""
