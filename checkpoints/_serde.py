"""How stored values are encoded: LangChain messages, session meta, JSON values, datetimes.

Both backends go through these functions, so a value read back from the in-memory storage is
exactly what the SQLite storage would have returned (JSON turns tuples into lists and dict
keys into strings; naive datetimes are taken as UTC).
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from types import ModuleType
from typing import TYPE_CHECKING, Any

from stello_graph._ids import legacy_thread_id, thread_id
from stello_graph._validate import check_depth, check_encodable
from stello_graph.checkpoints._damage import (
    META_COLUMNS,
    ROLES,
    STATUSES,
    damaged_error,
    meta_damage,
)
from stello_graph.errors import InvalidInputError
from stello_graph.models import SessionMeta

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

__all__ = [
    "TURN_ID",
    "TURN_SEQ",
    "EncodedMessage",
    "EventRow",
    "REMOVED_PAYLOAD",
    "MetaRow",
    "RecordTurn",
    "SessionRead",
    "decode_message",
    "decode_records",
    "dumps",
    "encode_message",
    "from_iso",
    "message_role",
    "read_turns",
    "run_heads",
    "session_threads",
    "split_read",
    "meta_to_row",
    "row_to_meta",
    "stored_id",
    "to_iso",
    "turn_of",
    "with_turn",
]

EncodedMessage = tuple[str, str]
"""`(role, json)` of one L3 record, as stored."""

RecordTurn = tuple[str, int]
"""`(turn_id, turn_seq)` of one L3 record: the turn that wrote it and its place in that turn."""

TURN_ID, TURN_SEQ = "stello_turn_id", "stello_turn_seq"
"""The keys of a record's turn in the `response_metadata` of the messages `Session.messages()`
returns. The storage owns them: it keeps them in their own columns, never in the record's JSON
(`encode_message` drops them), and `list_records` returns the messages exactly as appended.
`response_metadata` because LangChain's chat models do not send it to providers (unlike
`additional_kwargs`, which some of them forward), and it survives `message_to_dict`."""

EventRow = tuple[int, str, str | None, str, str]
"""`(cursor, kind, session_id, payload, at)` of one stored event: its cursor (strictly
increasing within a tree), its kind, the session it is about (or `None`), its details as
JSON text and its ISO timestamp."""

REMOVED_PAYLOAD = '{"removed":true}'
"""The details of a removed session's events once it is removed (`op_delete_sessions`): its
labels, L2s and insights go with it, while the events keep their cursors, so a follower's
cursor stays valid and a new event never takes the cursor of one it already read."""

MetaRow = tuple[str, str, str, str, str, str, str, str]
"""`(id, label, role, status, tags, metadata, created_at, updated_at)` of a session."""

SessionRead = tuple[SessionMeta, tuple[Any, ...], "Sequence[BaseMessage]"]
"""What `op_read_session` returns: the meta, the named fields in order, the records (or `()`)."""


def dumps(value: Any, *, what: str) -> str:
    """`value` as compact JSON text that SQLite can store.

    Raises:
        InvalidInputError: `value` is not JSON-serialisable, nests dicts and lists too
            deep (`check_depth`) or holds a lone surrogate.
    """
    check_depth(value, what)
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"{what} must be JSON-serialisable: {exc}") from exc
    return check_encodable(text, what)


@functools.cache
def _messages() -> ModuleType:
    """`langchain_core.messages`, imported on first use: what reads a tree without its
    records (`stello-graph tree`, `export`) never loads LangChain."""
    return importlib.import_module("langchain_core.messages")


_CHUNK_ROLES = {
    "HumanMessageChunk": "human",
    "AIMessageChunk": "ai",
    "ToolMessageChunk": "tool",
    "SystemMessageChunk": "system",
}
"""The types of LangChain's chunks of the four roles (a message of a role has it as its type)."""


