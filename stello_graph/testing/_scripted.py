"""Test helpers: `ScriptedChatModel`, a chat model that replies from a script.

`ScriptedChatModel` is a real `BaseChatModel`: it binds tools, returns tool calls, streams
tokens (tool calls included), reports usage and fires callbacks like a provider model, so a
LangGraph graph under test cannot tell it from one. It records every prompt it received, so a
test can assert what the model was shown.

Example:
    >>> from stello_graph.testing import ScriptedChatModel
    >>> model = ScriptedChatModel(
    ...     [
    ...         ScriptedChatModel.tool_call("get_weather", {"city": "Paris"}),
    ...         "It is sunny in Paris.",
    ...     ]
    ... )
    >>> model.invoke("Weather in Paris?").tool_calls
    [{'name': 'get_weather', 'args': {'city': 'Paris'}, 'id': 'call_1', 'type': 'tool_call'}]
    >>> [chunk.text for chunk in model.stream("Thanks!")]
    ['It', ' is', ' sunny', ' in', ' Paris.', '']
    >>> model.prompts[1][0].text
    'Thanks!'
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import threading
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeGuard

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.messages.tool import ToolCall
from langchain_core.messages.tool import tool_call as make_tool_call
from langchain_core.messages.tool import tool_call_chunk as make_tool_call_chunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import Field, PrivateAttr

from stello_graph.errors import InvalidInputError, StelloUsageError

__all__ = [
    "Responder",
    "ScriptExhaustedError",
    "ScriptedCall",
    "ScriptedChatModel",
    "ScriptedReply",
]

ReplyValue: TypeAlias = str | AIMessage | Mapping[str, Any] | BaseException
"""A concrete reply: text, an `AIMessage`, a `{"content", "tool_calls"}` dict or an error."""

Responder: TypeAlias = Callable[[list[BaseMessage]], ReplyValue]
"""A function computing the reply from the prompt the model received."""

ScriptedReply: TypeAlias = ReplyValue | Responder
"""One entry of a script: a concrete reply, or a `Responder` that computes it."""

_SPEC_KEYS = frozenset({"content", "tool_calls", "id"})
_TOOL_CALL_KEYS = frozenset({"name", "args", "id", "type"})
_TOOL_CHOICES = frozenset({"auto", "any", "required", "none"})
_WORDS = re.compile(r"\s*\S+|\s+")
_BRANCH = re.compile(r'<branch session_id="([^"]*)" label="(.*?)">$', re.MULTILINE)
"""A branch of an integration prompt (`LLMIntegrator.messages`): its session id and label."""
# One counter for the whole process: two models feeding the same `MessagesState` must never
# produce the same message id, or `add_messages` would silently replace one reply by another.
_reply_ids = itertools.count(1)
_reply_ids_lock = threading.Lock()


class ScriptExhaustedError(StelloUsageError):
    """A `ScriptedChatModel` was called more times than it had replies for.

    Script more replies, or pass `respond=` or `default=` to answer every further call.
    """


@dataclass(frozen=True, kw_only=True, slots=True)
class ScriptedCall:
    """One call a `ScriptedChatModel` received, and what it answered.

    Attributes:
        index: Position of the call, from 1, on this model (and its bound copies).
        messages: The prompt, as the model received it.
        tools: Names of the tools the model was bound with, in order.
        tool_choice: The `tool_choice` bound or passed for the call, if any.
        kwargs: Every other keyword the call carried (`tools` holds the OpenAI tool schemas).
        stop: The stop sequences passed, if any (the model does not apply them).
        streamed: Whether the call went through `_stream` / `_astream`.
        reply: The message the model answered, or `None` if the call raised.
        error: The exception the call raised, or `None`.
    """

    index: int
    messages: list[BaseMessage]
    tools: list[str]
    tool_choice: Any
    kwargs: dict[str, Any]
    stop: list[str] | None
    streamed: bool
    reply: AIMessage | None
    error: BaseException | None


class _Script:
    """State shared by a model and every `bind()` / `bind_tools()` / `model_copy()` of it."""

    def __init__(self) -> None:
        # Re-entrant: a responder may itself call the model.
        self.lock = threading.RLock()
        self.pending: deque[ScriptedReply] = deque()
        self.scripted = 0
        self.calls: list[ScriptedCall] = []
        self.taken = 0
        self.tool_call_ids = itertools.count(1)

    def __deepcopy__(self, memo: dict[int, Any]) -> _Script:
        # Copies of a model, deep or not, answer from the same script.
        return self


class ScriptedChatModel(BaseChatModel):
    """A chat model that answers from a script, for tests.

    Each call consumes the next scripted reply. A reply may be a `str` (plain text), an
    `AIMessage` (which may carry `tool_calls`), a dict shorthand
    `{"content": ..., "tool_calls": [{"name": ..., "args": ..., "id": ...}]}` (`id` optional),
    an exception instance (raised by that call, to script failures), or a callable receiving
    the prompt's messages and returning one of those. Tool calls without an id get
    `call_1`, `call_2`, ... in the order they are answered; replies get ids `scripted-<n>`,
    unique in the process.

    When the script is exhausted the model calls `respond`, else answers `default`, else
    raises `ScriptExhaustedError`. Every call is recorded (`calls`, `prompts`); records and
    script are shared by bound copies and guarded by a lock, so one model can serve many
    threads and event loops at once.

    Args:
        responses: The replies, consumed one per call.
        respond: Computes the reply of every call once `responses` is exhausted.
        default: The reply of every call once `responses` is exhausted.
        latency: Seconds each call waits before answering (`asyncio.sleep` when async).
        chunk_size: Stream text in chunks of this many characters instead of word by word.
        usage: Attach estimated `usage_metadata` (about 4 characters per token).
        name: Reported as `response_metadata["model_name"]` and in traces.
        **kwargs: Other `BaseChatModel` fields (`callbacks`, `tags`, `disable_streaming`...).

    Example:
        >>> model = ScriptedChatModel(["Hi!"], default="I have nothing more to say.")
        >>> model.invoke("Hello").content
        'Hi!'
        >>> model.invoke("And?").content
        'I have nothing more to say.'
        >>> model.call_count
        2
    """

    name: str | None = "scripted"
    latency: float = Field(default=0.0, ge=0.0)
    """Seconds each call waits before answering."""
    chunk_size: int | None = Field(default=None, ge=1)
    """Characters per streamed text chunk; `None` streams word by word."""
    usage: bool = True
    """Whether replies carry estimated `usage_metadata`."""

    _script: _Script = PrivateAttr(default_factory=_Script)
    _respond: Responder | None = PrivateAttr(default=None)
    _default: ScriptedReply | None = PrivateAttr(default=None)

    def __init__(
        self,
        responses: Iterable[ScriptedReply] = (),
        *,
        respond: Responder | None = None,
        default: ScriptedReply | None = None,
        latency: float = 0.0,
        chunk_size: int | None = None,
        usage: bool = True,
        name: str | None = "scripted",
        **kwargs: Any,
    ) -> None:
        super().__init__(latency=latency, chunk_size=chunk_size, usage=usage, name=name, **kwargs)
        if respond is not None and default is not None:
            raise InvalidInputError("Pass `respond=` or `default=`, not both.")
        if respond is not None and not callable(respond):
            raise InvalidInputError(f"`respond=` must be callable, got {respond!r}.")
        if default is not None:
            _check_entry(default, "default=")
        self._respond = respond
        self._default = default
        self.extend(responses)

    # -- building replies -------------------------------------------------------------------

    @staticmethod
    def tool_call(
        name: str, args: Mapping[str, Any], *, id: str | None = None, content: str = ""
    ) -> AIMessage:
        """Build a reply that calls one tool.

        Args:
            name: The tool's name.
            args: The arguments, as a JSON-serialisable mapping.
            id: The tool call id; by default the model assigns `call_<n>`.
            content: Text sent along with the call.

        Returns:
            An `AIMessage` with one tool call.
        """
        return ScriptedChatModel.tool_calls(
            [{"name": name, "args": args, "id": id}], content=content
        )

    @staticmethod
    def tool_calls(
        calls: Iterable[tuple[str, Mapping[str, Any]] | Mapping[str, Any]], *, content: str = ""
    ) -> AIMessage:
        """Build a reply that calls several tools in parallel.

        Args:
            calls: `(name, args)` pairs, or dicts `{"name": ..., "args": ..., "id": ...}`.
            content: Text sent along with the calls.

        Returns:
            An `AIMessage` with the tool calls, in order.

        Example:
            >>> reply = ScriptedChatModel.tool_calls([("search", {"q": "a"}), ("search", {"q": "b"})])
            >>> [call["args"] for call in reply.tool_calls]
            [{'q': 'a'}, {'q': 'b'}]
        """  # noqa: E501
        specs = [c if isinstance(c, Mapping) else {"name": c[0], "args": c[1]} for c in calls]
        return _from_spec({"content": content, "tool_calls": specs}, "tool_calls()")

    @staticmethod
    def integration(synthesis: str, insights: Mapping[str, str] | None = None) -> Responder:
        """Build the reply of an integration call made by `llm_integrator`.

        The default integration prompt (`stello_graph.memory.DEFAULT_INTEGRATE_PROMPT`) asks
        for `{"synthesis": ..., "insights": {session_id: text}}`. Session ids are often not
        known when a script is written, so `insights` may name branches by label: the reply
        reads the branches shown in the prompt and answers with their session ids, exactly
        as a model following the prompt would. (A consolidation reply, by contrast, is the
        new L2 itself: script it as plain text.)

        Args:
            synthesis: The synthesis to answer.
            insights: Insight texts by branch label or session id.

        Returns:
            A `Responder`, to put in the script where the integration call comes.

        Raises:
            InvalidInputError: (when the call comes) a key names no branch shown, or a
                label shared by several branches.

        Example:
            >>> from stello_graph import ChildL2
            >>> from stello_graph.memory import llm_integrator
            >>> model = ScriptedChatModel([ScriptedChatModel.integration("S", {"Pricing": "i"})])
            >>> result = llm_integrator(model)([ChildL2(session_id="s1", label="Pricing", l2="x")], None)
            >>> result.synthesis, result.insights
            ('S', {'s1': 'i'})
        """  # noqa: E501
        wanted = dict(insights or {})

        def reply(messages: list[BaseMessage]) -> str:
            shown = _BRANCH.findall(messages[-1].text if messages else "")
            by_id = {sid: sid for sid, _ in shown}
            by_label: dict[str, list[str]] = {}
            for sid, label in shown:
                by_label.setdefault(label, []).append(sid)
            addressed: dict[str, str] = {}
            for key, text in wanted.items():
                ids = [by_id[key]] if key in by_id else by_label.get(key, [])
                if len(ids) != 1:
                    labels = sorted(by_label)
                    raise InvalidInputError(
                        f"Scripted integration insight for {key!r}: the prompt shows "
                        f"{'no such branch' if not ids else 'several branches so labelled'}"
                        f" (labels {labels}); name the branch by its session id."
                    )
                addressed[ids[0]] = text
            return json.dumps({"synthesis": synthesis, "insights": addressed})

        return reply

    def extend(self, responses: Iterable[ScriptedReply]) -> None:
        """Append replies to the script, after those not consumed yet.

        Raises:
            InvalidInputError: A reply is of a type the model cannot answer with.
        """
        entries = list(responses)
        for position, entry in enumerate(entries):
            _check_entry(entry, f"responses[{position}]")
        with self._script.lock:
            self._script.pending.extend(entries)
            self._script.scripted += len(entries)

    # -- records ------------------------------------------------------------------------------

    @property
    def calls(self) -> list[ScriptedCall]:
        """Every call received so far, oldest first."""
        with self._script.lock:
            return list(self._script.calls)

    @property
    def prompts(self) -> list[list[BaseMessage]]:
        """The messages of every call received so far, oldest first."""
        return [list(call.messages) for call in self.calls]

    @property
    def call_count(self) -> int:
        """How many calls the model received."""
        with self._script.lock:
            return len(self._script.calls)

    @property
    def remaining(self) -> int:
        """How many scripted replies have not been consumed yet."""
        with self._script.lock:
            return len(self._script.pending)

    def reset(self) -> None:
        """Forget the recorded calls; the script itself is left as it is."""
        with self._script.lock:
            self._script.calls.clear()
            self._script.taken = 0

    # -- BaseChatModel ------------------------------------------------------------------------

    @property
    def _llm_type(self) -> str:
        return "stello-scripted"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model_name": self.name,
            "latency": self.latency,
            "chunk_size": self.chunk_size,
            "usage": self.usage,
        }

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | dict[str, Any] | bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools as OpenAI tool schemas; each call records their names.

        Args:
            tools: `@tool` functions, `BaseTool`s, pydantic models, functions or schemas.
            tool_choice: `"auto"`, `"any"`, `"required"`, `"none"`, a bound tool's name,
                an OpenAI `tool_choice` dict, or `True`.
            **kwargs: Further keywords bound to every call.

        Returns:
            The model with `tools` (and `tool_choice`) bound.

        Raises:
            InvalidInputError: `tool_choice` names a tool that is not bound.
        """
        schemas = [convert_to_openai_tool(tool) for tool in tools]
        if isinstance(tool_choice, str) and tool_choice not in _TOOL_CHOICES:
            names = _tool_names(schemas)
            if tool_choice not in names:
                raise InvalidInputError(
                    f"`tool_choice={tool_choice!r}` is not one of the bound tools {names!r} "
                    f"nor one of {sorted(_TOOL_CHOICES)!r}."
                )
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=schemas, **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        call = self._take(messages, stop, kwargs, streamed=False)
        if self.latency:
            time.sleep(self.latency)
        return ChatResult(generations=[ChatGeneration(message=_answer(call))])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        call = self._take(messages, stop, kwargs, streamed=False)
        if self.latency:
            await asyncio.sleep(self.latency)
        return ChatResult(generations=[ChatGeneration(message=_answer(call))])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        call = self._take(messages, stop, kwargs, streamed=True)
        if self.latency:
            time.sleep(self.latency)
        for message in _to_chunks(_answer(call), self.chunk_size):
            chunk = ChatGenerationChunk(message=message)
            # langchain-core passes a run manager only on the paths where it does not
            # report tokens itself (the v2 event bridge), as provider models do.
            if run_manager is not None:
                run_manager.on_llm_new_token(message.text, chunk=chunk)
            yield chunk

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        call = self._take(messages, stop, kwargs, streamed=True)
        if self.latency:
            await asyncio.sleep(self.latency)
        for message in _to_chunks(_answer(call), self.chunk_size):
            chunk = ChatGenerationChunk(message=message)
            if run_manager is not None:
                await run_manager.on_llm_new_token(message.text, chunk=chunk)
            yield chunk

    def __repr__(self) -> str:
        with self._script.lock:
            scripted, left = self._script.scripted, len(self._script.pending)
            calls = len(self._script.calls)
        parts = [f"name={self.name!r}", f"scripted={scripted}", f"remaining={left}"]
        parts.append(f"calls={calls}")
        if self._respond is not None:
            parts.append(f"respond={self._respond!r}")
        if self._default is not None:
            parts.append(f"default={self._default!r}")
        if self.latency:
            parts.append(f"latency={self.latency!r}")
        return f"ScriptedChatModel({', '.join(parts)})"

    # -- internals ----------------------------------------------------------------------------

    def _take(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None,
        kwargs: dict[str, Any],
        *,
        streamed: bool,
    ) -> ScriptedCall:
        """Consume the next reply, compute it, and record the call.

        The script is consumed under the lock; a responder runs outside it, so concurrent
        calls (sessions running in parallel) really overlap.
        """
        script = self._script
        with script.lock:
            script.taken += 1
            index = script.taken
            try:
                entry: ScriptedReply | BaseException = self._next_entry(messages, index)
            except Exception as exc:  # exhausted: that call raises it
                entry = exc
        reply: AIMessage | None = None
        error: BaseException | None = None
        try:
            outcome = entry if isinstance(entry, BaseException) else self._resolve(entry, messages)
        except Exception as exc:  # a responder failed: that call raises it
            outcome = exc
        if isinstance(outcome, BaseException):
            error = outcome
        else:
            reply = self._finish(outcome, messages)
        call = ScriptedCall(
            index=index,
            messages=list(messages),
            tools=_tool_names(kwargs.get("tools") or []),
            tool_choice=kwargs.get("tool_choice"),
            kwargs=dict(kwargs),
            stop=stop,
            streamed=streamed,
            reply=reply,
            error=error,
        )
        with script.lock:
            script.calls.append(call)
            script.calls.sort(key=lambda c: c.index)
        return call

    def _next_entry(self, messages: list[BaseMessage], index: int) -> ScriptedReply:
        script = self._script
        if script.pending:
            return script.pending.popleft()
        if self._respond is not None:
            return self._respond
        if self._default is not None:
            return self._default
        raise ScriptExhaustedError(
            f"{self!r} received call #{index} but only {script.scripted} "
            f"response(s) were scripted. Last user message: {_last_user_text(messages)}. "
            "Script more responses, or pass `respond=` or `default=`."
        )

    @staticmethod
    def _resolve(entry: ScriptedReply, messages: list[BaseMessage]) -> AIMessage | BaseException:
        if _is_responder(entry):
            return _to_reply(entry(list(messages)), f"the reply computed by {entry!r}")
        return _to_reply(entry, "the scripted reply")

    def _finish(self, reply: AIMessage, messages: list[BaseMessage]) -> AIMessage:
        """Give the reply its ids, usage and response metadata."""
        for call in reply.tool_calls:
            if not call.get("id"):
                call["id"] = f"call_{next(self._script.tool_call_ids)}"
        if reply.id is None:
            with _reply_ids_lock:
                reply.id = f"scripted-{next(_reply_ids)}"
        if self.usage and reply.usage_metadata is None:
            prompt_tokens = _estimate_tokens(messages)
            reply_tokens = _estimate_tokens([reply])
            reply.usage_metadata = {
                "input_tokens": prompt_tokens,
                "output_tokens": reply_tokens,
                "total_tokens": prompt_tokens + reply_tokens,
            }
        reply.response_metadata = {
            "model_name": self.name or "scripted",
            "finish_reason": "tool_calls" if reply.tool_calls else "stop",
            **reply.response_metadata,
        }
        return reply


