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

from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, cast

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

from stello_graph._calls import call_async, call_sync
from stello_graph._context import SanitizedHistory, message_text, sanitize_history
from stello_graph._copies import ashared_records, detached_all, shared_records
from stello_graph._flow import Call, Flow, Storage, arun, run
from stello_graph._stream import AsyncSessionStream, SessionStream
from stello_graph._text import storable, storable_message
from stello_graph._topology_slot import TopologySlot
from stello_graph._validate import (
    check_id,
    check_label,
    check_metadata,
    check_optional_text,
    check_tags,
    check_text,
    new_id,
)
from stello_graph.checkpoints._serde import with_turn
from stello_graph.compression import CompressionPolicy, plan_cut
from stello_graph.errors import (
    FunctionCallError,
    FunctionNotConfiguredError,
    InvalidInputError,
    ModelCallError,
    ModelNotConfiguredError,
    SessionArchivedError,
    SessionNotFoundError,
    StelloError,
)
from stello_graph.lease import SessionLeases
from stello_graph.memory import CompressFn, llm_compressor
from stello_graph.models import Compression, Lease, SendResult, SessionMeta, SessionRole, utcnow
from stello_graph.storage import SessionStorage

__all__ = [
    "ContextParts",
    "SessionBase",
    "TurnContext",
    "check_loaded",
    "new_meta",
    "to_send_result",
]

ModelInput = Sequence[BaseMessage]
ToolChoice = str | dict[str, Any] | bool | None
"""How a call must use its tools, as LangChain's `bind_tools(tool_choice=...)` takes it."""


_CHOICE_MODES = frozenset({"auto", "none", "required", "any"})


def _named_tool(choice: str | dict[str, Any] | bool) -> str | None:
    """The tool a `tool_choice` names (a name, or an OpenAI-style dict), if it names one."""
    if isinstance(choice, str):
        return None if choice in _CHOICE_MODES else choice
    if isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else choice.get("name")
        return name if isinstance(name, str) else None
    return None


def _tool_names(tools: Sequence[Any]) -> list[str] | None:
    """The names the model sees for `tools`; `None` when one cannot be told."""
    from langchain_core.utils.function_calling import convert_to_openai_tool

    try:
        return [str(convert_to_openai_tool(t)["function"]["name"]) for t in tools]
    except Exception:  # a tool only the model's own bind_tools understands
        return None


def check_tool_choice(
    value: object, tools: Sequence[Any] | None = None, *, session_id: str | None = None
) -> str | dict[str, Any] | bool:
    """A `tool_choice` LangChain accepts: a string, a dict or a bool; given the session's
    `tools`, one that names a tool must name one of them (checked here, before the call,
    since many providers' clients send any name and fail only at the provider)."""
    if not (isinstance(value, bool | dict) or (isinstance(value, str) and value.strip())):
        raise InvalidInputError(
            f"tool_choice must be 'auto', 'required', 'any', a tool name, a dict or a bool, "
            f"got {value!r}."
        )
    named = _named_tool(value)
    names = None if tools is None or named is None else _tool_names(tools)
    if names is not None and named not in names:
        raise InvalidInputError(
            f"tool_choice {named!r} names no tool of session {session_id!r}; its tools are "
            f"{names!r}: name one of them, or pass 'auto' or 'required'."
        )
    return value


_READ: Any = object()  # sentinel: read the insight from storage