def message_role(message: BaseMessage) -> str:
    """The role a record is filtered by: `human`, `ai`, `tool`, `system` (chunks included)."""
    return _CHUNK_ROLES.get(message.type, message.type)


_OMITTABLE = (
    "type",
    "additional_kwargs",
    "response_metadata",
    "name",
    "id",
    "example",
    "tool_calls",
    "invalid_tool_calls",
    "tool_call_chunks",
    "usage_metadata",
    "artifact",
    "status",
)
"""Fields left out of a stored record when they hold their class's default: decoding gives
them back by the same default (an absent and an empty tool-call list are read alike by
`AIMessage`'s validators). Most records are ~90-130 bytes smaller for it."""


@functools.cache
def _omittable_defaults(cls: type[BaseMessage]) -> tuple[tuple[str, object], ...]:
    """`(field, default)` of the omittable fields `cls` declares (extras have no default to
    come back by). Cached: asking pydantic for a default costs microseconds each time."""
    found = []
    for key in _OMITTABLE:
        field = cls.model_fields.get(key)
        if field is not None and not field.is_required():
            found.append((key, field.get_default(call_default_factory=True)))
    return tuple(found)


_SHORT = {
    "content": "c",
    "id": "i",
    "response_metadata": "r",
    "usage_metadata": "u",
    "tool_calls": "tc",
    "tool_call_id": "ti",
    "name": "n",
    "additional_kwargs": "k",
    "invalid_tool_calls": "itc",
    "status": "s",
    "artifact": "a",
}
"""The keys of a record's fields in its compact stored form (other fields keep their names)."""
_LONG = {short: key for key, short in _SHORT.items()}
_SHORT_METADATA = {
    "model_name": "m",
    "finish_reason": "f",
    "model_provider": "p",
    "system_fingerprint": "sf",
    "token_usage": "tu",
    "service_tier": "st",
    "logprobs": "lp",
    "stop_reason": "sr",
    "stop_sequence": "ss",
    "done_reason": "dr",
}
"""The keys of common provider metadata (OpenAI's, Anthropic's, Ollama's) in a compact record."""
_LONG_METADATA = {short: key for key, short in _SHORT_METADATA.items()}
_TYPE = "t"
_TYPES = {"human": "h", "ai": "a", "tool": "t", "system": "s"}
_TYPE_NAMES = {short: name for name, short in _TYPES.items()}
_RESERVED = frozenset({*_LONG, _TYPE, "data", "type"})
"""Names a field of the compact form cannot have: a message with such an extra field is
stored in the full form (`{"type": ..., "data": {...}}`), which the decoder reads too."""


def _compact_call(call: Any) -> Any:
    """A tool call as `[name, args, id]` when it is exactly LangChain's `tool_call(...)`."""
    exact = isinstance(call, dict) and call.keys() == {"name", "args", "id", "type"}
    if exact and call["type"] == "tool_call":
        return [call["name"], call["args"], call["id"]]
    return call


def _full_call(call: Any) -> Any:
    if isinstance(call, list) and len(call) == 3:
        return {"name": call[0], "args": call[1], "id": call[2], "type": "tool_call"}
    return call


def _compact_usage(usage: Any) -> Any:
    """Usage as `[input, output]` when it holds those two and their total, nothing else."""
    if isinstance(usage, dict) and usage.keys() == {
        "input_tokens",
        "output_tokens",
        "total_tokens",
    }:
        tokens_in, tokens_out = usage["input_tokens"], usage["output_tokens"]
        whole = type(tokens_in) is int and type(tokens_out) is int
        if whole and usage["total_tokens"] == tokens_in + tokens_out:
            return [tokens_in, tokens_out]
    return usage


def _full_usage(usage: Any) -> Any:
    if isinstance(usage, list) and len(usage) == 2:
        return {"input_tokens": usage[0], "output_tokens": usage[1], "total_tokens": sum(usage)}
    return usage


