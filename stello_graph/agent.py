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
import queue
import re
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)
from dataclasses import dataclass, field
from typing import Any, Literal, overload

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage
from langchain_core.messages.ai import UsageMetadata, add_usage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph.state import CompiledStateGraph
from langgraph.store.base import BaseStore
from langgraph.types import Command, Durability, Interrupt, RetryPolicy, StateSnapshot

from stello_graph._base import ToolChoice, check_tool_choice
from stello_graph._ids import legacy_thread_id, thread_id
from stello_graph._stream import stoppable
from stello_graph._validate import check_chat_model, check_id, check_text, check_tools
from stello_graph.compression import CompressionPolicy
from stello_graph.errors import (
    InvalidInputError,
    NodeHasChildrenError,
    NodeNotFoundError,
    SessionArchivedError,
    SessionNotFoundError,
)
from stello_graph.events import StelloEvent, emit
from stello_graph.graph import build_graph
from stello_graph.lease import DEFAULT_LEASE_TTL
from stello_graph.main_session import MainSession
from stello_graph.memory import ConsolidateFn, IntegrateFn
from stello_graph.models import (
    IntegrationResult,
    Lease,
    SessionMeta,
    TopologyNode,
    TreeIntegration,
)
from stello_graph.nodes._model_call import CANCEL_KEY, CallCancel
from stello_graph.nodes.deps import StelloDeps
from stello_graph.nodes.forking import SKILLS_KEY
from stello_graph.nodes.scheduling import (
    aconsolidate_now,
    aunpublish,
    consolidate_now,
    on_archive,
    on_switch,
    unpublish,
)
from stello_graph.profiles import ForkProfile, SplitGuard
from stello_graph.schedule import BackgroundFailure, Schedule, StorageFailureLog
from stello_graph.session import Session
from stello_graph.skills import Skill, check_allow_list
from stello_graph.storage import MainStorage
from stello_graph.topology import Topology

__all__ = ["DEFAULT_DB", "StelloAgent", "TurnResult"]

DEFAULT_DB = "stello.db"
"""The embedded SQLite file used when no storage is given."""


@dataclass(frozen=True, slots=True)
class TurnResult:
    """The outcome of one turn.

    Attributes:
        session_id: the session the turn ran on.
        content: the final reply's text ("" while the turn waits on an interrupt).
        message: the final reply.
        tool_rounds: how many rounds of tool calls the turn took.
        tool_calls: the tool calls run during the turn.
        turn_count: the session's user turns after this one.
        interrupts: what the turn waits for (resume it with `StelloAgent.resume`).
        usage: the token usage of all the turn's model calls, summed (`None` when the model
            reported none).
    """

    session_id: str
    content: str
    message: AIMessage | None = None
    tool_rounds: int = 0
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    turn_count: int = 0
    interrupts: tuple[Interrupt, ...] = ()
    usage: UsageMetadata | None = None

    @property
    def interrupted(self) -> bool:
        """Whether the turn is paused, waiting for `resume`."""
        return bool(self.interrupts)


def _turn_usage(records: list[Any]) -> UsageMetadata | None:
    """The usage of a turn's replies, summed; `None` when none reported any."""
    total: UsageMetadata | None = None
    for record in records:
        if isinstance(record, AIMessage) and record.usage_metadata is not None:
            total = add_usage(total, record.usage_metadata)
    return total


def _tool_name(label: str) -> str:
    """`ask_<label>` as a tool name providers accept (letters, digits, `_`, at most 64)."""
    slug = re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")[:50]
    return f"ask_{slug}" if slug else "ask_session"


def _open_storage(
    storage: MainStorage | str | os.PathLike[str] | None, tree_id: str
) -> MainStorage:
    if storage is None or isinstance(storage, str | os.PathLike):
        from stello_graph.checkpoints import SqliteMainStorage

        return SqliteMainStorage(DEFAULT_DB if storage is None else storage, tree_id=tree_id)
    return storage


def _thread(thread: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread}}


def _belongs(state: StateSnapshot, sid: str, *, in_flight: bool) -> bool:
    """Whether the state of a legacy thread is `sid`'s (a turn still in flight, if asked).

    The legacy id `stello:{tree}:{session}` is ambiguous, but for a given session id it names
    one tree only, so the session the state holds tells whose thread it is.
    """
    return state.values.get("session_id") == sid and (bool(state.next) or not in_flight)


def _default_saver(storage: MainStorage) -> BaseCheckpointSaver[Any]:
    path = getattr(storage, "path", None)
    if path is not None and str(path) != ":memory:":
        from stello_graph.checkpoints.saver import sqlite_saver

        return sqlite_saver(path)
    return InMemorySaver()


IntegrationMode = Literal["flat", "tree"]
_OPS_CONFIG: RunnableConfig = {
    "recursion_limit": 1_000,  # a deep tree takes 2 steps a level
    "max_concurrency": 32,  # the nodes of one tree level integrate in parallel
}


def _integrate_input(mode: object) -> dict[str, Any]:
    if mode not in ("flat", "tree"):
        raise InvalidInputError(f"mode must be 'flat' or 'tree', got {mode!r}.")
    return {"op": "integrate", "mode": mode}


def _integration(raw: dict[str, Any]) -> IntegrationResult | TreeIntegration:
    fields = {k: v for k, v in raw.items() if k != "mode"}
    if raw.get("mode") == "tree":
        return TreeIntegration.model_validate(fields)
    return IntegrationResult.model_validate(fields)