def _answer(call: ScriptedCall) -> AIMessage:
    """The reply to hand to langchain-core (a copy: it mutates it), or raise the error."""
    if call.error is not None:
        raise call.error
    assert call.reply is not None  # _take sets one of the two
    return call.reply.model_copy(deep=True)


def _is_responder(entry: object) -> TypeGuard[Responder]:
    return callable(entry) and not isinstance(entry, type | BaseException | AIMessage)


def _check_entry(entry: object, where: str) -> None:
    """Raise `InvalidInputError` now, rather than at the call, for a reply of the wrong type."""
    if not _is_responder(entry):
        _to_reply(entry, where)


def _to_reply(value: object, where: str) -> AIMessage | BaseException:
    """Turn a concrete reply into a fresh `AIMessage` (or the exception to raise)."""
    if isinstance(value, BaseException):
        return value
    if isinstance(value, str):
        return AIMessage(content=value)
    if isinstance(value, AIMessage):
        return value.model_copy(deep=True)
    if isinstance(value, Mapping):
        return _from_spec(value, where)
    if isinstance(value, type) and issubclass(value, BaseException):
        raise InvalidInputError(
            f"{where} is the exception class {value.__name__}; script an instance, "
            f"e.g. {value.__name__}('rate limited')."
        )
    raise InvalidInputError(
        f"{where} is {value!r}; a reply must be a str, an AIMessage, a dict "
        "{'content': ..., 'tool_calls': [...]}, an exception instance, or a callable "
        "taking the messages and returning one of those."
    )


