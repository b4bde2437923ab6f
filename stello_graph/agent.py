"""`StelloAgent`: the whole topology behind one object, on top of the stello graph.

Example:
    >>> from stello_graph import StelloAgent
    >>> from stello_graph.checkpoints import InMemoryMainStorage
    >>> from stello_graph.testing import ScriptedChatModel
    >>> agent = StelloAgent(model=ScriptedChatModel(default="Sure."), storage=InMemoryMainStorage())
    >>> branch = agent.fork(agent.main_session_id, "Pricing")
    >>> agent.turn(branch.id, "Free tier?").content
    'Sure.'
    >>> agent.close()
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    contextmanager,
)
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Durability
from typing_extensions import TypedDict, Unpack

from stello_graph._agent_memory import _Memory
from stello_graph._agent_tree import _Tree
from stello_graph._agent_turns import TurnResult, _Turns
from stello_graph._as_tool import session_tool
from stello_graph._event_log import EventRecorder
from stello_graph._events_mux import EventMux
from stello_graph._flow import Call, Flow, Storage, arun, run
from stello_graph._fork import ForkContext
from stello_graph._threads import CheckpointThreads
from stello_graph._validate import check_chat_model, check_id, check_tools
from stello_graph.checkpoints import is_postgres_dsn
from stello_graph.config import StelloConfig, StelloSettings
from stello_graph.errors import (
    InvalidInputError,
    SessionNotFoundError,
)
from stello_graph.events import StelloEvent, StoredEvents, emit
from stello_graph.graph import build_graph, build_turn_graph
from stello_graph.main_session import MainSession
from stello_graph.models import (
    Lease,
    SessionMeta,
    TopologyNode,
)
from stello_graph.nodes.deps import StelloRuntime
from stello_graph.nodes.ops import arun_fork, run_fork
from stello_graph.nodes.scheduling import on_archive
from stello_graph.nodes.state import ForkState
from stello_graph.schedule import BackgroundFailure, clear_kept_failures, kept_failures
from stello_graph.session import Session
from stello_graph.storage import MainStorage
from stello_graph.topology import Topology

__all__ = ["DEFAULT_DB", "StelloAgent", "TurnResult"]

DEFAULT_DB = "stello.db"
"""The embedded SQLite file used when no storage is given."""


_Where = MainStorage | str | os.PathLike[str] | None
"""A storage, or where to open one: a SQLite path (default `stello.db`) or a PostgreSQL URL."""


def _open_storage(storage: _Where, tree_id: str) -> MainStorage:
    if isinstance(storage, str) and is_postgres_dsn(storage):
        from stello_graph.checkpoints import PostgresMainStorage

        return PostgresMainStorage(storage, tree_id=tree_id)
    if storage is None or isinstance(storage, str | os.PathLike):
        from stello_graph.checkpoints import SqliteMainStorage

        return SqliteMainStorage(DEFAULT_DB if storage is None else storage, tree_id=tree_id)
    return storage


def _main_id(storage: MainStorage, cfg: StelloConfig) -> str:
    """The id of the tree's main session, created (as `cfg` says) when it has none."""
    found = storage.get_main_session()
    if found is not None:
        return found.id
    return MainSession.create(storage, label=cfg.main_label, system_prompt=cfg.system_prompt).id


@contextmanager
def _open_tree(
    storage: _Where, cfg: StelloConfig, tree_id: str | None = None
) -> Iterator[tuple[StelloRuntime, str]]:
    """Open a tree (default: `cfg.tree_id`) of `storage` (a path or URL opens one), its main
    session (created when it has none) and a runtime on them; the block gets the runtime and
    the main session's id. When opening or the block fails, the runtime's scheduler is
    stopped and a storage opened here closed again."""
    opened = _open_storage(storage, tree_id or cfg.tree_id)
    runtime = None
    try:
        main = _main_id(opened, cfg)
        runtime = StelloRuntime(opened, cfg)
        yield runtime, main
    except BaseException:
        if runtime is not None:  # its scheduler's threads would outlive the failed setup
            runtime.close(storage=False)
        if opened is not storage:  # a bad argument must not leave the file open
            opened.close()
        raise


