"""`StelloAgent`'s turns: `turn`, `resume`, `stream` and their async twins, and `TurnResult`.

A turn is a run of the turn graph (`stello_graph.graph.build_turn_graph`: the turn's nodes
without the topology operations' state) on the session's checkpoint thread, under the
session's lease.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Generator, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage
from langchain_core.messages.ai import UsageMetadata, add_usage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, Durability, Interrupt, StateSnapshot

from stello_graph._base import ToolChoice, check_tool_choice
from stello_graph._compiled import flagged
from stello_graph._event_log import EventRecorder
from stello_graph._events_mux import EventMux
from stello_graph._flow import Call, Flow, Storage, arun, run
from stello_graph._fork import check_active
from stello_graph._stream import in_own_context, stoppable
from stello_graph._threads import CheckpointThreads
from stello_graph._validate import check_id, check_text
from stello_graph.errors import InvalidInputError
from stello_graph.lease import Handback, SessionLeases
from stello_graph.nodes._model_call import CANCEL_KEY, CallCancel
from stello_graph.nodes.deps import StelloRuntime
from stello_graph.nodes.scheduling import aon_switch, on_switch
from stello_graph.nodes.turn import HANDOFF_KEY, RESUMING_KEY
from stello_graph.storage import MainStorage

__all__ = ["TurnResult"]

logger = logging.getLogger(__name__)


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


class _Turns:
    """The turns of a `StelloAgent` (a part of it; see `stello_graph.agent`)."""

    storage: MainStorage
    _runtime: StelloRuntime
    _leases: SessionLeases
    _turn_graph: CompiledStateGraph[Any, Any, Any, Any]
    _first_round: CompiledStateGraph[Any, Any, Any, Any] | None
    checkpointer: BaseCheckpointSaver[Any] | None
    _durability: Durability
    _threads: CheckpointThreads
    _mux: EventMux
    _recorder: EventRecorder
    _last_session: str | None

    def config(self, session_id: str) -> RunnableConfig:
        """The LangGraph config of turns on `session_id` (its checkpoint thread).

        The thread id escapes the tree and session ids (`stello/{tree}/{session}`), so no two
        trees sharing a checkpointer ever meet. A turn left in flight under the id of earlier
        versions (`stello:{tree}:{session}`) is found by the first `turn` / `resume` /
        `stream` of the session, which finishes it on that thread (this names that thread
        from then on, until the turn ends; before, it names the new one).
        """
        return self._threads.config(session_id)

    # -- turns ------------------------------------------------------------------------------
    def _begin(
        self, session_id: object, text: object, tool_choice: ToolChoice = None
    ) -> Flow[tuple[str, dict[str, Any]]]:
        sid = check_id(session_id)
        check_text(text, "text")
        # the turn is named in its input: a crash that loses the START step's writes makes
        # LangGraph run that step again, under new checkpoint ids, and an id derived from
        # them would be a new turn (its fork made twice, or its commit stored twice)
        payload: dict[str, Any] = {"session_id": sid, "input": text, "turn_id": str(uuid.uuid4())}
        if tool_choice is not None:  # an input key left out is not checkpointed
            payload["tool_choice"] = check_tool_choice(tool_choice)
            # the session's tools, before anything is written
            yield from self._target(sid, tool_choice)
        return sid, payload

    def _target(self, sid: str, tool_choice: ToolChoice = None) -> Flow[str]:
        """Refuse a missing or archived session before the graph runs (and checkpoints), and
        a `tool_choice` that names none of the session's tools."""
        check_active((yield Storage(MainStorage.get_session, sid)), sid, "a turn")
        if tool_choice is not None:
            runtime = self._runtime
            session = yield Call(runtime.session, runtime.asession, (sid,))
            check_tool_choice(tool_choice, session.tools, session_id=sid)
        return sid

    def _state(self, sid: str) -> Call:
        """The read of the state of `sid`'s checkpoint thread."""
        graph = self._turn_graph
        return Call(graph.get_state, graph.aget_state, (self.config(sid),))

    def _in_flight(self, sid: str, value: Any) -> Flow[Command[Any] | None]:
        """What resumes `sid`'s turn in flight (with `value`); refused when there is none."""
        state: StateSnapshot = yield self._state(sid)
        if state.interrupts:
            return Command(resume=value)
        if not state.next:
            raise InvalidInputError(f"Session {sid!r} has no turn in flight to resume.")
        return None

    def _resumable(self, session_id: object, value: Any) -> Flow[str]:
        """The session of a resume, refused before the lease is written when it has no
        turn in flight."""
        sid = yield from self._target(check_id(session_id))
        if self.checkpointer is None:
            raise InvalidInputError("This agent has no checkpointer: turns cannot be resumed.")
        yield from self._threads.resolve(sid)
        yield from self._in_flight(sid, value)
        return sid

    def _switch(self, sid: str) -> None:
        on_switch(self._runtime, self._last_session, sid)
        self._last_session = sid

    async def _aswitch(self, sid: str) -> None:
        previous, self._last_session = self._last_session, sid
        await aon_switch(self._runtime, previous, sid)

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

    def _finished(self, sid: str, result: TurnResult, turn: _TurnRun | None = None) -> TurnResult:
        if turn is None or turn.on_thread:
            token = None if turn is None else turn.token
            run(self._threads.finished(sid, result.interrupted, token), None)
        self._recorder.settle()  # a sync turn's events are stored when it returns
        return result

    async def _afinished(
        self, sid: str, result: TurnResult, turn: _TurnRun | None = None
    ) -> TurnResult:
        if turn is None or turn.on_thread:
            token = None if turn is None else turn.token
            await arun(self._threads.finished(sid, result.interrupted, token), None)
        return result

    def _items(self, sid: str, payload: dict[str, Any], turn: _TurnRun) -> Iterator[Any]:
        """A new turn's run, streamed (`stream_mode` as `turn.mode`; `turn` says how far it
        went).

        On a thread that holds nothing, the turn's first model round runs without the
        checkpointer (`_first_round`; LangGraph's checkpointing costs a turn more than its
        own storage does): a reply that needs no tools is committed there, the thread
        untouched, and the commit frees the session's lease itself. A reply that asks for
        tools is written to the thread as the state after the round
        (`CheckpointThreads.seed`) and the turn goes on there, checkpointed; a first round
        that fails before its commit leaves the turn's input on the thread, so `resume`
        runs it again."""
        graph, first = self._turn_graph, self._first_round
        kw: dict[str, Any] = {"stream_mode": turn.mode}
        fresh = run(self._threads.resolve(sid, first is not None, turn.token), None)
        config = turn.config(self.config(sid))
        if first is None or not fresh:
            yield from graph.stream(payload, config, durability=self._durability, **kw)
            return
        try:
            yield from first.stream(payload, turn.first(config), **kw)
        except Exception:
            if turn.back.committed is None:
                run(self._threads.seed(sid, payload), None)
            raise
        if turn.handed:
            run(self._threads.seed(sid, payload, turn.went_on()), None)
            yield from graph.stream(None, config, durability=self._durability, **kw)
        elif turn.token is not None:
            self._threads.left_empty(sid, turn.token)

    async def _aitems(
        self, sid: str, payload: dict[str, Any], turn: _TurnRun
    ) -> AsyncIterator[Any]:
        """Async twin of `_items`."""
        graph, first = self._turn_graph, self._first_round
        kw: dict[str, Any] = {"stream_mode": turn.mode}
        fresh = await arun(self._threads.resolve(sid, first is not None, turn.token), None)
        config = turn.config(self.config(sid))
        if first is None or not fresh:
            async for item in graph.astream(payload, config, durability=self._durability, **kw):
                yield item
            return
        try:
            async for item in first.astream(payload, turn.first(config), **kw):
                yield item
        except Exception:
            if turn.back.committed is None:
                await arun(self._threads.seed(sid, payload), None)
            raise
        if turn.handed:
            await arun(self._threads.seed(sid, payload, turn.went_on()), None)
            async for item in graph.astream(None, config, durability=self._durability, **kw):
                yield item
        elif turn.token is not None:
            self._threads.left_empty(sid, turn.token)

    def turn(self, session_id: str, text: str, *, tool_choice: ToolChoice = None) -> TurnResult:
        """Run one turn: the model (and its tools, up to `max_tool_rounds`) until it answers.

        Raises:
            SessionNotFoundError / SessionArchivedError: no such session, or it is archived.
            ToolRoundLimitError: the model kept asking for tools; nothing was stored.
            ModelCallError: the model failed; nothing was stored.

        An error raised means nothing of the turn was stored (retrying it is safe): one after
        the turn's commit (a checkpoint write that failed) is logged as a warning, and the
        stored turn's reply is returned (so it is by `aturn`, `resume`, and a stream ends).

        `tool_choice` forces the turn's first model call to use tools (`"required"`, a
        tool's name, ...); later rounds of the turn are free to answer. A name that is not
        one of the session's tools raises `InvalidInputError` before anything is written.
        """
        sid, payload = run(self._begin(session_id, text, tool_choice), self.storage)
        turn = _TurnRun()
        try:
            # the run's first step takes the read made with the lease (see `_held_run`)
            with self._held_run(sid, turn):
                self._switch(sid)
                out = _output(self._items(sid, payload, turn))
                return self._finished(sid, self._result(sid, out), turn)
        except Exception as error:
            return self._stored(sid, turn, error, settle=True)

    async def aturn(
        self, session_id: str, text: str, *, tool_choice: ToolChoice = None
    ) -> TurnResult:
        """Async twin of `turn`."""
        sid, payload = await arun(self._begin(session_id, text, tool_choice), self.storage)
        turn = _TurnRun()
        try:
            async with self._aheld_run(sid, turn):
                await self._aswitch(sid)
                out = _output([item async for item in self._aitems(sid, payload, turn)])
                return await self._afinished(sid, self._result(sid, out), turn)
        except Exception as error:
            return self._stored(sid, turn, error)

    def _stored(
        self, sid: str, turn: _TurnRun, error: Exception, *, settle: bool = False
    ) -> TurnResult:
        """The reply of a turn whose run raised after its commit (a checkpoint write that
        failed, the thread's pruning, the lease's release): the turn is stored, so the call
        answers with it (a caller that retried would store it twice); the failure is logged
        as a warning, and the thread pruned where the saver still could (`_held_run`). A run
        that raised before its commit (`turn.back.committed` unset) raises `error` again.
        `settle`: a sync call settles the events recorded first."""
        if turn.back.committed is None:
            raise error
        if settle:
            self._recorder.settle()
        logger.warning(
            "A turn of session %r is stored, but the run failed after its commit (%s: %s); "
            "its reply is returned: retrying it would store the turn twice.",
            sid, type(error).__name__, error, exc_info=error,
        )  # fmt: skip
        return self._result(sid, turn.back.committed)

    @contextmanager
    def _held_run(self, sid: str, turn: _TurnRun, *, prefetch: bool = True) -> Iterator[None]:
        """A turn's run: the session's lease, held for the whole run (its checkpoint thread
        included: pruning it must not race another agent's run) and lent to the graph's
        nodes, whose commit may free it in its own transaction when `turn.back` allows it
        (pruning the run will touch nothing on disk). With `prefetch`, the lease is taken
        with the turn's one read of an active session (a missing or archived session is
        refused before anything is written), which the run's first step takes; its
        checkpoint thread is looked up in it (`_items`).

        A run that raises after its turn's commit (`back.committed`: a checkpoint write that
        failed) ended a stored turn, whose thread is pruned as `finished` prunes it, as far
        as the saver still can (what it leaves is a turn in flight that a resume finds
        stored, and that the session's next turn replaces)."""
        leases, back = self._leases, turn.back
        with (
            leases.hold(sid, handback=back, prefetch=prefetch) as lease,
            leases.lending(lease, back),
        ):
            turn.token = lease.token
            try:
                yield
            except BaseException:
                if back.committed is not None:
                    with suppress(Exception):
                        run(self._threads.finished(sid, False), None)
                raise

    @asynccontextmanager
    async def _aheld_run(
        self, sid: str, turn: _TurnRun, *, prefetch: bool = True
    ) -> AsyncIterator[None]:
        """Async twin of `_held_run`."""
        leases, back = self._leases, turn.back
        async with leases.ahold(sid, handback=back, prefetch=prefetch) as lease:
            with leases.lending(lease, back):
                turn.token = lease.token
                try:
                    yield
                except BaseException:
                    if back.committed is not None:
                        with suppress(Exception):
                            await arun(self._threads.finished(sid, False), None)
                    raise

    def resume(self, session_id: str, value: Any = None) -> TurnResult:
        """Continue a turn that waits on an interrupt (with `value`) or that crashed.

        Raises:
            InvalidInputError: the session has no turn in flight (or the agent no
                checkpointer): refused before anything is written. The turn's state is read
                again under the session's lease, so of two resumes at once the second finds
                the turn finished and raises this.
            SessionNotFoundError / SessionArchivedError: no such session, or it is archived.
        """
        sid = run(self._resumable(session_id, value), self.storage)
        turn = _TurnRun()  # its handback keeps the lease held to the end
        try:
            with self._held_run(sid, turn, prefetch=False):
                # read again under the lease: a resume that ended meanwhile left nothing to do
                payload = run(self._in_flight(sid, value), None)
                # a run that continues a turn looks for it in L3 first, where a crash after
                # its commit left it
                config = flagged(self.config(sid), RESUMING_KEY)
                out = self._turn_graph.invoke(payload, config, durability=self._durability)
                return self._finished(sid, self._result(sid, out))
        except Exception as error:
            return self._stored(sid, turn, error, settle=True)

    async def aresume(self, session_id: str, value: Any = None) -> TurnResult:
        """Async twin of `resume`."""
        sid = await arun(self._resumable(session_id, value), self.storage)
        turn = _TurnRun()  # its handback keeps the lease held to the end
        try:
            async with self._aheld_run(sid, turn, prefetch=False):
                payload = await arun(self._in_flight(sid, value), None)
                config = flagged(self.config(sid), RESUMING_KEY)
                out = await self._turn_graph.ainvoke(payload, config, durability=self._durability)
                return await self._afinished(sid, self._result(sid, out))
        except Exception as error:
            return self._stored(sid, turn, error)

    # -- streaming --------------------------------------------------------------------------
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
        once and stores nothing of it while its model call is in flight: the call is
        abandoned and stops at its next token, which closes the provider's HTTP stream (see
        `nodes._model_call`). A reply that needs no tools is committed in the step that
        called the model, as soon as the model has answered: a stream closed while its last
        tokens are still being read may find the turn stored (the session's turn count
        tells).
        """
        return in_own_context(self._stream(session_id, text, stream_mode, tool_choice))

    def _stream(
        self,
        session_id: str,
        text: str,
        stream_mode: str | Sequence[str],
        tool_choice: ToolChoice,
    ) -> Generator[Any, None, None]:
        sid, payload = run(self._begin(session_id, text, tool_choice), self.storage)
        multi = not isinstance(stream_mode, str)
        modes = [stream_mode] if isinstance(stream_mode, str) else list(stream_mode)
        cancel = CallCancel()  # closing the stream (or Ctrl-C) stops the model call at once
        turn = _TurnRun(stream_mode, {CANCEL_KEY: cancel})
        try:
            with self._held_run(sid, turn):
                self._switch(sid)
                q = self._mux.open()
                items = stoppable(lambda: self._items(sid, payload, turn), cancel.cancel)
                try:
                    for item in items:
                        yield from self._mux.drain(q, modes, multi)
                        if "messages" not in modes or self._mux.from_model(item, multi):
                            yield item
                    yield from self._mux.drain(q, modes, multi)
                finally:
                    items.close()  # now, under the lock: the run has ended when this returns
                    self._mux.close(q)
                run(self._stream_end(sid, turn), None)
        except Exception as error:
            self._stored(sid, turn, error)  # the stream ends as the turn did

    async def astream(
        self,
        session_id: str,
        text: str,
        stream_mode: str | Sequence[str] = "messages",
        *,
        tool_choice: ToolChoice = None,
    ) -> AsyncIterator[Any]:
        """Async twin of `stream`."""
        sid, payload = await arun(self._begin(session_id, text, tool_choice), self.storage)
        multi = not isinstance(stream_mode, str)
        modes = [stream_mode] if isinstance(stream_mode, str) else list(stream_mode)
        turn = _TurnRun(stream_mode)
        try:
            async with self._aheld_run(sid, turn):
                q = self._mux.open()
                try:
                    await self._aswitch(sid)
                    async for item in self._aitems(sid, payload, turn):
                        for event in self._mux.drain(q, modes, multi):
                            yield event
                        if "messages" not in modes or self._mux.from_model(item, multi):
                            yield item
                    for event in self._mux.drain(q, modes, multi):
                        yield event
                finally:
                    self._mux.close(q)
                await arun(self._stream_end(sid, turn), None)
        except Exception as error:
            self._stored(sid, turn, error)  # the stream ends as the turn did

    def _stream_end(self, sid: str, turn: _TurnRun) -> Flow[None]:
        """A stream's run ended: its turn is finished unless it waits on an interrupt."""
        read = turn.on_thread and self.checkpointer
        state = (yield self._state(sid)) if read else None
        if state is None or not state.interrupts:
            done = TurnResult(session_id=sid, content="")
            yield Call(self._finished, self._afinished, (sid, done, turn))