def _from_spec(spec: Mapping[str, Any], where: str = "reply") -> AIMessage:
    """Build an `AIMessage` from the dict shorthand, naming what is wrong with it."""
    unknown = set(spec) - _SPEC_KEYS
    if unknown:
        raise InvalidInputError(
            f"{where} has unknown key(s) {sorted(unknown)!r}; use {sorted(_SPEC_KEYS)!r}."
        )
    content = spec.get("content", "")
    if not isinstance(content, str):
        raise InvalidInputError(f"{where}['content'] must be a str, got {content!r}.")
    specs = spec.get("tool_calls") or []
    if not isinstance(specs, list | tuple):
        raise InvalidInputError(f"{where}['tool_calls'] must be a list, got {specs!r}.")
    calls = [
        _tool_call_from_spec(call, f"{where}['tool_calls'][{i}]") for i, call in enumerate(specs)
    ]
    return AIMessage(content=content, tool_calls=calls, id=spec.get("id"))


def _tool_call_from_spec(spec: object, where: str) -> ToolCall:
    if (
        not isinstance(spec, Mapping)
        or not set(spec) <= _TOOL_CALL_KEYS
        or not isinstance(spec.get("name"), str)
        or not isinstance(spec.get("args", {}), Mapping)
    ):
        raise InvalidInputError(
            f"{where} is {spec!r}; a tool call is a dict with a str 'name', "
            "a dict 'args' and an optional 'id'."
        )
    return make_tool_call(name=spec["name"], args=dict(spec.get("args", {})), id=spec.get("id"))