def _default_saver(storage: MainStorage) -> BaseCheckpointSaver[Any]:
    open_checkpointer = getattr(storage, "open_checkpointer", None)
    if callable(open_checkpointer):  # a storage on a database server (PostgreSQL)
        saver: BaseCheckpointSaver[Any] = open_checkpointer()
        return saver
    path = getattr(storage, "path", None)
    if path is not None and str(path) != ":memory:":
        from stello_graph.checkpoints.saver import sqlite_saver

        return sqlite_saver(path)
    return InMemorySaver()


class ForkOptions(TypedDict, total=False):
    """The options of `StelloAgent.fork` (each left out: its default)."""

    context: ForkContext
    """The child's starting L3: `"none"` (default), `"inherit"`, `"compress"` (a summary),
    or a function of the source's records."""
    at_turn: int
    """Start from the end of this user turn of the source (1-based; negative counts from
    the end; counted in the source's L3, inherited turns included) instead of its whole
    history; needs a `context` other than `"none"`."""
    system_prompt: str
    """The child's system prompt."""
    inherit_system_prompt: bool
    """For forks of the main session: whether the child takes the main session's prompt."""
    prompt: str
    """The child's opening assistant line."""
    tags: Sequence[str]
    metadata: dict[str, Any]
    id: str
    """The child's id (default: a new one)."""
    profile: str
    """A registered `ForkProfile` to make the child with."""
    profile_vars: dict[str, str]
    """Values of the profile prompt's variables."""
    skills: Sequence[str]
    """The child's skills allow-list; inherited when left out; any registered skills, even
    ones the source lacks (unlike the model's `create_session`, the caller is trusted)."""
    model: BaseChatModel | str
    """The child's own chat model, or its name (`"openai:gpt-4o-mini"`, built at once by
    `init_chat_model`; kept in memory, not in storage)."""
    tools: Sequence[Any]
    """The child's own tools (kept in memory, not in storage)."""