def _opt_str(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise InvalidInputError(f"insight must be a str or None, got {type(value).__name__}.")


@dataclass(slots=True)
class ContextParts:
    """The pieces of a session's system message, read from storage."""

    prompt: str | None = None
    extra: str | None = None
    """The insight (child session) or the synthesis (main session)."""
    branch: str | None = None
    """The subtree synthesis of a child that has children of its own."""
    compression: Compression | None = None
    topology: str | None = None
    """The topology slot (`stello_graph._topology_slot`), when the session shows one."""


@dataclass(frozen=True, slots=True)
class TurnContext:
    """A snapshot of what one turn of a session shows its model.

    Attributes:
        session_id: the session the turn runs on.
        system: the leading system message (system prompt, identity, insight or synthesis).
        history: the session's L3, sanitised (no incomplete tool-call groups). The messages
            are the storage's own (not copied: a turn reads all of L3 at every model call),
            so read them but do not change them; `Session.messages()` gives copies.
        insight: the insight shown in `system`, consumed when the turn commits.
        compression: the summary standing for the oldest records, when the history was
            compressed (`history` then starts after the records it covers).
    """

    session_id: str
    system: SystemMessage | None
    history: tuple[BaseMessage, ...]
    insight: str | None = None
    compression: Compression | None = None

    def prompt(self, pending: Sequence[BaseMessage] = ()) -> list[BaseMessage]:
        """The messages of a model call: system, history, then the turn's records so far."""
        head: list[BaseMessage] = [self.system] if self.system is not None else []
        return [*head, *self.history, *pending]


def _as_ai_message(reply: Any) -> AIMessage:
    """The model's reply as an `AIMessage` that can be stored (see `_text`)."""
    if isinstance(reply, AIMessage):
        return storable_message(reply)
    if isinstance(reply, str):
        return AIMessage(content=storable(reply))
    if isinstance(reply, BaseMessage):
        return storable_message(AIMessage(content=reply.content))
    raise ModelCallError(f"The model returned {type(reply).__name__}, not a chat message.")


def to_send_result(reply: AIMessage) -> SendResult:
    """The `SendResult` of a model reply."""
    return SendResult(
        content=message_text(reply.content),
        tool_calls=list(reply.tool_calls),
        usage=reply.usage_metadata,
        message=reply,
    )


def _check_tool_results(results: object) -> list[ToolMessage]:
    """The tool results as a list, their text made storable (a tool's output is not the
    user's text: a lone surrogate in it is replaced, not refused)."""
    if isinstance(results, ToolMessage):
        return [storable_message(results)]
    if not isinstance(results, Sequence) or not results:
        raise InvalidInputError("tool results must be a non-empty list of ToolMessage objects.")
    bad = next((r for r in results if not isinstance(r, ToolMessage)), None)
    if bad is not None:
        raise InvalidInputError(
            f"tool results must be ToolMessage objects, got {type(bad).__name__}."
        )
    return [storable_message(r) for r in cast(Sequence[ToolMessage], results)]


class SessionBase:
    """Shared machinery of `Session` and `MainSession`; not instantiated directly."""

    role: ClassVar[SessionRole] = "standard"
    _topology_slot: TopologySlot | None = None
    """Shows the session where it stands in the tree (`Session` sets it when asked)."""

    def __init__(
        self,
        meta: SessionMeta,
        storage: SessionStorage,
        *,
        model: BaseChatModel | None = None,
        tools: Sequence[Any] | None = None,
        compression: CompressionPolicy | None = None,
    ) -> None:
        self._id = meta.id
        self._compression = compression
        self._meta = meta
        self._storage = storage
        self._model = model
        self._tools: list[Any] = list(tools) if tools else []
        self._bound: Runnable[ModelInput, Any] | None = None
        self._history = SanitizedHistory()  # the history shown at the last model call
        self._lease_keeper: SessionLeases | None = None
        # The last cut this object made, and how many records L3 held then: the replies
        # among those predate the cut (see `_plan`).
        self._cut: tuple[Compression, int] | None = None
        # The context the running turn read: (turn id, records in L3 then, context).
        self._turn: tuple[str, int, TurnContext] | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self._id!r}, label={self._meta.label!r})"

    # -- identity ---------------------------------------------------------------------------
    @property
    def id(self) -> str:
        """The session id."""
        return self._id

    @property
    def meta(self) -> SessionMeta:
        """The session's meta, read from storage (so another writer's changes show)."""
        self._meta = self._load_meta()
        return self._meta

    async def ameta(self) -> SessionMeta:
        """Async twin of `meta`."""
        self._meta = await self._aload_meta()
        return self._meta

    @property
    def storage(self) -> SessionStorage:
        return self._storage

    @property
    def model(self) -> BaseChatModel | None:
        return self._model

    @property
    def tools(self) -> list[Any]:
        """The tools bound to the session's model (LangChain tools or tool schemas)."""
        return list(self._tools)

    # -- storage reads ----------------------------------------------------------------------
    def _load_meta(self) -> SessionMeta:
        meta = self._storage.get_session(self._id)
        if meta is None:
            raise SessionNotFoundError(self._id)
        return meta

    async def _aload_meta(self) -> SessionMeta:
        meta = await self._storage.aget_session(self._id)
        if meta is None:
            raise SessionNotFoundError(self._id)
        return meta

    def _active(self, meta: SessionMeta, operation: str) -> SessionMeta:
        if meta.status == "archived":
            raise SessionArchivedError(self._id, operation)
        self._meta = meta
        return meta

    # -- context ----------------------------------------------------------------------------
    def _memory_part(self) -> bool:
        """Whether the system message carries the session's memory (the main's synthesis)."""
        return False

    def _system(self, meta: SessionMeta, parts: ContextParts) -> SystemMessage | None:
        raise NotImplementedError

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
        if self._memory_part():
            return None
        insight: str | None = yield Storage("get_insight", self._id)
        return insight

    def _meta_flow(self) -> Flow[SessionMeta]:
        meta: SessionMeta | None = yield Storage("get_session", self._id)
        if meta is None:
            raise SessionNotFoundError(self._id)
        return meta

    def turn_context(
        self, *, operation: str = "a turn", insight: object = _READ, turn_id: str | None = None
    ) -> TurnContext:
        """Read everything a turn shows the model; refuse if the session is archived.

        `insight` replaces the stored insight (a multi-round turn keeps showing the insight
        it started with, even if a newer one arrives meanwhile). When the prompt would
        outgrow the model's context window, the oldest records are summarised (see
        `CompressionPolicy`); that may call the compress function.

        With the `turn_id` of a turn of several model calls, its later calls get the context
        its first one read (L3 changes only when a turn commits), unless the session's L3
        changed meanwhile: a turn reads its context once.
        """
        return run(self._context_flow(operation, insight, turn_id), self._storage)

    async def aturn_context(
        self, *, operation: str = "a turn", insight: object = _READ, turn_id: str | None = None
    ) -> TurnContext:
        """Async twin of `turn_context`."""
        return await arun(self._context_flow(operation, insight, turn_id), self._storage)

    def _context_flow(
        self, operation: str, insight: object, turn_id: str | None
    ) -> Flow[TurnContext]:
        s, sid, kept = self._storage, self._id, self._turn
        held = turn_id is not None and kept is not None and kept[0] == turn_id
        if held and kept is not None and (yield Storage("count_records", sid)) == kept[1]:
            return kept[2]
        meta = self._active((yield from self._meta_flow()), operation)
        parts = ContextParts(prompt=(yield Storage("get_system_prompt", sid)))
        if self._memory_part():
            parts.extra = yield Storage("get_memory", sid)
        else:
            read = insight is _READ
            parts.extra = (yield Storage("get_insight", sid)) if read else _opt_str(insight)
            parts.branch = yield Storage("get_subtree_synthesis", sid)
            if self._topology_slot is not None:
                parts.topology = yield from self._topology_slot.flow(sid)
        records: list[BaseMessage] = yield Call(shared_records, ashared_records, (s, sid))
        parts.compression = yield Storage("get_compression", sid)
        cut = self._plan(meta, parts, records)
        if cut is not None:
            parts.compression = yield from self._compress_flow(parts.compression, records, cut)
        ctx = self._turn_context(meta, parts, records)
        self._turn = None if turn_id is None else (turn_id, len(records), ctx)
        return ctx

    def _turn_context(
        self, meta: SessionMeta, parts: ContextParts, records: list[BaseMessage]
    ) -> TurnContext:
        through = parts.compression.through if parts.compression is not None else 0
        history = self._history(records[through:])
        insight = None if self._memory_part() else parts.extra
        system = self._system(meta, parts)
        return TurnContext(self._id, system, history, insight, parts.compression)

    # -- automatic compression --------------------------------------------------------------
    def _plan(
        self, meta: SessionMeta, parts: ContextParts, records: list[BaseMessage]
    ) -> int | None:
        policy = self._compression
        window = policy.window(self._model) if policy is not None else None
        if policy is None or window is None:
            return None
        system = self._system(meta, parts)
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

    def _summary(self, result: object) -> str:
        if not isinstance(result, str) or not result.strip():
            raise FunctionCallError(
                f"The compress function of session {self._id!r} returned {result!r:.60}, "
                "expected a non-empty summary.",
                session_id=self._id,
            )
        return storable(result)

    def _compress_flow(
        self, current: Compression | None, records: list[BaseMessage], cut: int
    ) -> Flow[Compression]:
        start = current.through if current is not None else 0
        previous = current.summary if current is not None else None
        try:
            older = detached_all(records[start:cut])
            result = yield Call(call_sync, call_async, (self._compressor(), previous, older))
        except StelloError:
            raise
        except Exception as exc:
            raise self._compress_error(exc) from exc
        compression = Compression(summary=self._summary(result), through=cut)
        yield Storage("put_compression", self._id, compression)
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
        try:
            return _as_ai_message(runnable.invoke(list(prompt), config=self._config()))
        except StelloError:
            raise
        except Exception as exc:
            raise self._model_error(exc) from exc

    async def ainvoke(
        self, prompt: Sequence[BaseMessage], *, tool_choice: ToolChoice = None
    ) -> AIMessage:
        """Async twin of `invoke`."""
        runnable = self._runnable(tool_choice)
        try:
            return _as_ai_message(await runnable.ainvoke(list(prompt), config=self._config()))
        except StelloError:
            raise
        except Exception as exc:
            raise self._model_error(exc) from exc

    # -- commit -----------------------------------------------------------------------------
    def commit_turn(
        self,
        records: Sequence[BaseMessage],
        *,
        insight: str | None = None,
        lease: Lease | None = None,
        turn_id: str | None = None,
    ) -> None:
        """Append a turn's records in one transaction, then consume the insight it showed.

        A turn that starts with a user message counts as one user turn. The insight is
        cleared only if it is still the one shown (a newer one is kept for the next turn).
        A session archived while the turn ran (or before a crashed turn was resumed) refuses
        the records with `SessionArchivedError`. Records the user did not write (replies,
        tool results) are stored with U+FFFD in place of any lone surrogate; a user message
        holding one is refused with `InvalidInputError`. With the turn's `lease`, a turn that
        lost it commits nothing (`LeaseLostError`). The records are stored as the turn
        `turn_id` (a new id by default; see `messages`).
        """
        with self._storage.transaction():
            run(self._commit_flow(records, insight, lease, turn_id), self._storage)

    async def acommit_turn(
        self,
        records: Sequence[BaseMessage],
        *,
        insight: str | None = None,
        lease: Lease | None = None,
        turn_id: str | None = None,
    ) -> None:
        """Async twin of `commit_turn`."""
        async with self._storage.atransaction():
            await arun(self._commit_flow(records, insight, lease, turn_id), self._storage)

    def _commit_flow(
        self,
        records: Sequence[BaseMessage],
        insight: str | None,
        lease: Lease | None,
        turn_id: str | None,
    ) -> Flow[None]:
        sid, stored = self._id, _storable_records(records)
        if lease is not None:
            yield Storage("check_lease", lease)
        self._active((yield from self._meta_flow()), "a turn's records")
        yield Storage(
            "append_records", sid, stored, user_turn=_is_user_turn(stored), turn_id=turn_id
        )
        if insight is not None:
            yield Storage("clear_insight", sid, expected=insight)

    # -- send -------------------------------------------------------------------------------
    def send(self, content: str, *, tool_choice: ToolChoice = None) -> SendResult:
        """Send a user message: exactly one model call; the message and reply go to L3.

        If the reply asks for tools, run them and pass their results to `send_tool_results`.
        `tool_choice` forces the call's use of tools (e.g. `"required"` or a tool's name).
        The text is stored exactly as given (text that looks like JSON is still user text).
        The call holds the session's lease (`stello_graph.lease`): turns on one session, from
        here, other threads, agents or processes, run one at a time.
        """
        human = HumanMessage(content=check_text(content))
        with self._leases().hold(self._id) as lease:
            ctx = self.turn_context()
            reply = self.invoke(ctx.prompt([human]), tool_choice=tool_choice)
            self.commit_turn([human, reply], insight=ctx.insight, lease=lease)
        return to_send_result(reply)

    async def asend(self, content: str, *, tool_choice: ToolChoice = None) -> SendResult:
        """Async twin of `send`."""
        human = HumanMessage(content=check_text(content))
        async with self._leases().ahold(self._id) as lease:
            ctx = await self.aturn_context()
            reply = await self.ainvoke(ctx.prompt([human]), tool_choice=tool_choice)
            await self.acommit_turn([human, reply], insight=ctx.insight, lease=lease)
        return to_send_result(reply)

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
        self._active(self._load_meta(), "a turn")  # refused before the lease is taken
        _continue_history(self._id, shared_records(self._storage, self._id), tool_messages)
        with self._leases().hold(self._id) as lease:
            ctx = self.turn_context()
            raw = shared_records(self._storage, self._id)[_through(ctx) :]
            history = _continue_history(self._id, raw, tool_messages)
            reply = self.invoke(replace(ctx, history=history).prompt())
            self.commit_turn([*tool_messages, reply], insight=ctx.insight, lease=lease)
        return to_send_result(reply)

    async def asend_tool_results(self, results: Sequence[ToolMessage] | ToolMessage) -> SendResult:
        """Async twin of `send_tool_results`."""
        tool_messages = _check_tool_results(results)
        self._active(await self._aload_meta(), "a turn")  # refused before the lease is taken
        _continue_history(self._id, await ashared_records(self._storage, self._id), tool_messages)
        async with self._leases().ahold(self._id) as lease:
            ctx = await self.aturn_context()
            raw = (await ashared_records(self._storage, self._id))[_through(ctx) :]
            history = _continue_history(self._id, raw, tool_messages)
            reply = await self.ainvoke(replace(ctx, history=history).prompt())
            await self.acommit_turn([*tool_messages, reply], insight=ctx.insight, lease=lease)
        return to_send_result(reply)

    # -- stream -----------------------------------------------------------------------------
    def stream(self, content: str) -> SessionStream:
        """Like `send`, yielding the reply's text chunks (`str`) as the model produces them.

        The `SendResult` is `stream.result` once the stream is exhausted; the turn is
        committed then. A stream closed early commits nothing and keeps the insight. The
        session's lease is held from the first chunk asked for until the stream ends.
        """
        human = HumanMessage(content=check_text(content))
        self._active(self._load_meta(), "a turn")
        self._runnable()
        return SessionStream(self._stream_turn(human))

    def _stream_turn(self, human: HumanMessage) -> Iterator[str | SendResult]:
        with self._leases().hold(self._id) as lease:
            ctx = self.turn_context()
            runnable = self._runnable()
            total: AIMessageChunk | None = None
            try:
                for chunk in runnable.stream(ctx.prompt([human]), config=self._config()):
                    if not isinstance(chunk, AIMessageChunk):
                        text = message_text(_as_ai_message(chunk).content)
                        chunk = AIMessageChunk(content=text)
                    total = chunk if total is None else total + chunk
                    text = message_text(chunk.content)
                    if text:
                        yield text
            except StelloError:
                raise
            except Exception as exc:
                raise self._model_error(exc) from exc
            reply = _chunk_to_message(total)
            self.commit_turn([human, reply], insight=ctx.insight, lease=lease)
        yield to_send_result(reply)

    def astream(self, content: str) -> AsyncSessionStream:
        """Async twin of `stream`: `async for chunk in session.astream("...")`."""
        human = HumanMessage(content=check_text(content))
        return AsyncSessionStream(self._astream_turn(human))

    async def _astream_turn(self, human: HumanMessage) -> AsyncIterator[str | SendResult]:
        async with self._leases().ahold(self._id) as lease:
            ctx = await self.aturn_context()
            runnable = self._runnable()
            total: AIMessageChunk | None = None
            try:
                async for chunk in runnable.astream(ctx.prompt([human]), config=self._config()):
                    if not isinstance(chunk, AIMessageChunk):
                        text = message_text(_as_ai_message(chunk).content)
                        chunk = AIMessageChunk(content=text)
                    total = chunk if total is None else total + chunk
                    text = message_text(chunk.content)
                    if text:
                        yield text
            except StelloError:
                raise
            except Exception as exc:
                raise self._model_error(exc) from exc
            reply = _chunk_to_message(total)
            await self.acommit_turn([human, reply], insight=ctx.insight, lease=lease)
        yield to_send_result(reply)

    # -- records and prompt -----------------------------------------------------------------
    def messages(
        self, *, limit: int | None = None, offset: int = 0, role: str | None = None
    ) -> list[BaseMessage]:
        """L3 records as LangChain messages (copies: safe to change).

        Each one carries the turn that wrote it in `response_metadata`: under
        `"stello_turn_id"` the turn's id (one per committed turn), under `"stello_turn_seq"`
        its place in that turn (0, 1, ...). Chat models do not send `response_metadata` to
        providers, so the messages can be replayed as they are.
        """
        found = self._storage.list_records(self._id, limit=limit, offset=offset, role=role)
        marks = self._storage.list_record_turns(self._id, limit=limit, offset=offset, role=role)
        return _with_turns(found, marks)

    async def amessages(
        self, *, limit: int | None = None, offset: int = 0, role: str | None = None
    ) -> list[BaseMessage]:
        """Async twin of `messages`."""
        s = self._storage
        found = await s.alist_records(self._id, limit=limit, offset=offset, role=role)
        marks = await s.alist_record_turns(self._id, limit=limit, offset=offset, role=role)
        return _with_turns(found, marks)

    def system_prompt(self) -> str | None:
        """The session's own system prompt (without identity, insight or synthesis)."""
        return self._storage.get_system_prompt(self._id)

    async def asystem_prompt(self) -> str | None:
        return await self._storage.aget_system_prompt(self._id)

    def set_system_prompt(self, prompt: str | None) -> None:
        """Replace the system prompt (`None` removes it).

        The status check and the write are one transaction: a session archived meanwhile
        refuses the change with `SessionArchivedError`.
        """
        prompt = check_optional_text(prompt, "system_prompt")
        with self._storage.transaction():
            self._active(self._load_meta(), "a system prompt change")
            self._storage.put_system_prompt(self._id, prompt)

    async def aset_system_prompt(self, prompt: str | None) -> None:
        """Async twin of `set_system_prompt`."""
        prompt = check_optional_text(prompt, "system_prompt")
        async with self._storage.atransaction():
            self._active(await self._aload_meta(), "a system prompt change")
            await self._storage.aput_system_prompt(self._id, prompt)

    def _changes(
        self,
        label: str | None,
        tags: Sequence[str] | None,
        metadata: dict[str, Any] | None,
    ) -> dict[str, Any]:
        """The validated fields of a meta update (checked before any lock is taken)."""
        changes: dict[str, Any] = {}
        if label is not None:
            changes["label"] = check_label(label)
        if tags is not None:
            changes["tags"] = check_tags(tags)
        if metadata is not None:
            changes["metadata"] = check_metadata(metadata)
        return changes

    def _updated(self, meta: SessionMeta, changes: dict[str, Any]) -> SessionMeta:
        return meta.model_copy(update={**changes, "updated_at": utcnow()})

    def update_meta(
        self,
        *,
        label: str | None = None,
        tags: Sequence[str] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> SessionMeta:
        """Change label, tags or metadata (each replaced when given); return the new meta.

        The meta is read, checked and written in one transaction, so the update changes only
        the fields given: a concurrent archive or update of other fields is never undone
        (and an archive that came first refuses the update with `SessionArchivedError`).
        """
        s, changes = self._storage, self._changes(label, tags, metadata)
        with s.transaction():
            new = self._updated(self._active(self._load_meta(), "a meta update"), changes)
            s.put_session(new)
        self._meta = new
        return new

    async def aupdate_meta(
        self,
        *,
        label: str | None = None,
        tags: Sequence[str] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> SessionMeta:
        """Async twin of `update_meta`."""
        s, changes = self._storage, self._changes(label, tags, metadata)
        async with s.atransaction():
            new = self._updated(self._active(await self._aload_meta(), "a meta update"), changes)
            await s.aput_session(new)
        self._meta = new
        return new


def new_meta(role: str, label: object, tags: object, metadata: object, id: object) -> SessionMeta:
    return SessionMeta(
        id=new_id() if id is None else check_id(id),
        label=check_label(label),
        role=role,
        tags=check_tags(tags),
        metadata=check_metadata(metadata),
    )


def check_loaded(meta: SessionMeta | None, session_id: str, role: str) -> SessionMeta:
    if meta is None:
        raise SessionNotFoundError(session_id)
    if meta.role != role:
        other = "MainSession" if meta.role == "main" else "Session"
        raise InvalidInputError(
            f"Session {session_id!r} has role {meta.role!r}; load it with {other}.load()."
        )
    return meta


def _with_turns(
    found: Sequence[BaseMessage], turns: Sequence[tuple[str, int]]
) -> list[BaseMessage]:
    """Copies of `found`, each carrying its `(turn_id, turn_seq)` (see `messages`)."""
    return [with_turn(m.model_copy(deep=True), *turn) for m, turn in zip(found, turns, strict=True)]


def _through(ctx: TurnContext) -> int:
    return ctx.compression.through if ctx.compression is not None else 0


def _storable_records(records: Sequence[BaseMessage]) -> list[BaseMessage]:
    """A turn's records with the text the user did not write made storable (`_text`)."""
    return [m if isinstance(m, HumanMessage) else storable_message(m) for m in records]


def _is_user_turn(records: Sequence[BaseMessage]) -> bool:
    return bool(records) and isinstance(records[0], HumanMessage)


def _chunk_to_message(total: AIMessageChunk | None) -> AIMessage:
    if total is None:
        return AIMessage(content="")
    reply = AIMessage(
        content=total.content,
        tool_calls=total.tool_calls,
        invalid_tool_calls=total.invalid_tool_calls,
        usage_metadata=total.usage_metadata,
        response_metadata=total.response_metadata,
        additional_kwargs=total.additional_kwargs,
        id=total.id,
    )
    return storable_message(reply)


def _continue_history(
    session_id: str, raw: list[BaseMessage], results: list[ToolMessage]
) -> tuple[BaseMessage, ...]:
    """History for a tool-continuation call: L3 plus `results`, which must close the group."""
    combined = [*raw, *results]
    clean = sanitize_history(combined)
    kept = {id(m) for m in clean}
    if not all(id(r) in kept for r in results):
        raise InvalidInputError(
            f"The tool results do not answer the open tool calls of session {session_id!r}: "
            "every tool call of the last reply needs exactly one ToolMessage with its id."
        )
    return tuple(clean)
