"""The pieces of a `ScriptedChatModel`'s script: reply values, the record of a call, and
how a reply is built, checked, chunked for streaming and counted in tokens."""

from __future__ import annotations

import itertools
import json
import re
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeGuard

from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.messages.tool import ToolCall
from langchain_core.messages.tool import tool_call as make_tool_call
from langchain_core.messages.tool import tool_call_chunk as make_tool_call_chunk

from stello_graph.errors import InvalidInputError

__all__ = ["ReplyValue", "Responder", "ScriptedCall", "ScriptedReply"]

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