def _output(values: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """What `invoke` returns of a run streamed in `"values"` mode: its last values, with
    what it waits for (`__interrupt__`) when it waits."""
    out: dict[str, Any] = {}
    for item in values:
        out = {**out, **item} if "__interrupt__" in item else item
    return out


@dataclass(slots=True)
class _TurnRun:
    """How far a new turn's run went (`_Turns._items`): its first round without the
    checkpointer (whose commit may then free the lease: nothing is left to prune), and on
    the session's thread after it, when its reply asked for tools (`handed`, the round's
    update)."""

    mode: str | Sequence[str] = "values"
    flags: dict[str, Any] = field(default_factory=dict)
    """`configurable` keys of the run's config (a stream's `CANCEL_KEY`)."""
    back: Handback = field(default_factory=Handback)
    on_thread: bool = True
    handed: list[dict[str, Any]] = field(default_factory=list)
    token: int | None = None
    """The fencing token of the session's lease the turn runs under."""

    def config(self, config: RunnableConfig) -> RunnableConfig:
        """The run's config on the session's thread (`config`)."""
        return {**config, "configurable": {**config.get("configurable", {}), **self.flags}}

    def first(self, config: RunnableConfig) -> RunnableConfig:
        """The first round's config (it hands its update over in `handed`)."""
        self.on_thread, self.back.allowed = False, True
        return flagged(config, HANDOFF_KEY, self.handed)

    def went_on(self) -> dict[str, Any]:
        """The turn goes on on the thread: the first round's update, to write there."""
        self.on_thread, self.back.allowed = True, False
        return self.handed[0]