def _tool_names(schemas: Iterable[Any]) -> list[str]:
    names: list[str] = []
    for schema in schemas:
        if isinstance(schema, Mapping):
            function = schema.get("function")
            name = function.get("name") if isinstance(function, Mapping) else schema.get("name")
            names.append(str(name))
        else:
            names.append(str(getattr(schema, "name", None) or getattr(schema, "__name__", "?")))
    return names


def _to_chunks(reply: AIMessage, chunk_size: int | None) -> list[AIMessageChunk]:
    """Split a reply into stream chunks whose sum equals the reply.

    Text comes first, word by word (or `chunk_size` characters at a time); then each tool
    call in two chunks, its args JSON cut in half; then a last chunk with the usage and
    response metadata, so that summing the chunks counts them once.
    """
    content = reply.content
    if not isinstance(content, str):
        pieces: list[Any] = [content]
    elif chunk_size:
        pieces = [content[i : i + chunk_size] for i in range(0, len(content), chunk_size)]
    else:
        pieces = _WORDS.findall(content)
    chunks = [AIMessageChunk(content=piece, id=reply.id) for piece in pieces]
    for index, call in enumerate(reply.tool_calls):
        args = json.dumps(call["args"])
        half = len(args) // 2
        first = make_tool_call_chunk(
            name=call["name"], args=args[:half], id=call["id"], index=index
        )
        rest = make_tool_call_chunk(args=args[half:], index=index)
        chunks.append(AIMessageChunk(content="", id=reply.id, tool_call_chunks=[first]))
        chunks.append(AIMessageChunk(content="", id=reply.id, tool_call_chunks=[rest]))
    chunks.append(
        AIMessageChunk(
            content="" if isinstance(content, str) else [],
            id=reply.id,
            additional_kwargs=reply.additional_kwargs,
            response_metadata=reply.response_metadata,
            usage_metadata=reply.usage_metadata,
            chunk_position="last",
        )
    )
    return chunks