class StelloAgent(_Turns, _Memory, _Tree):
    """A session topology driven by a LangGraph graph: turns, forks, memory, scheduling.

    Opening an agent on empty storage creates the main session and its root node; on existing
    storage it loads them.

    Args:
        storage: a `MainStorage`, or the path of a SQLite file (default `stello.db`). A
            file holding another application's tables is refused (`ForeignDatabaseError`);
            to share one, pass `SqliteMainStorage(path, allow_foreign_tables=True)`. A
            `postgresql://` URL (or a libpq `"host=... dbname=..."` string) opens a
            `PostgresMainStorage` and a LangGraph `PostgresSaver` on that database (the
            `postgres` extra).
        config: the settings (`StelloConfig`, each field documented there); `model` is
            required: a chat model, or its name as LangChain's `init_chat_model` takes it
            (`"openai:gpt-4o-mini"`), built before anything is opened.
        **settings: fields of `StelloConfig` as keywords (`model=`, `tools=`,
            `schedule=`, ...), overriding `config`'s.

    Use it as a context manager (`with` / `async with`) or call `close` / `aclose`.
    """

    def __init__(
        self,
        *,
        storage: MainStorage | str | os.PathLike[str] | None = None,
        config: StelloConfig | None = None,
        **settings: Unpack[StelloSettings],
    ) -> None:
        cfg = StelloConfig.merge(config, settings)  # before anything is opened or created
        check_chat_model(cfg.model)
        self._owns_storage = not hasattr(storage, "get_tree")
        with _open_tree(storage, cfg) as (runtime, main_id):
            self._runtime = runtime
            """The runtime the graph's nodes share (read it; configure through `config`)."""
            self.storage: MainStorage = runtime.storage
            main = self._runtime.session(main_id)
            assert isinstance(main, MainSession)
            self.main: MainSession = main
            """The main session, with the agent's model, tools and integrate function."""
            self._owns_saver = cfg.checkpointer is None
            saver = _default_saver(self.storage) if cfg.checkpointer is None else cfg.checkpointer
            self.checkpointer: BaseCheckpointSaver[Any] | None = saver or None
            prune = cfg.prune_checkpoints
            self._prune = self._owns_saver if prune is None else prune
            kept = self.checkpointer is not None and not self._prune
            self._durability: Durability = cfg.durability or ("exit" if kept else "async")
            self.graph: CompiledStateGraph[Any, Any, Any, Any] = build_graph(self._runtime).compile(
                checkpointer=self.checkpointer, store=cfg.store
            )
            """The compiled graph of every operation (the agent runs fork, consolidate and
            integrate without it, and its turns on the same nodes without the operations'
            state: `build_turn_graph`)."""
            self._turn_graph: CompiledStateGraph[Any, Any, Any, Any] = build_turn_graph(
                self._runtime
            ).compile(checkpointer=self.checkpointer, store=cfg.store)
            self._first_round: CompiledStateGraph[Any, Any, Any, Any] | None = None
            """The turn graph's first round without the checkpointer (see `_Turns._items`): on
            pruned threads, unless every step must be on disk first (`"sync"`)."""
            if self._prune and self.checkpointer is not None and self._durability != "sync":
                first = build_turn_graph(self._runtime, first_round=True)
                self._first_round = first.compile(store=cfg.store)
            self._tool_graph: CompiledStateGraph[Any, Any, Any, Any] | None = None
        self._leases = self._runtime.leases
        self._threads = CheckpointThreads(
            self._turn_graph, self.checkpointer, self.storage.tree_id, prune=self._prune
        )
        self._last_session: str | None = None
        self._mux = EventMux()
        self._runtime.bus.subscribe(self._mux.forward)
        self._recorder = EventRecorder(self.storage)
        self._runtime.bus.subscribe(self._recorder.record)

    # -- basics -----------------------------------------------------------------------------
    @property
    def settings(self) -> StelloConfig:
        """The agent's settings (frozen: make a new agent to change them)."""
        return self._runtime.config

    @property
    def main_session_id(self) -> str:
        """The id of the tree's main session."""
        return self.main.id

    def session(self, session_id: str) -> Session | MainSession:
        """The `Session` (or `MainSession`) object of a session, with the agent's model."""
        found = self._runtime.session(session_id)
        assert isinstance(found, Session | MainSession)
        return found

    def child(self, session_id: str) -> Session:
        """The `Session` object of a child session, typed as one (`agent.main` is the main one).

        Raises:
            InvalidInputError: `session_id` is the main session's.
            SessionNotFoundError: there is no such session.
        """
        found = self.session(session_id)
        if isinstance(found, MainSession):
            raise InvalidInputError(
                f"{session_id!r} is the main session, not a child: use `agent.main`, or "
                "`agent.session(id)` for either kind."
            )
        return found

    async def asession(self, session_id: str) -> Session | MainSession:
        """Async twin of `session`."""
        found = await self._runtime.asession(session_id)
        assert isinstance(found, Session | MainSession)
        return found

    def tree(self) -> Topology:
        """The topology, for display (`print(agent.tree())`)."""
        return Topology.read(self.storage)

    async def atree(self) -> Topology:
        """Async twin of `tree`."""
        return await Topology.aread(self.storage)

    def subscribe(self, listener: Callable[[StelloEvent], None]) -> Callable[[], None]:
        """Call `listener` with every stello event (background ones included)."""
        return self._runtime.bus.subscribe(listener)

    def follow_events(self, cursor: int = 0, *, interval: float = 0.25) -> StoredEvents:
        """A reader of the tree's stored events after `cursor` (`STORED_EVENT_TYPES`: forks,
        archives, consolidations, integrations, insights, background failures), made by this
        agent or any other on the tree, in this process or another. `subscribe` sees this
        process's events as they happen; this follows the tree's:

            for event in agent.follow_events().follow():   # or `async for` ... afollow()
                print(event.cursor, event.type, event.session_id)

        This agent appends its events shortly after they happen (`drain` waits for them).
        """
        return StoredEvents(self.storage, cursor, interval=interval)

    def failures(self, session_id: str | None = None) -> list[BackgroundFailure]:
        """Background failures kept so far (of one session, when given), oldest first.

        They are stored with the tree (the newest 200), so an agent opened later, or in
        another process, still reads them; `clear_failures` forgets them.
        """
        return run(kept_failures(self._runtime.scheduler, session_id), self.storage)

    async def afailures(self, session_id: str | None = None) -> list[BackgroundFailure]:
        """Async twin of `failures`."""
        return await arun(kept_failures(self._runtime.scheduler, session_id), self.storage)

    def clear_failures(self, session_id: str | None = None) -> int:
        """Forget the kept background failures (of one session, when given); return how many."""
        return run(clear_kept_failures(self._runtime.scheduler, session_id), self.storage)

    async def aclear_failures(self, session_id: str | None = None) -> int:
        """Async twin of `clear_failures`."""
        return await arun(clear_kept_failures(self._runtime.scheduler, session_id), self.storage)

    def drain(self, timeout: float | None = None) -> bool:
        """Wait for background work and for its events to be stored; False on timeout.
        Never raises the kept failures."""
        scheduler = self._runtime.scheduler
        drained = scheduler.drain(timeout) if scheduler is not None else True
        return self._recorder.flush(timeout) and drained

    async def adrain(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109
        """Async twin of `drain`."""
        scheduler = self._runtime.scheduler
        drained = await scheduler.adrain(timeout) if scheduler is not None else True
        return await self._recorder.aflush(timeout) and drained

    def close(self) -> None:
        """Finish background work and close what the agent opened."""
        self._runtime.close(storage=False)
        self._recorder.close()  # the events of the work just finished, before the storage
        close_saver = getattr(self.checkpointer, "close", None)
        try:
            if self._owns_saver and close_saver is not None:
                close_saver()
        finally:  # the storage is closed even when the saver could not write what it held
            if self._owns_storage:
                self.storage.close()

    async def aclose(self) -> None:
        """Async twin of `close`: background work is awaited without blocking the loop."""
        await self.adrain()
        # joining the scheduler's threads and closing files are blocking calls: off the loop
        await asyncio.to_thread(self.close)

    def __enter__(self) -> StelloAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> StelloAgent:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- topology operations ----------------------------------------------------------------
    def _fork_state(self, source_id: object, label: object, options: ForkOptions) -> ForkState:
        unknown = set(options) - set(ForkOptions.__annotations__)
        if unknown:
            raise InvalidInputError(f"Unknown fork option(s) {sorted(unknown)}.")
        # model and tools are applied once the fork ran: check them before it runs
        if options.get("model") is not None:
            options["model"] = check_chat_model(options["model"])  # a name is built once
        if options.get("tools") is not None:
            check_tools(options["tools"])
        spec = {k: v for k, v in options.items() if k not in ("model", "tools")}
        return {"session_id": check_id(source_id), "fork": {"label": label, **spec}}

    def _forked(self, out: ForkState, options: ForkOptions) -> TopologyNode:
        forked = out["forked"]
        if options.get("model") is not None or options.get("tools") is not None:
            self._runtime.override(
                forked["session_id"], model=options.get("model"), tools=options.get("tools")
            )
        return TopologyNode(id=forked["session_id"], parent_id=forked["parent_id"],
                            label=forked["label"])  # fmt: skip

    def fork(self, source_id: str, label: str, **options: Unpack[ForkOptions]) -> TopologyNode:
        """Fork a new session under `source_id` (the main session or any other).

        Options (`ForkOptions`, each documented there): `context`, `at_turn`, `profile` and
        `profile_vars`, `skills`, `system_prompt`, `inherit_system_prompt`, `prompt`,
        `model`, `tools`, `tags`, `metadata`, `id`. The session and its node are written in
        one transaction. Returns the child's `TopologyNode`.

        Raises:
            InvalidInputError: a bad option (an unknown one, a `model` that is not a chat
                model, `tools` that are not a list of tools or callables, a non-bool
                `inherit_system_prompt`, `profile_vars` without a `profile`, ...); every
                option is checked before anything is written.
            UnknownProfileError: `profile` is not registered.
            NodeNotFoundError: `source_id` has no node in the tree (a session made with
                `Session.create` on the agent's storage); nothing is written.
            TurnOutOfRangeError: `at_turn` names no user turn of the source.
            DuplicateLabelError: the agent asks for unique labels (`unique_labels`) and
                another child of the source has `label`.

        The child's lineage (its source and the source's turn it starts from) is stored
        with it: see `lineage`.
        """
        state = self._fork_state(source_id, label, options)
        with self._mux.quiet():
            forked = self._forked(run_fork(self._runtime, state), options)
        self._recorder.settle()
        return forked

    async def afork(
        self, source_id: str, label: str, **options: Unpack[ForkOptions]
    ) -> TopologyNode:
        """Async twin of `fork`."""
        state = self._fork_state(source_id, label, options)
        with self._mux.quiet():
            return self._forked(await arun_fork(self._runtime, state), options)

    def archive(self, session_id: str) -> SessionMeta:
        """Archive a session (after its running turn, if any); it then refuses all work.

        Archiving an archived session changes nothing and returns its meta.
        """
        return run(self._archive(session_id, settle=True), self.storage)

    async def aarchive(self, session_id: str) -> SessionMeta:
        """Async twin of `archive`."""
        return await arun(self._archive(session_id), self.storage)

    def _archive(self, session_id: object, *, settle: bool = False) -> Flow[SessionMeta]:
        sid = check_id(session_id)
        if sid == self.main.id:
            raise InvalidInputError("The main session cannot be archived.")
        found: SessionMeta | None = yield Storage(MainStorage.get_session, sid)
        if found is None:
            raise SessionNotFoundError(sid)
        if found.status == "archived":
            return found
        meta: SessionMeta = yield Call(self._archived, self._aarchived, (sid,))
        emit(self._runtime.bus, "session_archived", sid)
        on_archive(self._runtime, sid)
        if settle:  # a sync call's events are stored when it returns
            self._recorder.settle()
        return meta

    def _archived(self, sid: str) -> SessionMeta:
        with self._leases.hold(sid):
            return self.child(sid).archive()

    async def _aarchived(self, sid: str) -> SessionMeta:
        async with self._leases.ahold(sid):
            session = await self._runtime.asession(sid)
            assert isinstance(session, Session)
            return await session.aarchive()

    # -- composition ------------------------------------------------------------------------
    def as_tool(
        self, session_id: str, *, name: str | None = None, description: str | None = None
    ) -> BaseTool:
        """A LangChain tool that asks one stello session a question (one turn) and returns
        its answer: expose a branch of the topology to another agent.

        Called by another graph's tool node, the turn runs as a subgraph of that run: an
        `interrupt()` inside it pauses the caller's run and the caller's
        `Command(resume=...)` resumes it; its tokens and events stream through the caller's
        run (`subgraphs=True`). See `stello_graph._as_tool`.
        """
        return session_tool(self, session_id, name=name, description=description)

    def hold(self, session_id: str) -> AbstractContextManager[Lease]:
        """Hold the session's lease: no turn runs on it meanwhile, in any process.

        Waits for a running turn to end. Inside the block, taking the session again (a turn
        on it, archiving it) fails with `SessionBusyError` rather than waiting for itself.
        """
        return self._leases.hold(check_id(session_id))

    def ahold(self, session_id: str) -> AbstractAsyncContextManager[Lease]:
        """Async twin of `hold`."""
        return self._leases.ahold(check_id(session_id))
