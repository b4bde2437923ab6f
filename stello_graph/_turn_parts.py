"""The plain pieces a session's turn is made of: its context, its records, the checks on them.

Module-level helpers shared by the session layers (`_session_core`, `_base`) and the
nodes: no storage I/O happens here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    SystemMessage,
    ToolMessage,
    message_chunk_to_message,
)

from stello_graph._context import message_text, sanitize_history
from stello_graph._text import storable, storable_message
from stello_graph._validate import (
    MAX_DEPTH,
    check_depth,
    check_id,
    check_label,
    check_metadata,
    check_tags,
    new_id,
    too_deep,
)
from stello_graph.checkpoints._serde import with_turn
from stello_graph.errors import (
    InvalidInputError,
    ModelCallError,
    SessionNotFoundError,
)
from stello_graph.models import Compression, SendResult, SessionMeta

__all__ = [
    "ContextParts",
    "ModelInput",
    "ToolChoice",
    "TurnContext",
    "check_loaded",
    "check_tool_choice",
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
    if isinstance(choice, dict):  # checked: its name, if any, is a string
        name: str | None = choice.get("function", choice).get("name")
        return name
    return None


def _tool_names(tools: Sequence[Any]) -> list[str] | None:
    """The names the model sees for `tools`; `None` when one cannot be told."""
    from langchain_core.utils.function_calling import convert_to_openai_tool

    try:
        return [str(convert_to_openai_tool(t)["function"]["name"]) for t in tools]
    except Exception:  # a tool only the model's own bind_tools understands
        return None


def _is_name(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())


_FUNCTION_CHOICE = "{'type': 'function', 'function': {'name': '<tool name>'}}"
_FUNCTION_KEYS = ({"type", "function"}, {"type", "name"})


def _check_choice_dict(choice: dict[Any, Any]) -> None:
    """A dict `tool_choice` in a provider's shape: string keys; a `type`, when given, a
    non-blank string; a tool name, wherever one is given (`name`, `function.name`), a
    non-blank string; and `{"type": "function"}` exactly OpenAI's `{"type": "function",
    "function": {"name": ...}}` (or the Responses API's `{"type": "function", "name": ...}`).
    Other providers' dicts (Anthropic's `{"type": "tool", "name": ...}`, ...) pass as given."""
    shown = f"{choice!r:.120}"
    if not choice or not all(isinstance(key, str) for key in choice):
        raise InvalidInputError(
            f"tool_choice as a dict needs string keys, like {_FUNCTION_CHOICE}; got {shown}."
        )
    if "type" in choice and not _is_name(choice["type"]):
        raise InvalidInputError(
            f"tool_choice's 'type' must be a non-empty string ('function', 'tool', 'auto', "
            f"...), got {shown}."
        )
    function = choice.get("function")
    bad_function = "function" in choice and not (
        isinstance(function, dict) and set(function) == {"name"} and _is_name(function["name"])
    )
    bad_name = "name" in choice and not _is_name(choice["name"])
    not_one = choice.get("type") == "function" and set(choice) not in _FUNCTION_KEYS
    if bad_function or bad_name or not_one:
        raise InvalidInputError(
            f"tool_choice must name its tool with a non-empty string and nothing else, as in "
            f"{_FUNCTION_CHOICE}; got {shown}."
        )


def check_tool_choice(
    value: object, tools: Sequence[Any] | None = None, *, session_id: str | None = None
) -> str | dict[str, Any] | bool:
    """A `tool_choice` LangChain accepts: a string, a dict in a provider's shape (see
    `_check_choice_dict`) or a bool; given the session's `tools`, one that names a tool must
    name one of them (checked here, before the call, since many providers' clients send any
    name and fail only at the provider)."""
    check_depth(value, "tool_choice")
    if not (isinstance(value, bool | dict) or (isinstance(value, str) and value.strip())):
        raise InvalidInputError(
            f"tool_choice must be 'auto', 'required', 'any', a tool name, a dict or a bool, "
            f"got {value!r:.120}."
        )
    if isinstance(value, dict):
        _check_choice_dict(value)
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


def _as_ai_message(reply: Any, session_id: str | None = None) -> AIMessage:
    """The model's reply as an `AIMessage` that can be stored (see `_text`); one whose tool
    calls nest their arguments more than `MAX_DEPTH` levels deep (deeper ones fail in the
    checkpoint serializer) is refused with `ModelCallError`."""
    if isinstance(reply, AIMessage):
        deep = next((call for call in reply.tool_calls if too_deep(call.get("args"))), None)
        if deep is not None:
            raise ModelCallError(
                f"The model of session {session_id!r} called {deep['name']!r} with arguments "
                f"nested more than {MAX_DEPTH} levels deep; its reply was refused and nothing "
                "of the turn was stored.",
                session_id=session_id,
            )
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


def _chunk_to_message(total: AIMessageChunk | None, session_id: str | None = None) -> AIMessage:
    """A streamed reply, its chunks added up in `total`, as a stored reply is."""
    reply = AIMessage(content="") if total is None else message_chunk_to_message(total)
    return _as_ai_message(reply, session_id)


def _continue_history(
    session_id: str, raw: list[BaseMessage], results: list[ToolMessage]
) -> tuple[BaseMessage, ...]:
    """History for a tool-continuation call: L3 plus `results`, which must close the group."""
    clean = sanitize_history([*raw, *results])
    kept = {id(m) for m in clean}
    if not all(id(r) in kept for r in results):
        raise InvalidInputError(
            f"The tool results do not answer the open tool calls of session {session_id!r}: "
            "every tool call of the last reply needs exactly one ToolMessage with its id."
        )
    return tuple(clean)
