"""Argument checks at the storage boundary; every bad value raises `InvalidInputError`.

They run before any lock is taken, so a bad call never waits and never writes.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from stello_graph._validate import check_depth, check_encodable, check_tree_id
from stello_graph.checkpoints._damage import ROLES, STATUSES
from stello_graph.checkpoints._serde import (
    EncodedMessage,
    RecordTurn,
    dumps,
    encode_message,
    to_iso,
    turn_of,
)
from stello_graph.errors import InvalidInputError
from stello_graph.models import (
    Compression,
    Lease,
    SessionMeta,
    SessionRole,
    SessionStatus,
    TopologyNode,
    utcnow,
)

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

__all__ = [
    "RecordRole",
    "append_args",
    "check_identifier",
    "check_instance",
    "check_messages",
    "check_meta",
    "check_node",
    "check_non_negative",
    "check_one_of",
    "check_optional_text",
    "check_tags",
    "check_text",
    "check_tree_id",
    "checked_lease",
    "copy_args",
    "event_args",
    "events_page_args",
    "lease_args",
    "lineage_args",
    "memory_args",
    "normalize_role",
    "page_args",
    "session_filter_args",
]

T = TypeVar("T")

RecordRole = Literal["human", "ai", "tool", "system", "user", "assistant"]
"""Role filter of `list_records`: LangChain message types, with `user` / `assistant` aliases."""

_ROLE_ALIASES = {"user": "human", "assistant": "ai"}
_ROLES = frozenset({"human", "ai", "tool", "system"})


def normalize_role(role: str | None) -> str | None:
    """Map a role filter to the LangChain message type stored (`"user"` -> `"human"`).

    Raises:
        InvalidInputError: the role is not one of `RecordRole`.
    """
    if role is None:
        return None
    if not isinstance(role, str):
        raise InvalidInputError(f"role must be a string, got {type(role).__name__}.")
    normalized = _ROLE_ALIASES.get(role, role)
    if normalized not in _ROLES:
        raise InvalidInputError(
            f"Unknown record role {role!r}; use one of human/user, ai/assistant, tool, system."
        )
    return normalized


def check_identifier(value: object, name: str = "session_id") -> str:
    """A non-empty string usable as an id or key."""
    text = check_text(value, name)
    if not text:
        raise InvalidInputError(f"{name} must not be empty.")
    return text


def check_text(value: object, name: str) -> str:
    """Any string (possibly empty) that can be stored."""
    if not isinstance(value, str):
        raise InvalidInputError(f"{name} must be a string, got {type(value).__name__}.")
    return check_encodable(value, name)


def check_optional_text(value: object, name: str) -> str | None:
    """`None`, or a string that can be stored."""
    return None if value is None else check_text(value, name)


def check_non_negative(value: object, name: str) -> int:
    """An `int` (not a `bool`) that is zero or more."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"{name} must be an int, got {type(value).__name__}.")
    if value < 0:
        raise InvalidInputError(f"{name} must be zero or more, got {value}.")
    return value


def check_instance(value: object, cls: type[T], name: str) -> T:
    """`value` itself, once known to be a `cls`."""
    if not isinstance(value, cls):
        raise InvalidInputError(f"{name} must be a {cls.__name__}, got {type(value).__name__}.")
    return value


def check_messages(value: object) -> list[BaseMessage]:
    """A sequence of LangChain messages, as a list."""
    from langchain_core.messages import BaseMessage  # imported on use: reading needs none

    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise InvalidInputError(
            f"messages must be a sequence of BaseMessage, got {type(value).__name__}."
        )
    for index, message in enumerate(value):
        if not isinstance(message, BaseMessage):
            raise InvalidInputError(
                f"messages[{index}] must be a BaseMessage, got {type(message).__name__}."
            )
    return list(value)


def check_one_of(value: Any, allowed: tuple[str, ...], name: str) -> Any:
    """`None`, or one of the `allowed` literals."""
    if value is not None and value not in allowed:
        raise InvalidInputError(f"{name} must be one of {allowed!r} or None, got {value!r}.")
    return value


