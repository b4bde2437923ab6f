"""Digests: what an outside orchestrator needs to know of every session, read at once.

A cron job or another agent that runs its own reflection (reading L2s, writing insights
with `Session.set_insight`, consolidating stale sessions with `consolidate`) asks
`StelloAgent.digests()` which sessions need it: each `SessionDigest` has the session's
label, status, parent, turns, L2, how stale the L2 is (user turns since it was written),
the pending insight and the last activity. All of it comes from one whole-tree read
(`list_session_digests`: one query on SQLite), never from per-session queries.

    >>> from stello_graph import StelloAgent
    >>> from stello_graph.checkpoints import InMemoryMainStorage
    >>> from stello_graph.testing import ScriptedChatModel
    >>> agent = StelloAgent(model=ScriptedChatModel(default="Noted."),
    ...                     storage=InMemoryMainStorage(), consolidate_fn=lambda l2, r: "L2")
    >>> ideas = agent.fork(agent.main_session_id, "Ideas")
    >>> _ = agent.turn(ideas.id, "Tea?")
    >>> [(d.label, d.turns, d.stale_turns) for d in agent.digests() if d.role == "standard"]
    [('Ideas', 1, 1)]
    >>> _ = agent.consolidate(ideas.id)
    >>> agent.digest(ideas.id).l2, agent.digest(ideas.id).stale_turns
    ('L2', 0)
    >>> agent.close()
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any

from stello_graph.checkpoints._damage import UNDECODABLE, shown, undecodable
from stello_graph.models import SessionRole, SessionStatus

__all__ = ["DigestRow", "SessionDigest", "digest_from_row"]

DigestRow = tuple[str, str, str | int, str | int, str, str | None, int, str | None, int, str | None]
"""A session's digest as a backend reads it (`op_digests`): `(id, label, role, status,
updated_at, parent_id, turn_count, memory, stale_turns, insight)`, `updated_at` as the ISO
text `_serde.to_iso` writes, `stale_turns` the user records after the memory's cursor;
`role` and `status` as text or as the codes of `ROLE_CODE` / `STATUS_CODE`."""

_ROLES: tuple[SessionRole, ...] = ("standard", "main")
_STATUSES: tuple[SessionStatus, ...] = ("active", "archived")


# code or text -> the one string of each value (a backend's rows hold a copy per row)
_ROLE: dict[str | int, SessionRole] = {**dict(enumerate(_ROLES)), **{r: r for r in _ROLES}}
_STATUS: dict[str | int, SessionStatus] = {
    **dict(enumerate(_STATUSES)),
    **{s: s for s in _STATUSES},
}


def _coded(column: str, values: tuple[str, ...]) -> str:
    whens = " ".join(f"WHEN '{value}' THEN {code}" for code, value in enumerate(values))
    return f"CASE {column} {whens} ELSE {column} END"


ROLE_CODE = _coded("s.role", _ROLES)
"""SQL of a digest's role as a small integer code (`digest_from_row` maps it back): SQLite
then makes no string per session for it (the digests hold one string per value anyway)."""
STATUS_CODE = _coded("s.status", _STATUSES)
"""SQL of a digest's status as a code, as `ROLE_CODE`."""


@dataclass(frozen=True, slots=True)
class SessionDigest:
    """One session, as an outside orchestrator sees it.

    Attributes:
        id / label / role / status: from the session's meta.
        parent_id: its topology node's parent (`None` for the main session, or a session
            outside the tree).
        turns: the user turns the session committed itself (a fork's inherited turns are
            not counted).
        l2: its L2 (the synthesis, for the main session), or `None`.
        stale_turns: the user messages of its L3 after the L2's cursor (all of them, the
            inherited ones included, without an L2): how much a consolidation would add.
        insight: the pending insight, not yet shown to the session, or `None`.
        last_activity: when the session last changed (`updated_at`: its meta or its L3).
        damaged: the columns of a damaged row that do not decode (see `DamagedDataError`),
            shown with stand-ins (the label `"(undecodable)"`, ...); empty when sound.
    """

    id: str
    label: str
    role: SessionRole
    status: SessionStatus
    parent_id: str | None
    turns: int
    l2: str | None
    stale_turns: int
    insight: str | None
    last_activity: datetime
    damaged: tuple[str, ...] = ()


# The digest's slots, set through their descriptors: a frozen dataclass's `__init__` sets
# each field with `object.__setattr__`, twice the cost of a whole-tree read of 100,000 of them.
_new = object.__new__
_SET = {f.name: getattr(SessionDigest, f.name).__set__ for f in fields(SessionDigest)}
_set_id, _set_label, _set_role = _SET["id"], _SET["label"], _SET["role"]
_set_status, _set_parent, _set_turns = _SET["status"], _SET["parent_id"], _SET["turns"]
_set_l2, _set_stale, _set_insight = _SET["l2"], _SET["stale_turns"], _SET["insight"]
_set_at, _set_damaged = _SET["last_activity"], _SET["damaged"]


def digest_from_row(row: DigestRow) -> SessionDigest:
    """The `SessionDigest` of a backend's row (its values as the backend wrote them); of a
    damaged row, stand-ins for what does not decode, marked `damaged`."""
    sid, label, role, status, updated_at, parent_id, turns, memory, stale, insight = row
    role, status = _ROLE.get(role, role), _STATUS.get(status, status)
    damaged: tuple[str, ...] = ()
    try:
        at = datetime.fromisoformat(updated_at)  # written with its offset (`_serde.to_iso`)
    except (ValueError, TypeError):
        at = None
    texts = (sid, label, parent_id, memory, insight)
    if at is None or role not in _ROLES or status not in _STATUSES or any(map(undecodable, texts)):
        sid, label, role, status, parent_id, memory, insight, damaged = _stand_ins(row, at)
        at = at or _EPOCH
    digest = _new(SessionDigest)
    _set_id(digest, sid)
    _set_label(digest, label)
    _set_role(digest, role)
    _set_status(digest, status)
    _set_parent(digest, parent_id)
    _set_turns(digest, turns)
    _set_l2(digest, memory)
    _set_stale(digest, stale)
    _set_insight(digest, insight)
    _set_at(digest, at if at.tzinfo is not None else at.replace(tzinfo=UTC))
    _set_damaged(digest, damaged)
    return digest


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _stand_ins(row: DigestRow, at: datetime | None) -> tuple[Any, ...]:
    """A damaged digest row's values (`at`: its time, `None` when it does not parse), a
    stand-in for each that does not decode, and the columns of those."""
    sid, label, role, status, _, parent_id, _, memory, _, insight = row
    role, status = _ROLE.get(role, role), _STATUS.get(status, status)
    bad = {
        "id": undecodable(sid),
        "label": undecodable(label),
        "role": role not in _ROLES,
        "status": status not in _STATUSES,
        "updated_at": at is None,
        "parent_id": undecodable(parent_id),
        "memory": undecodable(memory),
        "insight": undecodable(insight),
    }
    return (
        shown(sid),
        UNDECODABLE if bad["label"] else label,
        "standard" if bad["role"] else role,
        "active" if bad["status"] else status,
        None if parent_id is None else shown(parent_id),
        UNDECODABLE if bad["memory"] else memory,
        UNDECODABLE if bad["insight"] else insight,
        tuple(name for name, wrong in bad.items() if wrong),
    )