def _batch(session_ids: Iterable[str], concurrency: object) -> tuple[list[str], int]:
    """The distinct ids of a batch, in order, and its concurrency, both checked."""
    if isinstance(session_ids, str):
        raise InvalidInputError("session_ids must be an iterable of ids, not one str.")
    if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
        raise InvalidInputError(f"concurrency must be a positive int, got {concurrency!r}.")
    return list(dict.fromkeys(check_id(sid) for sid in session_ids)), concurrency


def _batch_result(ids: list[str], outcomes: list[Any]) -> dict[str, str | None]:
    """The L2 of each id, or the first failure raised (a note counts the others)."""
    failures = [o for o in outcomes if isinstance(o, BaseException)]
    if failures:
        if len(failures) > 1:
            failures[0].add_note(f"{len(failures) - 1} other session(s) of the batch failed.")
        raise failures[0]
    return dict(zip(ids, outcomes, strict=True))


def _consolidatable(sid: str, meta: SessionMeta | None) -> None:
    """Refuse an id of a batch that can never be consolidated (before any session is).

    An archived session is not refused here: like a failing consolidate function, it fails
    on its own, and the rest of the batch is still consolidated."""
    if meta is None:
        raise SessionNotFoundError(sid)
    if meta.role == "main":
        raise InvalidInputError(
            f"Session {sid!r} is the main session: it integrates; it does not consolidate. "
            "Leave it out of session_ids."
        )