def check_tags(value: object) -> tuple[str, ...]:
    """A sequence of tag strings (a bare string is refused: it is a sequence of letters)."""
    check_depth(value, "tags")
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise InvalidInputError(f"tags must be a sequence of strings, got {value!r}.")
    return tuple(check_text(tag, "each tag") for tag in value)


def check_meta(value: object) -> SessionMeta:
    """A `SessionMeta` with a usable id."""
    meta = check_instance(value, SessionMeta, "meta")
    check_identifier(meta.id, "meta.id")
    _not_a_placeholder(meta.damaged, f"The meta of session {meta.id!r}")
    return meta


def check_node(value: object) -> TopologyNode:
    """A `TopologyNode` with usable ids."""
    node = check_instance(value, TopologyNode, "node")
    check_identifier(node.id, "node.id")
    _not_a_placeholder(node.damaged, f"Node {node.id!r}")
    if node.parent_id is not None:
        check_identifier(node.parent_id, "node.parent_id")
    check_text(node.label, "node.label")
    return node


def _not_a_placeholder(damaged: tuple[str, ...], what: str) -> None:
    """Refuse to store a whole-tree read's stand-in for a damaged row as if it were data."""
    if damaged:
        raise InvalidInputError(
            f"{what} is a placeholder for a damaged row (columns: "
            f"{', '.join(damaged)}); storing it would write its stand-ins. Give the values "
            "to keep: model_copy(update={..., 'damaged': ()})."
        )


# -- the arguments of one storage method, checked together ---------------------------------
def session_filter_args(
    status: object, role: object, tags: object
) -> tuple[SessionStatus | None, SessionRole | None, tuple[str, ...]]:
    return (
        check_one_of(status, STATUSES, "status"),
        check_one_of(role, ROLES, "role"),
        check_tags(tags),
    )


def append_args(
    session_id: object, messages: object, user_turn: object, turn_id: object = None
) -> tuple[str, list[EncodedMessage], str, bool, list[RecordTurn]]:
    sid = check_identifier(session_id)
    checked = check_messages(messages)
    records = [encode_message(message) for message in checked]
    turns = record_turns(checked, None if turn_id is None else check_identifier(turn_id, "turn_id"))
    return sid, records, to_iso(utcnow()), bool(user_turn), turns


CommitArgs = tuple[str, list[EncodedMessage], str, bool, list[RecordTurn], str | None, Lease | None]
"""A turn's commit, validated (`commit_args`): session, records, time, user turn, turns,
insight to consume, lease."""


def commit_args(
    session_id: object,
    messages: object,
    user_turn: object,
    turn_id: object,
    insight: object,
    lease: object,
) -> CommitArgs:
    """`append_args`, the insight to consume (if still the same) and the turn's lease."""
    sid, records, at, user, turns = append_args(session_id, messages, user_turn, turn_id)
    held = None if lease is None else checked_lease(lease)
    if held is not None and held.session_id != sid:
        raise InvalidInputError(
            f"The lease is for session {held.session_id!r}, not {sid!r}: a turn commits "
            "under its own session's lease."
        )
    return sid, records, at, user, turns, check_optional_text(insight, "insight"), held


def record_turns(messages: Sequence[BaseMessage], turn_id: str | None) -> list[RecordTurn]:
    """The `(turn_id, turn_seq)` of each appended record.

    With `turn_id`, the records are that turn's, numbered from 0. Without, a record that
    carries a turn (a copy of a stored record, e.g. inherited by a fork) keeps it, and the
    others are one new turn.
    """
    if turn_id is not None:
        return [(turn_id, seq) for seq in range(len(messages))]
    fresh, next_seq, turns = str(uuid.uuid4()), 0, []
    for message in messages:
        carried = turn_of(message)
        if carried is None:
            carried, next_seq = (fresh, next_seq), next_seq + 1
        turns.append(carried)
    return turns


