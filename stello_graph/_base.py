"""What `Session` and `MainSession` share: reading a turn's context, one model call, commit.

A turn has three steps, each usable on its own by an orchestration layer (the LangGraph nodes
in `stello_graph.nodes` use them):

1. `turn_context()` reads the session (refusing archived ones) and returns a `TurnContext`:
   the system message, the sanitised L3 history and the insight it carries.
2. `invoke(prompt)` makes exactly one model call.
3. `commit_turn(records, insight=...)` appends the turn's records in one transaction and,
   only then, consumes the insight that was shown.

`send` / `stream` are these three steps for a turn of one model call.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Generator, Sequence
from dataclasses import replace
from functools import cached_property, partial
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.runnables import Runnable, RunnableConfig

from stello_graph._calls import call_async, call_sync, failing_as
from stello_graph._context import message_text, summary_block, system_message
from stello_graph._copies import detached_all
from stello_graph._flow import Call, Flow, Storage, arun, run
from stello_graph._session_core import SessionCore
from stello_graph._stream import AsyncSessionStream, SessionStream
from stello_graph._text import storable, storable_message
from stello_graph._turn_parts import (
    _READ,
    ContextParts,
    ModelInput,
    ToolChoice,
    TurnContext,
    _as_ai_message,
    _check_tool_results,
    _chunk_to_message,
    _continue_history,
    _opt_str,
    check_tool_choice,
    to_send_result,
)
from stello_graph._validate import check_text
from stello_graph.compression import plan_cut
from stello_graph.errors import (
    FunctionCallError,
    FunctionNotConfiguredError,
    InvalidInputError,
    ModelCallError,
    ModelNotConfiguredError,
    SessionNotFoundError,
)
from stello_graph.lease import Handback, SessionLeases
from stello_graph.memory import CompressFn, llm_compressor
from stello_graph.models import Compression, Lease, SendResult, SessionMeta
from stello_graph.storage import MainStorage, SessionSnapshot

__all__ = [
    "SessionBase",
    "ToolChoice",
    "TurnContext",
    "check_tool_choice",
]


class SessionBase(SessionCore):
    """Shared machinery of `Session` and `MainSession`; not instantiated directly.

    On top of `SessionCore` (identity, meta, records, system prompt): the turn's context
    and its compression (`CompressionPolicy`), the model call, the commit, `send` and
    `stream`.
    """

    # -- the turn's context ----------------------------------------------------------------
    def open_turn(self, *, operation: str = "a turn") -> str | None:
        """Refuse a turn on an archived session; return the insight the turn will show.

        A cheap check for the start of a turn: the history is read by `turn_context`.
        """
        return run(self._open_flow(operation), self._storage)

    async def aopen_turn(self, *, operation: str = "a turn") -> str | None:
        """Async twin of `open_turn`."""
        return await arun(self._open_flow(operation), self._storage)

    def _open_flow(self, operation: str) -> Flow[str | None]:
        self._active((yield from self._meta_flow()), operation)
        if self.role == "main":
            return None
        insight: str | None = yield Storage(MainStorage.get_insight, self._id)
        return insight

    def turn_context(
        self,
        *,
        operation: str = "a turn",
        insight: object = _READ,
        turn_id: str | None = None,
        snapshot: SessionSnapshot | None = None,
    ) -> TurnContext:
        """Read everything a turn shows the model; refuse if the session is archived.

        `insight` replaces the stored insight (a multi-round turn keeps showing the insight
        it started with, even if a newer one arrives meanwhile). When the prompt would
        outgrow the model's context window, the oldest records are summarised (see
        `CompressionPolicy`); that may call the compress function.

        With the `turn_id` of a turn of several model calls, its later calls get the context
        its first one read (L3 changes only when a turn commits), unless the session's L3
        changed meanwhile: a turn reads its context once.

        The session is read in one storage read (`SessionStorage.read_session`), or not at
        all when the caller already read it under the turn's lease and passes its `snapshot`.
        """
        flow = self._context_flow(operation, insight, turn_id, snapshot)
        return run(flow, self._storage)

    async def aturn_context(
        self,
        *,
        operation: str = "a turn",
        insight: object = _READ,
        turn_id: str | None = None,
        snapshot: SessionSnapshot | None = None,
    ) -> TurnContext:
        """Async twin of `turn_context`."""
        flow = self._context_flow(operation, insight, turn_id, snapshot)
        return await arun(flow, self._storage)

    def _context_flow(
        self,
        operation: str,
        insight: object,
        turn_id: str | None,
        snapshot: SessionSnapshot | None = None,
    ) -> Flow[TurnContext]:
        sid, kept = self._id, self._turn
        held = turn_id is not None and kept is not None and kept[0] == turn_id
        if held and kept is not None and (yield Storage(MainStorage.count_records, sid)) == kept[1]:
            return kept[2]
        snap: SessionSnapshot | None = snapshot or (yield Storage(MainStorage.read_session, sid))
        if snap is None:
            raise SessionNotFoundError(sid)
        meta = self._active(snap.meta, operation)
        parts = ContextParts(prompt=snap.system_prompt, compression=snap.compression)
        if self.role == "main":
            parts.extra = snap.memory
        else:
            parts.extra = snap.insight if insight is _READ else _opt_str(insight)
            parts.branch = snap.subtree_synthesis
            if self._topology_slot is not None:
                parts.topology = yield from self._topology_slot.flow(sid)
        records = list(snap.records)
        system = self._system(meta, parts)
        cut = self._plan(system, parts, records)
        if cut is not None:
            parts.compression = yield from self._compress_flow(parts.compression, records, cut)
            system = self._system(meta, parts)
        through = parts.compression.through if parts.compression is not None else 0
        insight = None if self.role == "main" else parts.extra
        ctx = TurnContext(sid, system, self._history(records[through:]), insight, parts.compression)
        self._turn = None if turn_id is None else (turn_id, len(records), ctx)
        return ctx

    def _system(self, meta: SessionMeta, parts: ContextParts) -> SystemMessage | None:
        summary = parts.compression.summary if parts.compression is not None else None
        blocks = self._blocks(meta, parts)
        return system_message([parts.prompt, *blocks, summary_block(summary) if summary else None])

    def _blocks(self, meta: SessionMeta, parts: ContextParts) -> list[str | None]:
        """The system message's parts between the session's own prompt and the summary."""
        raise NotImplementedError

    # -- automatic compression --------------------------------------------------------------
    def _plan(
        self, system: SystemMessage | None, parts: ContextParts, records: list[BaseMessage]
    ) -> int | None:
        policy = self._compression
        if policy is None:
            return None
        window = policy.limit(self._model)
        head = [system] if system is not None else []
        # The usage figures of replies older than the summary in use measured a prompt that
        # still held the records it now covers: a tool round of the turn that cut (its own
        # replies are not in L3 yet), or the turn after one that failed, must not judge the
        # shorter history by them, or it cuts again and keeps less than the budget allows.
        cut = self._cut
        fresh = cut[1] if cut is not None and cut[0] == parts.compression else 0
        return plan_cut(policy, window, head, records, parts.compression, measured_from=fresh)

    def _compressor(self) -> CompressFn:
        policy = self._compression
        if policy is not None and policy.compress_fn is not None:
            return policy.compress_fn
        if self._model is None:
            raise FunctionNotConfiguredError(
                f"Session {self._id!r} has no compress function and no model to build one: "
                "pass CompressionPolicy(compress_fn=...) or a model."
            )
        return llm_compressor(self._model)

    def _compress_flow(
        self, current: Compression | None, records: list[BaseMessage], cut: int
    ) -> Flow[Compression]:
        start = current.through if current is not None else 0
        previous = current.summary if current is not None else None
        with failing_as(self._compress_error):
            older = detached_all(records[start:cut])
            result = yield Call(call_sync, call_async, (self._compressor(), previous, older))
        if not isinstance(result, str) or not result.strip():
            raise FunctionCallError(
                f"The compress function of session {self._id!r} returned {result!r:.60}, "
                "expected a non-empty summary.",
                session_id=self._id,
            )
        compression = Compression(summary=storable(result), through=cut)
        yield Storage(MainStorage.put_compression, self._id, compression)
        self._cut = compression, len(records)
        return compression

    def _compress_error(self, exc: Exception) -> FunctionCallError:
        return FunctionCallError(
            f"Compressing the context of session {self._id!r} failed: {type(exc).__name__}: {exc}",
            session_id=self._id,
        )

    # -- the model call ---------------------------------------------------------------------
    def _bind(self, model: BaseChatModel, tool_choice: ToolChoice) -> Runnable[ModelInput, Any]:
        try:
            if tool_choice is None:
                return model.bind_tools(self._tools)
            return model.bind_tools(self._tools, tool_choice=tool_choice)  # type: ignore[arg-type]
        except NotImplementedError:
            raise ModelNotConfiguredError(
                f"{type(model).__name__} does not support tools "
                "(bind_tools is not implemented); use a tool-calling model."
            ) from None

    def _runnable(self, tool_choice: ToolChoice = None) -> Runnable[ModelInput, Any]:
        """The model, bound to the session's tools (forced as `tool_choice` says, if given)."""
        if self._model is None:
            raise ModelNotConfiguredError(
                f"Session {self._id!r} has no chat model; pass model= to create() or load()."
            )
        if tool_choice is not None:
            if not self._tools:
                raise InvalidInputError(
                    f"tool_choice={tool_choice!r}, but session {self._id!r} has no tools."
                )
            choice = check_tool_choice(tool_choice, self._tools, session_id=self._id)
            return self._bind(self._model, choice)
        if self._bound is None:
            self._bound = self._bind(self._model, None) if self._tools else self._model
        return self._bound

    def _config(self) -> RunnableConfig:
        meta = self._meta
        return {
            "run_name": "stello.session",
            "tags": ["stello:session"],
            "metadata": {"stello_session_id": self._id, "stello_session_label": meta.label},
        }

    def _model_error(self, exc: Exception) -> ModelCallError:
        return ModelCallError(
            f"The model call of session {self._id!r} failed: {type(exc).__name__}: {exc}",
            session_id=self._id,
        )

    def invoke(self, prompt: Sequence[BaseMessage], *, tool_choice: ToolChoice = None) -> AIMessage:
        """One model call with `prompt`; provider errors become `ModelCallError`.

        `tool_choice` forces this call's use of tools as LangChain's `bind_tools` does
        (`"required"` / `"any"`, a tool's name, ...); by default the model chooses.
        """
        runnable = self._runnable(tool_choice)
        with failing_as(self._model_error):
            return _as_ai_message(runnable.invoke(list(prompt), config=self._config()), self._id)

    async def ainvoke(
        self, prompt: Sequence[BaseMessage], *, tool_choice: ToolChoice = None
    ) -> AIMessage:
        """Async twin of `invoke`."""
        runnable = self._runnable(tool_choice)
        with failing_as(self._model_error):
            reply = await runnable.ainvoke(list(prompt), config=self._config())
            return _as_ai_message(reply, self._id)

    # -- commit -----------------------------------------------------------------------------
    def commit_turn(
        self,
        records: Sequence[BaseMessage],
        *,
        insight: str | None = None,
        lease: Lease | None = None,
        turn_id: str | None = None,
        release: bool = False,
    ) -> int:
        """Append a turn's records in one transaction, then consume the insight it showed;
        return the session's user turns afterwards.

        A turn that starts with a user message counts as one user turn. The insight is
        cleared only if it is still the one shown (a newer one is kept for the next turn).
        A session archived while the turn ran (or before a crashed turn was resumed) refuses
        the records with `SessionArchivedError`. Records the user did not write (replies,
        tool results) are stored with U+FFFD in place of any lone surrogate; a user message
        holding one is refused with `InvalidInputError`. With the turn's `lease`, a turn that
        lost it commits nothing (`LeaseLostError`), and with `release` the lease is freed in
        the same transaction. The records are stored as the turn `turn_id` (a new id by
        default; see `messages`).

        The whole commit is one storage call (`SessionStorage.commit_records`): one read of
        the session, the append, one write of what changes.
        """
        return run(self.commit_flow(records, insight, lease, turn_id, release), self._storage)

    async def acommit_turn(
        self,
        records: Sequence[BaseMessage],
        *,
        insight: str | None = None,
        lease: Lease | None = None,
        turn_id: str | None = None,
        release: bool = False,
    ) -> int:
        """Async twin of `commit_turn`."""
        flow = self.commit_flow(records, insight, lease, turn_id, release)
        return await arun(flow, self._storage)

    def commit_flow(
        self,
        records: Sequence[BaseMessage],
        insight: str | None,
        lease: Lease | None,
        turn_id: str | None,
        release: bool,
    ) -> Flow[int]:
        """The steps of `commit_turn` (`stello_graph._flow`), for a caller that commits the
        turn inside a flow of its own (the turn graph's commit)."""
        # the text the user did not write made storable (`_text`)
        stored = [m if isinstance(m, HumanMessage) else storable_message(m) for m in records]
        turns: int = yield Storage(
            MainStorage.commit_records,
            self._id,
            stored,
            user_turn=bool(stored) and isinstance(stored[0], HumanMessage),
            turn_id=turn_id,
            insight=insight,
            lease=lease,
            release=release,
        )
        return turns

    # -- send -------------------------------------------------------------------------------
    def send(self, content: str, *, tool_choice: ToolChoice = None) -> SendResult:
        """Send a user message: exactly one model call; the message and reply go to L3.

        If the reply asks for tools, run them and pass their results to `send_tool_results`.
        `tool_choice` forces the call's use of tools (e.g. `"required"` or a tool's name).
        The text is stored exactly as given (text that looks like JSON is still user text).
        The call holds the session's lease (`stello_graph.lease`): turns on one session, from
        here, other threads, agents or processes, run one at a time.
        """
        return self._send(HumanMessage(content=check_text(content)), tool_choice)

    async def asend(self, content: str, *, tool_choice: ToolChoice = None) -> SendResult:
        """Async twin of `send`."""
        return await self._asend(HumanMessage(content=check_text(content)), tool_choice)

    @cached_property
    def _leases(self) -> SessionLeases:
        return SessionLeases(self._storage)

    def send_tool_results(self, results: Sequence[ToolMessage] | ToolMessage) -> SendResult:
        """Continue a turn whose reply asked for tools: one model call with their results.

        `results` must answer every tool call of the last reply in L3. The results and the
        new reply are appended to L3 together.
        """
        tool_messages = _check_tool_results(results)
        run(self._continuable_flow(tool_messages), self._storage)
        return self._send(tool_messages, None)

    async def asend_tool_results(self, results: Sequence[ToolMessage] | ToolMessage) -> SendResult:
        """Async twin of `send_tool_results`."""
        tool_messages = _check_tool_results(results)
        await arun(self._continuable_flow(tool_messages), self._storage)
        return await self._asend(tool_messages, None)

    def _continuable_flow(self, tool_messages: list[ToolMessage]) -> Flow[None]:
        """Refuse tool results that continue no reply, before the lease is taken."""
        self._active((yield from self._meta_flow()), "a turn")
        records = yield Storage(MainStorage.shared_records, self._id)
        _continue_history(self._id, records, tool_messages)

    def _send(self, new: HumanMessage | list[ToolMessage], tool_choice: ToolChoice) -> SendResult:
        """A turn of one model call under the session's lease, which its commit frees."""
        back = Handback(allowed=True)  # the commit frees the lease
        with self._leases.hold(self._id, handback=back) as lease:
            reply = run(self._send_flow(new, tool_choice, lease), self._storage)
            back.released = True
        return to_send_result(reply)

    async def _asend(
        self, new: HumanMessage | list[ToolMessage], tool_choice: ToolChoice
    ) -> SendResult:
        """Async twin of `_send`."""
        back = Handback(allowed=True)  # the commit frees the lease
        async with self._leases.ahold(self._id, handback=back) as lease:
            reply = await arun(self._send_flow(new, tool_choice, lease), self._storage)
            back.released = True
        return to_send_result(reply)

    def _send_flow(
        self, new: HumanMessage | list[ToolMessage], tool_choice: ToolChoice, lease: Lease
    ) -> Flow[AIMessage]:
        """Read the context, call the model with it and `new` (a user message, or the tool
        results that continue the last reply), commit both."""
        ctx: TurnContext = yield from self._context_flow("a turn", _READ, None)
        if isinstance(new, HumanMessage):
            records: list[BaseMessage] = [new]
            prompt = ctx.prompt(records)
        else:
            start = ctx.compression.through if ctx.compression is not None else 0
            raw = (yield Storage(MainStorage.shared_records, self._id))[start:]
            prompt = replace(ctx, history=_continue_history(self._id, raw, new)).prompt()
            records = [*new]
        invoke = partial(self.invoke, tool_choice=tool_choice)
        ainvoke = partial(self.ainvoke, tool_choice=tool_choice)
        reply: AIMessage = yield Call(invoke, ainvoke, (prompt,))
        yield from self.commit_flow([*records, reply], ctx.insight, lease, None, True)
        return reply

    # -- stream -----------------------------------------------------------------------------
    def stream(self, content: str) -> SessionStream:
        """Like `send`, yielding the reply's text chunks (`str`) as the model produces them.

        The `SendResult` is `stream.result` once the stream is exhausted; the turn is
        committed then. A stream closed early commits nothing and keeps the insight. The
        session's lease is held from the first chunk asked for until the stream ends.
        """
        human = HumanMessage(content=check_text(content))
        self._active(run(self._meta_flow(), self._storage), "a turn")
        self._runnable()
        return SessionStream(self._stream_turn(human))

    def _stream_turn(self, human: HumanMessage) -> Generator[str | SendResult, None, None]:
        back = Handback(allowed=True)  # the commit frees the lease
        with self._leases.hold(self._id, handback=back) as lease:
            ctx = self.turn_context()
            runnable = self._runnable()
            total: AIMessageChunk | None = None
            with failing_as(self._model_error):
                for chunk in runnable.stream(ctx.prompt([human]), config=self._config()):
                    total, text = self._added(total, chunk)
                    if text:
                        yield text
            reply = _chunk_to_message(total, self._id)
            self.commit_turn([human, reply], insight=ctx.insight, lease=lease, release=True)
            back.released = True
        yield to_send_result(reply)

    def astream(self, content: str) -> AsyncSessionStream:
        """Async twin of `stream`: `async for chunk in session.astream("...")`."""
        human = HumanMessage(content=check_text(content))
        return AsyncSessionStream(self._astream_turn(human))

    async def _astream_turn(self, human: HumanMessage) -> AsyncGenerator[str | SendResult, None]:
        back = Handback(allowed=True)  # the commit frees the lease
        async with self._leases.ahold(self._id, handback=back) as lease:
            ctx = await self.aturn_context()
            runnable = self._runnable()
            total: AIMessageChunk | None = None
            with failing_as(self._model_error):
                async for chunk in runnable.astream(ctx.prompt([human]), config=self._config()):
                    total, text = self._added(total, chunk)
                    if text:
                        yield text
            reply = _chunk_to_message(total, self._id)
            await self.acommit_turn([human, reply], insight=ctx.insight, lease=lease, release=True)
            back.released = True
        yield to_send_result(reply)

    @staticmethod
    def _added(total: AIMessageChunk | None, chunk: object) -> tuple[AIMessageChunk, str]:
        """The reply so far with `chunk` added, and the chunk's text."""
        if not isinstance(chunk, AIMessageChunk):
            chunk = AIMessageChunk(content=message_text(_as_ai_message(chunk).content))
        return (chunk if total is None else total + chunk), message_text(chunk.content)