def encode_message(message: BaseMessage) -> EncodedMessage:
    """One message as `(role, json)`, in the compact stored form.

    The fields are `message_to_dict`'s, less those holding their class's default value,
    under short keys (`_SHORT`: `c` content, `i` id, `r` response metadata, ...; common
    provider metadata keys too, `_SHORT_METADATA`) beside `t`, the message type; a tool
    call that is exactly LangChain's is stored as `[name, args, id]`, and usage that is
    input, output and their total as `[input, output]`. A message with a field (or a
    metadata key) named like a short key is stored in LangChain's own format instead. A
    record is ~100-150 bytes smaller than LangChain's own format; `decode_message`
    reads both forms, so files written before keep reading as they were.
    """
    encoded = _messages().message_to_dict(message)
    data = encoded["data"]
    metadata = data.get("response_metadata")
    if metadata and (TURN_ID in metadata or TURN_SEQ in metadata):
        data["response_metadata"] = {
            key: value for key, value in metadata.items() if key not in (TURN_ID, TURN_SEQ)
        }
    for key, default in _omittable_defaults(type(message)):
        if key in data and type(data[key]) is type(default) and data[key] == default:
            del data[key]
    data.pop("type", None)  # the outer type names the class
    metadata = data.get("response_metadata")
    clash = isinstance(metadata, dict) and not _LONG_METADATA.keys().isdisjoint(metadata)
    if clash or not _RESERVED.isdisjoint(data):
        return message_role(message), dumps(encoded, what="A message")
    compact: dict[str, Any] = {_TYPE: _TYPES.get(encoded["type"], encoded["type"])}
    for key, value in data.items():
        if key == "tool_calls" and isinstance(value, list):
            value = [_compact_call(call) for call in value]
        elif key == "usage_metadata":
            value = _compact_usage(value)
        elif key == "response_metadata" and isinstance(value, dict):
            value = {_SHORT_METADATA.get(k, k): v for k, v in value.items()}
        compact[_SHORT.get(key, key)] = value
    return message_role(message), dumps(compact, what="A message")


def decode_message(data: str) -> BaseMessage:
    """The message stored as `data` by `encode_message` (either stored form)."""
    stored = json.loads(data)
    if "data" in stored:  # LangChain's own format: `{"type": ..., "data": {...}}`
        decoded: BaseMessage = _messages().messages_from_dict([stored])[0]
        return decoded
    kind = stored.pop(_TYPE)
    fields: dict[str, Any] = {}
    for key, value in stored.items():
        name = _LONG.get(key, key)
        if name == "tool_calls" and isinstance(value, list):
            value = [_full_call(call) for call in value]
        elif name == "usage_metadata":
            value = _full_usage(value)
        elif name == "response_metadata" and isinstance(value, dict):
            value = {_LONG_METADATA.get(k, k): v for k, v in value.items()}
        fields[name] = value
    message: BaseMessage = _messages().messages_from_dict(
        [{"type": _TYPE_NAMES.get(kind, kind), "data": fields}]
    )[0]
    return message


def stored_id(data: str) -> str | None:
    """The message id of a record stored as `data` (either stored form), without decoding it."""
    stored = json.loads(data)
    found = stored["data"].get("id") if isinstance(stored.get("data"), dict) else stored.get("i")
    return found if isinstance(found, str) else None


def with_turn(message: BaseMessage, turn_id: str, turn_seq: int) -> BaseMessage:
    """`message` (a copy of its own: it is changed in place) carrying its turn (`TURN_ID`)."""
    message.response_metadata = {**message.response_metadata, TURN_ID: turn_id, TURN_SEQ: turn_seq}
    return message


def turn_of(message: BaseMessage) -> RecordTurn | None:
    """The `(turn_id, turn_seq)` a record read from storage carries, if any."""
    metadata = message.response_metadata
    turn_id, turn_seq = metadata.get(TURN_ID), metadata.get(TURN_SEQ)
    if isinstance(turn_id, str) and isinstance(turn_seq, int):
        return turn_id, turn_seq
    return None


