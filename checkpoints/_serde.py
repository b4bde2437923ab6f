"""How stored values are encoded: LangChain messages, session meta, JSON values, datetimes.

Both backends go through these functions, so a value read back from the in-memory storage is
exactly what the SQLite storage would have returned (JSON turns tuples into lists and dict
keys into strings; naive datetimes are taken as UTC).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    message_to_dict,
    messages_from_dict,
)

from stello_graph.errors import InvalidInputError
from stello_graph.models import SessionMeta

__all__ = [
    "TURN_ID",
    "TURN_SEQ",
    "EncodedMessage",
    "EventRow",
    "MetaRow",
    "RecordTurn",
    "SessionRead",
    "decode_message",
    "dumps",
    "encode_message",
    "from_iso",
    "message_role",
    "meta_to_row",
    "row_to_meta",
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

MetaRow = tuple[str, str, str, str, str, str, str, str]
"""`(id, label, role, status, tags, metadata, created_at, updated_at)` of a session."""

SessionRead = tuple[SessionMeta, tuple[Any, ...], Sequence[BaseMessage]]
"""What `op_read_session` returns: the meta, the named fields in order, the records (or `()`)."""


def dumps(value: Any, *, what: str) -> str:
    """`value` as compact JSON text that SQLite can store.

    Raises:
        InvalidInputError: `value` is not JSON-serialisable or holds a lone surrogate.
    """
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"{what} must be JSON-serialisable: {exc}") from exc
    return check_encodable(text, what=what)


def check_encodable(text: str, *, what: str) -> str:
    """`text` unchanged, once it is known to encode as UTF-8 (no lone surrogates)."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidInputError(f"{what} holds text that is not valid unicode: {exc}") from exc
    return text


def message_role(message: BaseMessage) -> str:
    """The role a record is filtered by: `human`, `ai`, `tool`, `system` (chunks included)."""
    for cls, role in _ROLE_OF_CLASS:
        if isinstance(message, cls):
            return role
    return message.type


_ROLE_OF_CLASS: tuple[tuple[type[BaseMessage], str], ...] = (
    (HumanMessage, "human"),
    (AIMessage, "ai"),
    (ToolMessage, "tool"),
    (SystemMessage, "system"),
)


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


def encode_message(message: BaseMessage) -> EncodedMessage:
    """One message as `(role, json)`: `message_to_dict`'s JSON without the fields above
    that hold their default value (the outer `type` picks the class)."""
    encoded = message_to_dict(message)
    data = encoded["data"]
    metadata = data.get("response_metadata")
    if metadata and (TURN_ID in metadata or TURN_SEQ in metadata):
        data["response_metadata"] = {
            key: value for key, value in metadata.items() if key not in (TURN_ID, TURN_SEQ)
        }
    for key, default in _omittable_defaults(type(message)):
        if key in data and type(data[key]) is type(default) and data[key] == default:
            del data[key]
    return message_role(message), dumps(encoded, what="A message")


def decode_message(data: str) -> BaseMessage:
    """The message stored as `data` by `encode_message`."""
    return messages_from_dict([json.loads(data)])[0]


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
        check_encodable(meta.label, what="The session label"),
        meta.role,
        meta.status,
        dumps(list(meta.tags), what="The session tags"),
        dumps(meta.metadata, what="The session metadata"),
        to_iso(meta.created_at),
        to_iso(meta.updated_at),
    )


def row_to_meta(row: Sequence[Any]) -> SessionMeta:
    """The `SessionMeta` stored as `row` (see `MetaRow`)."""
    sid, label, role, status, tags, metadata, created_at, updated_at = row
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