class StelloAgent:
    """A session topology driven by a LangGraph graph: turns, forks, memory, scheduling.

    Opening an agent on empty storage creates the main session and its root node; on existing
    storage it loads them.

    Args:
        model: the default chat model of every session (any LangChain chat model).
        storage: a `MainStorage`, or the path of a SQLite file (default `stello.db`). A
            file holding another application's tables is refused (`ForeignDatabaseError`);
            to share one, pass `SqliteMainStorage(path, allow_foreign_tables=True)`.
        checkpointer: where in-flight turns are kept. Default: a saver on the same SQLite
            file (in memory for in-memory storage). `False`: none (no interrupts).
        tools: tools every session's model is given.
        builtin_tools: built-in tools (`"create_session"`); `()` for none.
        max_tool_rounds: tool rounds one turn may take.
        consolidate_fn / integrate_fn: memory functions (default: LLM-backed, with `model`).
        schedule: background consolidation / integration (`Schedule`).
        store: a LangGraph store L2, synthesis and insights are also published to.
        system_prompt: the main session's system prompt, when it is created.
        main_label: the main session's label, when it is created.
        tree_id: which tree of the storage file, when `storage` is a path.
        model_timeout: seconds each model call of a turn may take (`None`: no limit).
        model_retry: a LangGraph `RetryPolicy` for a turn's failed model calls (judged by
            the provider's exception; timed-out calls are retried).
        durability: LangGraph checkpoint durability of a turn.
        prune_checkpoints: drop a turn's checkpoints once it is committed (default: when the
            agent made the checkpointer itself).
        profiles: fork profiles the caller (`fork(profile=...)`) and the model
            (`create_session(profile=...)`) can name.
        skills: skills (or a folder of `SKILL.md` files) the models can activate through
            `activate_skill`, within each session's allow-list.
        split_guard: limits on the forks the model makes itself.
        compression: automatic context compression of every session's prompt.
        lease_ttl: seconds a turn's session lease lasts without renewal. Turns on one
            session run one at a time, from threads, agents and processes alike (see
            `stello_graph.lease`); a holder that died is taken over after this (at once
            when it was a process of this machine).
    """

    def __init__(
        self,
        *,
        model: BaseChatModel,
        storage: MainStorage | str | os.PathLike[str] | None = None,
        checkpointer: BaseCheckpointSaver[Any] | Literal[False] | None = None,
        tools: Sequence[Any] = (),
        builtin_tools: Sequence[str] = ("create_session",),
        max_tool_rounds: int = 8,
        consolidate_fn: ConsolidateFn | None = None,
        integrate_fn: IntegrateFn | None = None,
        schedule: Schedule | None = None,
        store: BaseStore | None = None,
        system_prompt: str | None = None,
        main_label: str = "Main Session",
        tree_id: str = "default",
        model_timeout: float | None = None,
        model_retry: RetryPolicy | None = None,
        durability: Durability = "async",
        prune_checkpoints: bool | None = None,
        profiles: Sequence[ForkProfile] = (),
        skills: Sequence[Skill] | str | os.PathLike[str] = (),
        split_guard: SplitGuard | None = None,
        compression: CompressionPolicy | None = None,
        lease_ttl: float = DEFAULT_LEASE_TTL,
    ) -> None:
        model = check_chat_model(model)  # before anything is opened or created
        self._owns_storage = not hasattr(storage, "get_tree")
        self.storage: MainStorage = _open_storage(storage, tree_id)
        try:
            self.deps = StelloDeps(
                storage=self.storage,
                model=model,
                tools=tools,
                builtin_tools=builtin_tools,
                max_tool_rounds=max_tool_rounds,
                consolidate_fn=consolidate_fn,
                integrate_fn=integrate_fn,
                schedule=schedule,
                store=store,
                profiles=profiles,
                skills=skills,
                split_guard=split_guard,
                compression=compression,
                model_timeout=model_timeout,
                model_retry=model_retry,
                lease_ttl=lease_ttl,
            )
            found = self.storage.get_main_session()
            main_id = (
                MainSession.create(self.storage, label=main_label, system_prompt=system_prompt).id
                if found is None
                else found.id
            )
            main = self.deps.session(main_id)
            assert isinstance(main, MainSession)
            self.main: MainSession = main
            """The main session, with the agent's model, tools and integrate function."""
            self._owns_saver = checkpointer is None
            saver = _default_saver(self.storage) if checkpointer is None else checkpointer
            self.checkpointer: BaseCheckpointSaver[Any] | None = saver or None
            self._prune = self._owns_saver if prune_checkpoints is None else prune_checkpoints
            self._durability: Durability = durability
            builder = build_graph(self.deps)
            self.graph: CompiledStateGraph[Any, Any, Any, Any] = builder.compile(
                checkpointer=self.checkpointer, store=store
            )
            self._ops: CompiledStateGraph[Any, Any, Any, Any] = builder.compile(store=store)
        except BaseException:
            if self._owns_storage:  # a bad argument must not leave the file open
                getattr(self.storage, "close", lambda: None)()
            raise
        self._leases = self.deps.leases
        self._threads: dict[str, str] = {}  # session id -> its checkpoint thread, once looked up
        self._last_session: str | None = None
        self._streams: list[queue.SimpleQueue[StelloEvent]] = []
        self._streams_lock = threading.Lock()
        self._undelivered: deque[StelloEvent] = deque(maxlen=100)
        self.deps.bus.subscribe(self._forward_background)

    # -- basics -----------------------------------------------------------------------------
    @property
    def main_session_id(self) -> str:
        """The id of the tree's main session."""
        return self.main.id

    def session(self, session_id: str) -> Session | MainSession:
        """The `Session` (or `MainSession`) object of a session, with the agent's model."""
        found = self.deps.session(session_id)
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

    def tree(self) -> Topology:
        """The topology, for display (`print(agent.tree())`)."""
        return Topology.read(self.storage)

    async def atree(self) -> Topology:
        return await Topology.aread(self.storage)

    def config(self, session_id: str) -> RunnableConfig:
        """The LangGraph config of turns on `session_id` (its checkpoint thread).

        The thread id escapes the tree and session ids (`stello/{tree}/{session}`), so no two
        trees sharing a checkpointer ever meet. A turn left in flight under the id of earlier
        versions (`stello:{tree}:{session}`) is found by the first `turn` / `resume` /
        `stream` of the session, which finishes it on that thread (this names that thread
        from then on, until the turn ends; before, it names the new one).
        """
        return _thread(self._threads.get(session_id) or thread_id(self.storage.tree_id, session_id))

    def _legacy(self, sid: str) -> RunnableConfig:
        return _thread(legacy_thread_id(self.storage.tree_id, sid))

    def _resolve(self, sid: str) -> None:
        """Look up once which thread `sid`'s turns run on (see `config`)."""
        if self.checkpointer is None or sid in self._threads:
            return
        found = thread_id(self.storage.tree_id, sid)
        if self.checkpointer.get_tuple(_thread(found)) is None and _belongs(
            self.graph.get_state(self._legacy(sid)), sid, in_flight=True
        ):
            found = legacy_thread_id(self.storage.tree_id, sid)
        self._threads[sid] = found

    async def _aresolve(self, sid: str) -> None:
        if self.checkpointer is None or sid in self._threads:
            return
        found = thread_id(self.storage.tree_id, sid)
        if await self.checkpointer.aget_tuple(_thread(found)) is None and _belongs(
            await self.graph.aget_state(self._legacy(sid)), sid, in_flight=True
        ):
            found = legacy_thread_id(self.storage.tree_id, sid)
        self._threads[sid] = found

    def subscribe(self, listener: Callable[[StelloEvent], None]) -> Callable[[], None]:
        """Call `listener` with every stello event (background ones included)."""
        return self.deps.bus.subscribe(listener)

    def failures(self, session_id: str | None = None) -> list[BackgroundFailure]:
        """Background failures kept so far (of one session, when given), oldest first.

        They are stored with the tree (the newest 200), so an agent opened later, or in
        another process, still reads them; `clear_failures` forgets them.
        """
        scheduler = self.deps.scheduler
        if scheduler is not None:
            return scheduler.failures(session_id)
        return StorageFailureLog(self.storage).read(session_id)

    def clear_failures(self, session_id: str | None = None) -> int:
        """Forget the kept background failures (of one session, when given); return how many."""
        scheduler = self.deps.scheduler
        if scheduler is not None:
            return scheduler.clear_failures(session_id)
        return StorageFailureLog(self.storage).clear(session_id)

    def drain(self, timeout: float | None = None) -> bool:
        """Wait for background work; False on timeout. Never raises the kept failures."""
        scheduler = self.deps.scheduler
        return scheduler.drain(timeout) if scheduler is not None else True

    async def adrain(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109
        scheduler = self.deps.scheduler
        return await scheduler.adrain(timeout) if scheduler is not None else True

    def close(self) -> None:
        """Finish background work and close what the agent opened."""
        if self.deps.scheduler is not None:
            self.deps.scheduler.close(wait=True)
        close_saver = getattr(self.checkpointer, "close", None)
        if self._owns_saver and close_saver is not None:
            close_saver()
        if self._owns_storage:
            close = getattr(self.storage, "close", None)
            if close is not None:
                close()

    def __enter__(self) -> StelloAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- turns ------------------------------------------------------------------------------
    def _begin(
        self, session_id: object, text: object, tool_choice: ToolChoice = None
    ) -> tuple[str, dict[str, Any]]:
        sid = check_id(session_id)
        check_text(text, "text")
        choice = None if tool_choice is None else check_tool_choice(tool_choice)
        return sid, {"session_id": sid, "input": text, "tool_choice": choice}

    @staticmethod
    def _check_target(sid: str, meta: SessionMeta | None) -> str:
        """Refuse a missing or archived session before the graph runs (and checkpoints)."""
        if meta is None:
            raise SessionNotFoundError(sid)
        if meta.status == "archived":
            raise SessionArchivedError(sid, "a turn")
        return sid

    def _target(self, sid: str, tool_choice: ToolChoice = None) -> str:
        self._check_target(sid, self.storage.get_session(sid))
        if tool_choice is not None:  # the session's tools, before the graph checkpoints
            check_tool_choice(tool_choice, self.deps.session(sid).tools, session_id=sid)
        return sid

    async def _atarget(self, sid: str, tool_choice: ToolChoice = None) -> str:
        self._check_target(sid, await self.storage.aget_session(sid))
        if tool_choice is not None:
            session = await self.deps.asession(sid)
            check_tool_choice(tool_choice, session.tools, session_id=sid)
        return sid

    def _resume_payload(self, sid: str, state: StateSnapshot, value: Any) -> Command[Any] | None:
        if state.interrupts:
            return Command(resume=value)
        if not state.next:
            raise InvalidInputError(f"Session {sid!r} has no turn in flight to resume.")
        return None

    def _switch(self, sid: str) -> None:
        on_switch(self.deps, self._last_session, sid)
        self._last_session = sid

    def _result(self, sid: str, out: dict[str, Any]) -> TurnResult:
        interrupts = tuple(out.get("__interrupt__", ()))
        pending = out.get("pending") or []
        final = pending[-1] if pending and isinstance(pending[-1], AIMessage) else None
        return TurnResult(
            session_id=sid,
            content="" if interrupts else out.get("content", ""),
            message=None if interrupts else final,
            tool_rounds=out.get("tool_rounds", 0),
            tool_calls=list(out.get("tool_calls", [])),
            turn_count=out.get("turn_count", 0),
            interrupts=interrupts,
            usage=_turn_usage(pending),
        )

    def _finished(self, sid: str, result: TurnResult) -> TurnResult:
        if not result.interrupted and self.checkpointer is not None:
            if self._prune:
                self.checkpointer.delete_thread(self.config(sid)["configurable"]["thread_id"])
            self._threads[sid] = thread_id(self.storage.tree_id, sid)  # next turns: new thread
        return result

    async def _afinished(self, sid: str, result: TurnResult) -> TurnResult:
        if not result.interrupted and self.checkpointer is not None:
            if self._prune:
                await self.checkpointer.adelete_thread(
                    self.config(sid)["configurable"]["thread_id"]
                )
            self._threads[sid] = thread_id(self.storage.tree_id, sid)
        return result

    def turn(self, session_id: str, text: str, *, tool_choice: ToolChoice = None) -> TurnResult:
        """Run one turn: the model (and its tools, up to `max_tool_rounds`) until it answers.

        Raises:
            SessionNotFoundError / SessionArchivedError: no such session, or it is archived.
            ToolRoundLimitError: the model kept asking for tools; nothing was stored.
            ModelCallError: the model failed; nothing was stored.

        `tool_choice` forces the turn's first model call to use tools (`"required"`, a
        tool's name, ...); later rounds of the turn are free to answer. A name that is not
        one of the session's tools raises `InvalidInputError` before anything is written.
        """
        sid, payload = self._begin(session_id, text, tool_choice)
        self._target(sid, tool_choice)
        self._resolve(sid)
        with self._run(sid):
            self._switch(sid)
            out = self.graph.invoke(payload, self.config(sid), durability=self._durability)
            return self._finished(sid, self._result(sid, out))

    async def aturn(
        self, session_id: str, text: str, *, tool_choice: ToolChoice = None
    ) -> TurnResult:
        """Async twin of `turn`."""
        sid, payload = self._begin(session_id, text, tool_choice)
        await self._atarget(sid, tool_choice)
        await self._aresolve(sid)
        async with self._arun(sid):
            self._switch(sid)
            out = await self.graph.ainvoke(payload, self.config(sid), durability=self._durability)
            return await self._afinished(sid, self._result(sid, out))

    def resume(self, session_id: str, value: Any = None) -> TurnResult:
        """Continue a turn that waits on an interrupt (with `value`) or that crashed.

        Raises:
            InvalidInputError: the session has no turn in flight (or the agent no
                checkpointer).
            SessionNotFoundError / SessionArchivedError: no such session, or it is archived.
        """
        sid = self._target(check_id(session_id))
        self._check_resumable()
        self._resolve(sid)
        payload = self._resume_payload(sid, self.graph.get_state(self.config(sid)), value)
        with self._run(sid):
            out = self.graph.invoke(payload, self.config(sid), durability=self._durability)
            return self._finished(sid, self._result(sid, out))

    async def aresume(self, session_id: str, value: Any = None) -> TurnResult:
        """Async twin of `resume`."""
        sid = await self._atarget(check_id(session_id))
        self._check_resumable()
        await self._aresolve(sid)
        state = await self.graph.aget_state(self.config(sid))
        payload = self._resume_payload(sid, state, value)
        async with self._arun(sid):
            out = await self.graph.ainvoke(payload, self.config(sid), durability=self._durability)
            return await self._afinished(sid, self._result(sid, out))

    def _check_resumable(self) -> None:
        if self.checkpointer is None:
            raise InvalidInputError("This agent has no checkpointer: turns cannot be resumed.")

    # -- streaming --------------------------------------------------------------------------
    def _forward_background(self, event: StelloEvent) -> None:
        """Background events go to the custom streams running now, else to the next one."""
        if event.streamed:
            return
        with self._streams_lock:
            targets = list(self._streams)
            if not targets:
                self._undelivered.append(event)
        for q in targets:
            q.put(event)

    def _open_stream(self) -> queue.SimpleQueue[StelloEvent]:
        q: queue.SimpleQueue[StelloEvent] = queue.SimpleQueue()
        with self._streams_lock:
            while self._undelivered:
                q.put(self._undelivered.popleft())
            self._streams.append(q)
        return q

    def _close_stream(self, q: queue.SimpleQueue[StelloEvent]) -> None:
        with self._streams_lock:
            self._streams.remove(q)

    @staticmethod
    def _from_model(item: Any, multi: bool) -> bool:
        """Whether a stream item may be shown: `messages` items only from the `model` node."""
        mode, data = item if multi else ("messages", item)
        if mode != "messages":
            return True
        _, metadata = data
        return bool(metadata.get("langgraph_node") == "model")

    def _drain_events(
        self, q: queue.SimpleQueue[StelloEvent], modes: list[str], multi: bool
    ) -> Iterator[Any]:
        if "custom" not in modes:
            return
        while True:
            try:
                event = q.get_nowait()
            except queue.Empty:
                return
            yield ("custom", event.as_dict()) if multi else event.as_dict()

    def stream(
        self,
        session_id: str,
        text: str,
        stream_mode: str | Sequence[str] = "messages",
        *,
        tool_choice: ToolChoice = None,
    ) -> Iterator[Any]:
        """Run a turn, yielding what LangGraph's `stream_mode` yields.

        `messages`: `(token chunk, metadata)` of the session's model only; `custom`: stello
        events as dicts (tool calls and results, forks, consolidations, integrations,
        insights delivered, background errors); `updates` / `values` as usual. With a list
        of modes, items are `(mode, item)` pairs.

        Closing the generator early (`close()`, or Ctrl-C while it waits) stops the turn at
        once and stores nothing: the model call in flight is abandoned and stops at its
        next token, which closes the provider's HTTP stream (see `nodes._model_call`).
        """
        sid, payload = self._begin(session_id, text, tool_choice)
        self._target(sid, tool_choice)
        self._resolve(sid)
        multi = not isinstance(stream_mode, str)
        modes = [stream_mode] if isinstance(stream_mode, str) else list(stream_mode)
        cancel = CallCancel()  # closing the stream (or Ctrl-C) stops the model call at once
        config = self.config(sid)
        config = {"configurable": {**config["configurable"], CANCEL_KEY: cancel}}
        with self._run(sid):
            self._switch(sid)
            q = self._open_stream()
            run = stoppable(
                lambda: self.graph.stream(
                    payload,
                    config,
                    stream_mode=stream_mode,  # type: ignore[arg-type]
                    durability=self._durability,
                ),
                cancel.cancel,
            )
            try:
                for item in run:
                    yield from self._drain_events(q, modes, multi)
                    if "messages" not in modes or self._from_model(item, multi):
                        yield item
                yield from self._drain_events(q, modes, multi)
            finally:
                run.close()  # now, under the lock: the run has ended when this returns
                self._close_stream(q)
            state = self.graph.get_state(self.config(sid)) if self.checkpointer else None
            if state is None or not state.interrupts:
                self._finished(sid, TurnResult(session_id=sid, content=""))

    async def astream(
        self,
        session_id: str,
        text: str,
        stream_mode: str | Sequence[str] = "messages",
        *,
        tool_choice: ToolChoice = None,
    ) -> AsyncIterator[Any]:
        """Async twin of `stream`."""
        sid, payload = self._begin(session_id, text, tool_choice)
        await self._atarget(sid, tool_choice)
        await self._aresolve(sid)
        multi = not isinstance(stream_mode, str)
        modes = [stream_mode] if isinstance(stream_mode, str) else list(stream_mode)
        async with self._arun(sid):
            self._switch(sid)
            q = self._open_stream()
            try:
                async for item in self.graph.astream(
                    payload,
                    self.config(sid),
                    stream_mode=stream_mode,  # type: ignore[arg-type]
                    durability=self._durability,
                ):
                    for event in self._drain_events(q, modes, multi):
                        yield event
                    if "messages" not in modes or self._from_model(item, multi):
                        yield item
                for event in self._drain_events(q, modes, multi):
                    yield event
            finally:
                self._close_stream(q)
            state = await self.graph.aget_state(self.config(sid)) if self.checkpointer else None
            if state is None or not state.interrupts:
                await self._afinished(sid, TurnResult(session_id=sid, content=""))

    # -- topology operations ----------------------------------------------------------------
    def _fork_payload(
        self, source_id: object, label: object, options: dict[str, Any]
    ) -> dict[str, Any]:
        allowed = {"context", "system_prompt", "inherit_system_prompt", "prompt", "tags",
                   "metadata", "id", "profile", "profile_vars", "skills"}  # fmt: skip
        unknown = set(options) - allowed - {"model", "tools"}
        if unknown:
            raise InvalidInputError(f"Unknown fork option(s) {sorted(unknown)}.")
        # model and tools are applied once the fork ran: check them before it runs
        if options.get("model") is not None:
            check_chat_model(options["model"])
        if options.get("tools") is not None:
            check_tools(options["tools"])
        spec = {k: v for k, v in options.items() if k in allowed}
        return {"op": "fork", "session_id": check_id(source_id), "fork": {"label": label, **spec}}

    def _forked(self, out: dict[str, Any], options: dict[str, Any]) -> TopologyNode:
        forked = out["forked"]
        if options.get("model") is not None or options.get("tools") is not None:
            self.deps.override(
                forked["session_id"], model=options.get("model"), tools=options.get("tools")
            )
        return TopologyNode(id=forked["session_id"], parent_id=forked["parent_id"],
                            label=forked["label"])  # fmt: skip

    def fork(self, source_id: str, label: str, **options: Any) -> TopologyNode:
        """Fork a new session under `source_id` (the main session or any other).

        Options: `context` ("none" | "inherit" | "compress" | a function of the records),
        `profile` (a registered `ForkProfile`) and `profile_vars`, `skills` (the child's
        allow-list; inherited when left out; any registered skills, even ones the source
        lacks: unlike the model's `create_session`, the caller is trusted), `system_prompt`,
        `inherit_system_prompt` (for forks of the main session), `prompt` (opening line),
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
        """
        out = self._ops.invoke(self._fork_payload(source_id, label, options))
        return self._forked(out, options)

    async def afork(self, source_id: str, label: str, **options: Any) -> TopologyNode:
        """Async twin of `fork`."""
        out = await self._ops.ainvoke(self._fork_payload(source_id, label, options))
        return self._forked(out, options)

    def _archivable(self, session_id: object) -> str:
        sid = check_id(session_id)
        if sid == self.main.id:
            raise InvalidInputError("The main session cannot be archived.")
        return sid

    def archive(self, session_id: str) -> SessionMeta:
        """Archive a session (after its running turn, if any); it then refuses all work.

        Archiving an archived session changes nothing and returns its meta.
        """
        sid = self._archivable(session_id)
        found = self.storage.get_session(sid)
        if found is None:
            raise SessionNotFoundError(sid)
        if found.status == "archived":
            return found
        with self._leases.hold(sid):
            session = self.session(sid)
            assert isinstance(session, Session)
            meta = session.archive()
        emit(self.deps.bus, "session_archived", sid)
        on_archive(self.deps, sid)
        return meta

    async def aarchive(self, session_id: str) -> SessionMeta:
        """Async twin of `archive`."""
        sid = self._archivable(session_id)
        found = await self.storage.aget_session(sid)
        if found is None:
            raise SessionNotFoundError(sid)
        if found.status == "archived":
            return found
        async with self._leases.ahold(sid):
            session = self.session(sid)
            assert isinstance(session, Session)
            meta = await session.aarchive()
        emit(self.deps.bus, "session_archived", sid)
        on_archive(self.deps, sid)
        return meta

    def consolidate(self, session_id: str) -> str | None:
        """Consolidate one session now (L3 -> L2); return its L2."""
        out = self._ops.invoke({"op": "consolidate", "session_id": check_id(session_id)})
        return out.get("l2")

    async def aconsolidate(self, session_id: str) -> str | None:
        out = await self._ops.ainvoke({"op": "consolidate", "session_id": check_id(session_id)})
        return out.get("l2")

    def consolidate_many(
        self, session_ids: Iterable[str], *, concurrency: int = 8
    ) -> dict[str, str | None]:
        """Consolidate several sessions, up to `concurrency` at a time (their model calls
        overlap, so 100 sessions take about `100 / concurrency` model latencies).

        Like scheduled consolidations, each runs outside the graph (a graph run per session
        would cost more than the rest of its work) and emits a `consolidated` event. Every
        session is attempted, each in its own transaction. Returns each one's L2, in
        the order given (duplicates once).

        Raises:
            InvalidInputError: a bad id or `concurrency`, or the main session's id;
                checked for every id before any session is consolidated, so nothing was.
            SessionNotFoundError: an id of no session; checked likewise, nothing was
                consolidated.
            StelloError: the first failure (an archived session, a consolidate function
                that failed, ...), in the order given, once all sessions were attempted
                (the others' L2 are stored); a note counts the other failures.
        """
        ids, workers = _batch(session_ids, concurrency)
        for sid in ids:
            _consolidatable(sid, self.storage.get_session(sid))
        if not ids:
            return {}
        with ThreadPoolExecutor(min(workers, len(ids)), thread_name_prefix="stello") as pool:
            futures = [pool.submit(consolidate_now, self.deps, sid) for sid in ids]
        return _batch_result(ids, [f.exception() or f.result() for f in futures])

    async def aconsolidate_many(
        self, session_ids: Iterable[str], *, concurrency: int = 8
    ) -> dict[str, str | None]:
        """Async twin of `consolidate_many`."""
        ids, workers = _batch(session_ids, concurrency)
        for sid in ids:
            _consolidatable(sid, await self.storage.aget_session(sid))
        gate = asyncio.Semaphore(workers)

        async def one(sid: str) -> str | None:
            async with gate:
                return await aconsolidate_now(self.deps, sid)

        done = await asyncio.gather(*(one(sid) for sid in ids), return_exceptions=True)
        return _batch_result(ids, list(done))

    @overload
    def integrate(self, mode: Literal["flat"] = "flat") -> IntegrationResult: ...
    @overload
    def integrate(self, mode: Literal["tree"]) -> TreeIntegration: ...

    def integrate(self, mode: IntegrationMode = "flat") -> IntegrationResult | TreeIntegration:
        """Integrate now.

        `"flat"`: the main session reads the L2 of every active session and writes the
        synthesis and insights. `"tree"`: bottom-up, level by level; each internal node
        integrates only its direct children's L2 into a summary of its subtree (what its
        parent then sees for that branch) and pushes insights one level down; siblings of a
        level run in parallel. Returns a `TreeIntegration` with one result per node.

        Both modes are all or nothing: the results are written in one transaction at the end,
        so a failed integration (at any level, in tree mode) leaves everything as it was.
        """
        out = self._ops.invoke(_integrate_input(mode), _OPS_CONFIG)
        return _integration(out["integration"])

    @overload
    async def aintegrate(self, mode: Literal["flat"] = "flat") -> IntegrationResult: ...
    @overload
    async def aintegrate(self, mode: Literal["tree"]) -> TreeIntegration: ...

    async def aintegrate(
        self, mode: IntegrationMode = "flat"
    ) -> IntegrationResult | TreeIntegration:
        """Async twin of `integrate`."""
        out = await self._ops.ainvoke(_integrate_input(mode), _OPS_CONFIG)
        return _integration(out["integration"])

    # -- profiles and skills ----------------------------------------------------------------
    def register_profile(self, profile: ForkProfile) -> None:
        """Register (or replace) a fork profile; models see it in `create_session`."""
        self.deps.register_profile(profile)

    def skills_of(self, session_id: str) -> list[str]:
        """The skills a session may activate (its allow-list resolved).

        Raises:
            SessionNotFoundError: there is no such session (the allow-list is the session's,
                so a session without a node has one too).
        """
        sid = check_id(session_id)
        if self.storage.get_session(sid) is None:
            raise SessionNotFoundError(sid)
        allowed = self.storage.get_settings(sid).get(SKILLS_KEY)
        return list(self.deps.skill_map) if allowed is None else list(allowed)

    def set_skills(self, session_id: str, skills: Sequence[str] | None) -> None:
        """Replace a session's skills allow-list (`None`: every skill; `[]`: none)."""
        sid = check_id(session_id)
        allowed = None if skills is None else check_allow_list(skills, list(self.deps.skill_map))
        with self.storage.transaction():
            settings = self.storage.get_settings(sid)
            self.storage.put_settings(sid, {**settings, SKILLS_KEY: allowed})
        self.deps.refresh(sid)

    # -- the tree ---------------------------------------------------------------------------
    # The tree reads raise `NodeNotFoundError` for an id without a node (an unknown id, or a
    # session made outside the tree); an empty answer always means a node that has none.
    def _known(self, found: list[TopologyNode], node_id: str) -> list[TopologyNode]:
        if not found:
            self._node(self.storage.get_node(node_id), node_id)
        return found

    async def _aknown(self, found: list[TopologyNode], node_id: str) -> list[TopologyNode]:
        if not found:
            self._node(await self.storage.aget_node(node_id), node_id)
        return found

    def children(self, session_id: str) -> list[TopologyNode]:
        """The direct children of a session's node, in creation order (read on demand).

        Raises:
            NodeNotFoundError: the id has no node.
        """
        sid = check_id(session_id)
        return self._known(self.storage.get_children(sid), sid)

    async def achildren(self, session_id: str) -> list[TopologyNode]:
        """Async twin of `children`."""
        sid = check_id(session_id)
        return await self._aknown(await self.storage.aget_children(sid), sid)

    def ancestors(self, session_id: str) -> list[TopologyNode]:
        """The parent, grandparent, ... up to the main session (nearest first).

        Raises:
            NodeNotFoundError: the id has no node.
        """
        sid = check_id(session_id)
        return self._known(self.storage.get_ancestors(sid), sid)

    async def aancestors(self, session_id: str) -> list[TopologyNode]:
        """Async twin of `ancestors`."""
        sid = check_id(session_id)
        return await self._aknown(await self.storage.aget_ancestors(sid), sid)

    def siblings(self, session_id: str) -> list[TopologyNode]:
        """The other children of the session's parent.

        Raises:
            NodeNotFoundError: the id has no node.
        """
        sid = check_id(session_id)
        node = self._node(self.storage.get_node(sid), sid)
        if node.parent_id is None:
            return []
        return [n for n in self.storage.get_children(node.parent_id) if n.id != sid]

    async def asiblings(self, session_id: str) -> list[TopologyNode]:
        """Async twin of `siblings`."""
        sid = check_id(session_id)
        node = self._node(await self.storage.aget_node(sid), sid)
        if node.parent_id is None:
            return []
        return [n for n in await self.storage.aget_children(node.parent_id) if n.id != sid]

    @staticmethod
    def _node(node: TopologyNode | None, node_id: str) -> TopologyNode:
        if node is None:
            raise NodeNotFoundError(node_id)
        return node

    def _movable(self, session_id: object, new_parent_id: object) -> tuple[str, str]:
        sid, parent = check_id(session_id), check_id(new_parent_id, "new parent id")
        if sid == self.main.id:
            raise InvalidInputError("The main session is the root of the tree; it cannot move.")
        return sid, parent

    def move(self, session_id: str, new_parent_id: str) -> TopologyNode:
        """Move a session, with its whole subtree, under another parent.

        Raises:
            NodeNotFoundError: either node does not exist.
            TopologyCycleError: the new parent is the session itself or lies in its subtree.
            InvalidInputError: the session is the main session.
        """
        sid, parent = self._movable(session_id, new_parent_id)
        node = self._node(self.storage.get_node(sid), sid)
        self._node(self.storage.get_node(parent), parent)
        moved = node.model_copy(update={"parent_id": parent})
        self.storage.put_node(moved)
        return moved

    async def amove(self, session_id: str, new_parent_id: str) -> TopologyNode:
        """Async twin of `move`."""
        sid, parent = self._movable(session_id, new_parent_id)
        node = self._node(await self.storage.aget_node(sid), sid)
        self._node(await self.storage.aget_node(parent), parent)
        moved = node.model_copy(update={"parent_id": parent})
        await self.storage.aput_node(moved)
        return moved

    def _removable(self, session_id: object) -> str:
        sid = check_id(session_id)
        if sid == self.main.id:
            raise InvalidInputError(
                "The main session is the root of the tree; it cannot be removed."
            )
        return sid

    def remove(self, session_id: str, *, cascade: bool = False) -> list[str]:
        """Delete a session, its node and all its data; with `cascade`, its whole subtree.

        The checkpoint threads of every removed session go too (a turn in flight, or kept
        turns when checkpoints are not pruned, under the current or the earlier thread id),
        and what was published of it to the agent's store, so none of its text stays
        behind and a new session given the same id starts clean.

        Raises:
            NodeHasChildrenError: the session has children and `cascade` is false.
            NodeNotFoundError: the session has no node.
        """
        sid = self._removable(session_id)
        self._node(self.storage.get_node(sid), sid)  # refused before the lease is taken
        children = self.storage.get_children(sid)
        if children and not cascade:
            raise NodeHasChildrenError(sid, len(children))
        with self._leases.hold(sid):
            removed = self.storage.remove_node(sid, cascade=cascade)
            for gone in removed:
                self._drop_threads(gone)
                unpublish(self.deps, gone)
        for gone in removed:
            self.deps.forget(gone)
        return removed

    async def aremove(self, session_id: str, *, cascade: bool = False) -> list[str]:
        """Async twin of `remove`."""
        sid = self._removable(session_id)
        self._node(await self.storage.aget_node(sid), sid)
        children = await self.storage.aget_children(sid)
        if children and not cascade:
            raise NodeHasChildrenError(sid, len(children))
        async with self._leases.ahold(sid):
            removed = await self.storage.aremove_node(sid, cascade=cascade)
            for gone in removed:
                await self._adrop_threads(gone)
                await aunpublish(self.deps, gone)
        for gone in removed:
            self.deps.forget(gone)
        return removed

    def _drop_threads(self, sid: str) -> None:
        """Delete the checkpoint threads of a removed session (the legacy one if it is its)."""
        self._threads.pop(sid, None)
        saver = self.checkpointer
        if saver is None:
            return
        saver.delete_thread(thread_id(self.storage.tree_id, sid))
        if _belongs(self.graph.get_state(self._legacy(sid)), sid, in_flight=False):
            saver.delete_thread(legacy_thread_id(self.storage.tree_id, sid))

    async def _adrop_threads(self, sid: str) -> None:
        self._threads.pop(sid, None)
        saver = self.checkpointer
        if saver is None:
            return
        await saver.adelete_thread(thread_id(self.storage.tree_id, sid))
        if _belongs(await self.graph.aget_state(self._legacy(sid)), sid, in_flight=False):
            await saver.adelete_thread(legacy_thread_id(self.storage.tree_id, sid))

    # -- composition ------------------------------------------------------------------------
    def as_tool(
        self, session_id: str, *, name: str | None = None, description: str | None = None
    ) -> BaseTool:
        """A LangChain tool that asks one stello session a question (one turn) and returns
        its answer: expose a branch of the topology to another agent."""
        sid = check_id(session_id)
        label = self.session(sid).meta.label

        def ask(question: str) -> str:
            return self.turn(sid, question).content

        async def aask(question: str) -> str:
            return (await self.aturn(sid, question)).content

        return StructuredTool.from_function(
            func=ask,
            coroutine=aask,
            name=name or _tool_name(label),
            description=description
            or f"Ask the stello session {label!r} a question and get its answer.",
        )

    def hold(self, session_id: str) -> AbstractContextManager[Lease]:
        """Hold the session's lease: no turn runs on it meanwhile, in any process.

        Waits for a running turn to end. Inside the block, taking the session again (a turn
        on it, archiving it) fails with `SessionBusyError` rather than waiting for itself.
        """
        return self._leases.hold(check_id(session_id))

    def ahold(self, session_id: str) -> AbstractAsyncContextManager[Lease]:
        """Async twin of `hold`."""
        return self._leases.ahold(check_id(session_id))

    # -- the session lease around a graph run -------------------------------------------------
    @contextmanager
    def _run(self, sid: str) -> Iterator[None]:
        """Hold the session for a whole run (its checkpoint thread included: pruning it must
        not race another agent's run), lending the lease to the graph's nodes."""
        with self._leases.hold(sid) as lease, self._leases.lending(lease):
            yield

    @asynccontextmanager
    async def _arun(self, sid: str) -> AsyncIterator[None]:
        async with self._leases.ahold(sid) as lease:
            with self._leases.lending(lease):
                yield