def run_heads(turns: list[RecordTurn]) -> list[tuple[str | None, int]]:
    """`turns` as stored: the turn id only on the first record of each run of one turn
    (a run's later records inherit it when read), so L3 holds one id per turn."""
    heads: list[tuple[str | None, int]] = []
    previous: str | None = None
    for turn_id, turn_seq in turns:
        heads.append((None if turn_id == previous else turn_id, turn_seq))
        previous = turn_id
    return heads


def read_turns(rows: Iterable[tuple[str | None, int]] | None) -> list[RecordTurn]:
    """The turns of stored `(turn_id, turn_seq)` rows: a run's later records inherit the id
    of its first (`run_heads` undone)."""
    turns, turn_id = [], ""
    for stored, turn_seq in rows or ():
        turn_id = stored or turn_id
        turns.append((turn_id, turn_seq))
    return turns


def session_threads(tree_id: str, session_ids: Iterable[str]) -> list[str]:
    """The checkpoint threads of the sessions' turns (current and legacy ids): what removing
    the sessions deletes from LangGraph's tables."""
    return [
        thread
        for session_id in session_ids
        for thread in (thread_id(tree_id, session_id), legacy_thread_id(tree_id, session_id))
    ]


def to_iso(value: datetime) -> str:
    """ISO-8601 text in UTC; a naive datetime is taken to be UTC already."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat()


def from_iso(text: str) -> datetime:
    """The timezone-aware datetime written by `to_iso`."""
    value = datetime.fromisoformat(text)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def meta_to_row(meta: SessionMeta) -> MetaRow:
    """The columns of a session's meta, validated for storage."""
    return (
        meta.id,
        check_encodable(meta.label, "The session label"),
        meta.role,
        meta.status,
        dumps(list(meta.tags), what="The session tags"),
        dumps(meta.metadata, what="The session metadata"),
        to_iso(meta.created_at),
        to_iso(meta.updated_at),
    )


def row_to_meta(row: Sequence[Any]) -> SessionMeta:
    """The `SessionMeta` stored as `row` (see `MetaRow`).

    Raises:
        DamagedDataError: the row is damaged (see `_damage`); the message names the column.
    """
    sid, label, role, status, tags, metadata, created_at, updated_at = row
    try:
        return SessionMeta(
            id=sid,
            label=label,
            role=role,
            status=status,
            tags=tuple(json.loads(tags)),
            metadata=json.loads(metadata),
            created_at=from_iso(created_at),
            updated_at=from_iso(updated_at),
        )
    except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
        column = (meta_damage(row) or ("row",))[0]
        known = {"role": ROLES, "status": STATUSES}.get(column)
        reason = f"{row[2 if column == 'role' else 3]!r} is none of {known}" if known else None
        raise damaged_error(str(sid), column, reason or _reason(exc)) from exc


def split_read(row: Sequence[Any]) -> tuple[SessionMeta, tuple[Any, ...]]:
    """The meta (`row_to_meta`) and the further columns of a row that starts with a `MetaRow`."""
    return row_to_meta(row[: len(META_COLUMNS)]), tuple(row[len(META_COLUMNS) :])


def decode_records(
    session_id: str,
    stored: Iterable[str],
    decode: Callable[[str], BaseMessage] = decode_message,
) -> list[BaseMessage]:
    """The messages of a session's stored records (`decode` of each, in order).

    Raises:
        DamagedDataError: a record does not decode; the message names it.
    """
    records: list[BaseMessage] = []
    for data in stored:
        try:
            records.append(decode(data))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            column = f"data of its record {len(records) + 1}"
            raise damaged_error(session_id, column, _reason(exc)) from exc
    return records


def _reason(exc: BaseException) -> str:
    """The first line of `exc`, with its type."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
