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
from functools import partial
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    ToolMessage,
)
from langchain_core.runnables import Runnable, RunnableConfig

from stello_graph._calls import failing_as
from stello_graph._context import message_text
from stello_graph._flow import Call, Flow, Storage, arun, run
from stello_graph._session_context import SessionContext
from stello_graph._stream import AsyncSessionStream, SessionStream
from stello_graph._text import storable_message
from stello_graph._turn_parts import (
    _READ,
    ModelInput,
    ToolChoice,
    TurnContext,
    _as_ai_message,
    _check_tool_results,
    _chunk_to_message,
    _continue_history,
    check_tool_choice,
    to_send_result,
)
from stello_graph._validate import (
    check_text,
)
from stello_graph.errors import (
    InvalidInputError,
    ModelCallError,
    ModelNotConfiguredError,
)
from stello_graph.lease import Handback, SessionLeases
from stello_graph.models import Lease, SendResult
from stello_graph.storage import MainStorage

__all__ = [
    "SessionBase",
    "ToolChoice",
    "TurnContext",
    "check_tool_choice",
]


def _freed_by_commit() -> Handback:
    """A turn's hold whose commit frees the lease in its own transaction."""
    return Handback(allowed=True)


class SessionBase(SessionContext):
    """Shared machinery of `Session` and `MainSession`; not instantiated directly.

    Its layers: `SessionCore` (identity, meta, records, system prompt), `SessionContext`
    (the turn's context and compression), and here the model call, the commit, `send` and
    `stream`.
    """

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

    def _leases(self) -> SessionLeases:
        if self._lease_keeper is None:
            self._lease_keeper = SessionLeases(self._storage)
        return self._lease_keeper

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
        back = _freed_by_commit()
        with self._leases().hold(self._id, handback=back) as lease:
            reply = run(self._send_flow(new, tool_choice, lease), self._storage)
            back.released = True
        return to_send_result(reply)

    async def _asend(
        self, new: HumanMessage | list[ToolMessage], tool_choice: ToolChoice
    ) -> SendResult:
        """Async twin of `_send`."""
        back = _freed_by_commit()
        async with self._leases().ahold(self._id, handback=back) as lease:
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
        back = _freed_by_commit()  # the commit frees the lease
        with self._leases().hold(self._id, handback=back) as lease:
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
        back = _freed_by_commit()  # the commit frees the lease
        async with self._leases().ahold(self._id, handback=back) as lease:
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