def page_args(
    session_id: object, limit: object, offset: object, role: str | None
) -> tuple[str, int | None, int, str | None]:
    return (
        check_identifier(session_id),
        None if limit is None else check_non_negative(limit, "limit"),
        check_non_negative(offset, "offset"),
        normalize_role(role),
    )


def check_mapping(value: object, what: str) -> dict[str, Any]:
    """A JSON object (a dict with string keys)."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise InvalidInputError(f"{what} must be a dict with string keys, got {value!r:.80}.")
    return value


def compression_values(compression: object) -> dict[str, Any]:
    """The fields `put_compression` sets (`None` drops the summary)."""
    if compression is None:
        return {"compression": None, "compression_through": 0}
    checked = check_instance(compression, Compression, "compression")
    return {
        "compression": check_text(checked.summary, "compression summary"),
        "compression_through": check_non_negative(checked.through, "through"),
    }


def memory_args(session_id: object, memory: object, through: object) -> tuple[str, dict[str, Any]]:
    values: dict[str, Any] = {"memory": check_text(memory, "memory")}
    if through is not None:
        values["memory_through"] = check_non_negative(through, "through")
    return check_identifier(session_id), values


def lease_args(
    session_id: object, owner: object, ttl: object, replace: object
) -> tuple[str, str, float, str | None]:
    sid = check_identifier(session_id)
    if not isinstance(owner, str) or not owner:
        raise InvalidInputError(f"A lease owner must be a non-empty str, got {owner!r}.")
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl < 86_400:
        raise InvalidInputError(f"A lease ttl must be seconds in (0, 86400), got {ttl!r}.")
    if replace is not None and not isinstance(replace, str):
        raise InvalidInputError(f"replace must be an owner (str) or None, got {replace!r}.")
    return sid, owner, float(ttl), replace


def checked_lease(lease: object) -> Lease:
    checked = check_instance(lease, Lease, "lease")
    check_identifier(checked.session_id)
    return checked


MAX_EVENTS_PAGE = 10_000
"""The most events one `events_after` call returns."""


def event_args(
    kind: object, session_id: object, data: object, at: object
) -> tuple[str, str | None, str, str]:
    """`(kind, session_id, payload, at)` of `append_event`, encoded for the backend."""
    checked_kind = check_identifier(kind, "kind")
    sid = None if session_id is None else check_identifier(session_id)
    given = dict(data) if isinstance(data, Mapping) else {} if data is None else data
    fields = check_mapping(given, "event data")
    if at is not None and not isinstance(at, datetime):
        raise InvalidInputError(f"at must be a datetime or None, got {type(at).__name__}.")
    payload = dumps(fields, what="The event data")
    return checked_kind, sid, payload, to_iso(at if at is not None else utcnow())


def events_page_args(cursor: object, limit: object) -> tuple[int, int]:
    """`(cursor, limit)` of `events_after`: a cursor >= 0 and 1 <= limit <= 10,000."""
    checked = check_non_negative(cursor, "cursor")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= MAX_EVENTS_PAGE:
        raise InvalidInputError(f"limit must be an int from 1 to {MAX_EVENTS_PAGE}, got {limit!r}.")
    return checked, limit


def copy_args(source_id: object, target_id: object, count: object) -> tuple[str, str, int]:
    source, target = check_identifier(source_id), check_identifier(target_id, "target_id")
    if source == target:
        raise InvalidInputError(
            f"copy_records copies records into another session, got {source!r} twice."
        )
    return source, target, check_non_negative(count, "count")


def lineage_args(
    session_id: object, source_id: object, at_turn: object
) -> tuple[str, dict[str, Any]]:
    sid, source = check_identifier(session_id), check_identifier(source_id, "source_id")
    if at_turn is not None:
        at_turn = check_non_negative(at_turn, "at_turn")
        if at_turn == 0:
            raise InvalidInputError("at_turn is a 1-based user turn (or None), got 0.")
    return sid, {"forked_from": source, "forked_at_turn": at_turn}