_encode_json = json.JSONEncoder().encode  # `json.dumps` with its defaults, minus its overhead


def _message_chars(message: BaseMessage) -> int:
    content = message.content
    chars = len(content) if isinstance(content, str) else len(message.text)
    if isinstance(message, AIMessage) and message.tool_calls:
        chars += sum(len(c["name"]) + len(_encode_json(c["args"])) for c in message.tool_calls)
    return chars


class _CharCounts:
    """Characters per message object, kept while the object lives.

    A session's prompt is mostly the same message objects call after call (its history),
    so each is measured once. An entry is used only for the very object it was made for
    (checked through a weak reference) and only while its text has the same length.
    No lock: the weak-reference callbacks run inside garbage collection, which may start
    while this thread holds any lock; single dict operations are atomic, and a lost race
    only costs a recount.
    """

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[weakref.ref[BaseMessage], int, int]] = {}

    def __call__(self, message: BaseMessage) -> int:
        content = message.content
        size = len(content) if isinstance(content, str) else -1
        entry = self._by_id.get(id(message))
        if entry is not None and entry[0]() is message and entry[1] == size and size >= 0:
            return entry[2]
        chars = _message_chars(message)
        if size >= 0:
            key = id(message)
            self._by_id[key] = (weakref.ref(message, self._forget(key)), size, chars)
        return chars

    def _forget(self, key: int) -> Callable[[weakref.ref[BaseMessage]], None]:
        def forget(ref: weakref.ref[BaseMessage]) -> None:
            entry = self._by_id.get(key)
            if entry is not None and entry[0] is ref:
                self._by_id.pop(key, None)

        return forget


_char_counts = _CharCounts()


def _estimate_tokens(messages: Iterable[BaseMessage]) -> int:
    """About one token per 4 characters of text and tool-call JSON, rounded up.

    Runs on every call over the whole prompt, so it is kept cheap: a "zero-latency" model
    whose own cost grows with the prompt would weigh on what a benchmark measures.
    """
    return -(-sum(map(_char_counts, messages)) // 4)


def _last_user_text(messages: Sequence[BaseMessage]) -> str:
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            text = message.text
            return repr(text if len(text) <= 200 else text[:200] + "…")
    return "(none)"
