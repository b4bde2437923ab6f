"""What `BackendStorage` does between primitives, written once for sync and async.

Each storage operation that reads, decides and writes (a lease, a trim, a topology check) is a
generator that yields the primitives it needs as `Op`s and receives each one's result. `drive`
runs it on a backend's sync primitives (`op_NAME`), `adrive` on its async ones (`aop_NAME`;
both in `_primitives`, with the defaults of the optional primitives),
so the logic between the primitives cannot drift apart between the sync and async methods
(httpx's `Auth.auth_flow`; `stello_graph._flow` does the same one level up). A step names
the primitive by the protocol's own method, so mypy checks its arguments:

    >>> def count_plus_one(session_id):
    ...     count = yield Op(OptionalPrimitives.op_count, session_id)
    ...     return count + 1
    >>> from stello_graph.checkpoints import InMemoryMainStorage
    >>> drive(count_plus_one("s1"), InMemoryMainStorage())
    1

A flow never locks, validates or opens a transaction: `Transactions` runs it under the
storage's lock, inside a transaction for a write.
"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any, TypeVar

from stello_graph._tree_text import tree_order
from stello_graph.checkpoints._damage import shown, undecodable
from stello_graph.checkpoints._primitives import (
    Flow,
    Op,
    adrive,
    drive,
    node_by_id,
    one,
    values,
)
from stello_graph.checkpoints._rows import built, stored_l2
from stello_graph.checkpoints._serde import (
    EventRow,
    RecordTurn,
    from_iso,
    message_role,
)
from stello_graph.checkpoints.backend import OptionalPrimitives, StorageBackend
from stello_graph.digest import DigestRow, SessionDigest, digest_from_row
from stello_graph.errors import (
    InvalidInputError,
    LeaseLostError,
    NodeHasChildrenError,
    NodeNotFoundError,
    SessionNotFoundError,
    TopologyCycleError,
)
from stello_graph.events import StoredEvent
from stello_graph.lineage import ForkPoint
from stello_graph.models import (
    ChildL2,
    Compression,
    Lease,
    SessionMeta,
    SessionSnapshot,
    TopologyNode,
)

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage


__all__ = ["Flow", "Op", "adrive", "drive", "one"]

T = TypeVar("T")

UNDECODABLE_EVENT = "undecodable"
"""The key of a damaged event's details: `{"undecodable": <its stored text>}`."""

_WAITER_TTL = 0.5
"""Seconds a turn waiting for a lease keeps its place as the next holder without asking
again (a waiter asks every few milliseconds)."""


# -- per-session values ---------------------------------------------------------------------
def field(session_id: str, name: str) -> Flow[Any]:
    """One of the session's `FIELDS` (`None` for a missing session)."""
    found = yield from values(session_id, (name,))
    return None if found is None else found[0]


def text(session_id: str, name: str) -> Flow[str | None]:
    """A text value of the session (`None` when unset or missing)."""
    value: str | None = yield from field(session_id, name)
    return value


def number(session_id: str, name: str) -> Flow[int]:
    """A counter of the session (0 when unset or missing)."""
    value = yield from field(session_id, name)
    return int(value or 0)


def compression(session_id: str) -> Flow[Compression | None]:
    values = yield from _when_set(session_id, ("compression", "compression_through"))
    return None if values is None else Compression(summary=values[0], through=values[1] or 0)


def settings(session_id: str) -> Flow[dict[str, Any]]:
    found = loads((yield from field(session_id, "settings")))
    return dict(found) if isinstance(found, dict) else {}


def _when_set(session_id: str, names: tuple[str, ...]) -> Flow[tuple[Any, ...] | None]:
    """The named `FIELDS` of the session; `None` for a missing session or an unset first."""
    found = yield from values(session_id, names)
    return None if found is None or found[0] is None else found


def _fields(session_id: str, names: tuple[str, ...]) -> Flow[tuple[Any, ...]]:
    """The named `FIELDS` of the session; `SessionNotFoundError` for a missing session."""
    found = yield from values(session_id, names)
    if found is None:
        raise SessionNotFoundError(session_id)
    return found


def get_global(key: str) -> Flow[Any]:
    return loads((yield Op(StorageBackend.op_get_global, key)))


def loads(text: str | None) -> Any:
    """The JSON value stored as `text` (`None` for nothing stored)."""
    return None if text is None else json.loads(text)


def clear_insight(session_id: str, expected: str | None) -> Flow[bool]:
    """Compare-and-clear: remove the insight only when it is still `expected` (if given)."""
    (current,) = yield from _fields(session_id, ("insight",))
    if current is None or (expected is not None and current != expected):
        return False
    yield Op(StorageBackend.op_set_fields, session_id, {"insight": None})
    return True


def put_memory(session_id: str, values: dict[str, Any]) -> Flow[None]:
    through = values.get("memory_through")
    if through is not None:
        yield from _existing(session_id)
        count = yield Op(OptionalPrimitives.op_count, session_id)
        if through > count:
            raise InvalidInputError(
                f"through={through} is beyond the {count} record(s) of session "
                f"{session_id!r}: the memory can cover at most every record; pass at most "
                f"{count}."
            )
    yield Op(StorageBackend.op_set_fields, session_id, values)


# -- sessions and records -------------------------------------------------------------------
def get_session(session_id: str) -> Flow[SessionMeta | None]:
    """The session's meta (`None` for a missing session): its `op_read_session` alone."""
    found = yield Op(StorageBackend.op_read_session, session_id, (), False)
    return None if found is None else found[0]


def l2s() -> Flow[list[ChildL2]]:
    """Every L2 of `op_l2s_after`, in one read."""
    rows = yield Op(StorageBackend.op_l2s_after, 0, sys.maxsize)
    return built(lambda row: stored_l2(row[1], row[2], row[3]), rows)


def _existing(session_id: str) -> Flow[None]:
    """`SessionNotFoundError` for a missing session."""
    if (yield from get_session(session_id)) is None:
        raise SessionNotFoundError(session_id)


SNAPSHOT = (
    *("settings", "system_prompt", "insight", "memory", "subtree_synthesis"),
    *("compression", "compression_through", "turn_count"),
)
"""The per-session values a `SessionSnapshot` carries, in the order `read_session` reads them."""


def read_session(session_id: str, records: bool) -> Flow[SessionSnapshot | None]:
    """Everything a turn reads of its session, in one read (`op_read_session`)."""
    found = yield Op(StorageBackend.op_read_session, session_id, SNAPSHOT, records)
    return None if found is None else snapshot(found[0], found[1], found[2])


def snapshot(meta: SessionMeta, values: Any, stored: Any) -> SessionSnapshot:
    settings_text, prompt, insight, memory, synthesis, summary, through, turns = values
    settings = loads(settings_text)
    return SessionSnapshot(
        meta=meta,
        settings=dict(settings) if isinstance(settings, dict) else {},
        system_prompt=prompt,
        insight=insight,
        memory=memory,
        subtree_synthesis=synthesis,
        compression=None if summary is None else Compression(summary=summary, through=through or 0),
        turn_count=int(turns or 0),
        records=list(stored),
    )


def has_turn(session_id: str, turn_id: str) -> Flow[bool]:
    return bool((yield Op(OptionalPrimitives.op_has_turn, session_id, turn_id)))


def list_sessions(status: Any, role: Any, tags: tuple[str, ...]) -> Flow[list[SessionMeta]]:
    metas: list[SessionMeta] = yield Op(StorageBackend.op_list_sessions, status, role)
    wanted = set(tags)
    return [meta for meta in metas if wanted.issubset(meta.tags)] if wanted else metas


def main_session() -> Flow[SessionMeta | None]:
    mains = yield Op(StorageBackend.op_list_sessions, None, "main")
    return mains[0] if mains else None


def list_records(
    session_id: str, limit: int | None, offset: int, role: str | None
) -> Flow[list[BaseMessage]]:
    records = yield Op(StorageBackend.op_records, session_id)
    if role is not None:
        records = [record for record in records if message_role(record) == role]
    end = None if limit is None else offset + limit
    return list(records[offset:end])


def list_turns(
    session_id: str, limit: int | None, offset: int, role: str | None
) -> Flow[list[RecordTurn]]:
    turns = yield Op(StorageBackend.op_turns, session_id)
    if role is not None:
        records = yield Op(StorageBackend.op_records, session_id)
        turns = [t for r, t in zip(records, turns, strict=True) if message_role(r) == role]
    end = None if limit is None else offset + limit
    return list(turns[offset:end])


def shared_records(session_id: str) -> Flow[list[BaseMessage]]:
    return list((yield Op(StorageBackend.op_records, session_id)))


def trim(session_id: str, keep_last: int) -> Flow[int]:
    cursors = yield from _fields(session_id, ("memory_through", "compression_through"))
    dropped = (yield Op(OptionalPrimitives.op_count, session_id)) - keep_last
    if dropped <= 0:
        return 0
    yield Op(StorageBackend.op_drop_oldest, session_id, dropped)
    memory, compressed = (max(0, (c or 0) - dropped) for c in cursors)
    moved = {"memory_through": memory, "compression_through": compressed}
    yield Op(StorageBackend.op_set_fields, session_id, moved)
    return int(dropped)


# -- topology -------------------------------------------------------------------------------
def put_node(node: TopologyNode) -> Flow[None]:
    yield from _existing(node.id)
    parent_id = node.parent_id
    if parent_id is not None:
        if parent_id == node.id:
            raise TopologyCycleError(node.id, parent_id)
        if (yield from node_by_id(parent_id)) is None:
            raise NodeNotFoundError(parent_id)
        if any(above.id == node.id for above in (yield from ancestors(parent_id))):
            raise TopologyCycleError(node.id, parent_id)
    yield Op(StorageBackend.op_put_node, node)


def ancestors(node_id: str) -> Flow[list[TopologyNode]]:
    found: list[TopologyNode] = []
    seen = {node_id}
    above = yield from node_by_id(node_id)
    while above is not None and above.parent_id is not None and above.parent_id not in seen:
        above = yield from node_by_id(above.parent_id)
        if above is not None:
            found.append(above)
            seen.add(above.id)
    return found


def remove_node(node_id: str, cascade: bool) -> Flow[list[str]]:
    if (yield from node_by_id(node_id)) is None:
        raise NodeNotFoundError(node_id)
    children = yield Op(StorageBackend.op_nodes, None, node_id)
    if children and not cascade:
        raise NodeHasChildrenError(node_id, len(children))
    removed, seen = [node_id], {node_id}
    index = 0
    while index < len(removed):  # breadth-first: every parent before its children
        for child in (yield Op(StorageBackend.op_nodes, None, removed[index])):
            if child.id in seen:  # its parents make a cycle (a damaged tree): cut it here,
                # so that each node goes after the nodes that name it as their parent
                yield Op(StorageBackend.op_put_node, child.model_copy(update={"parent_id": None}))
            else:
                seen.add(child.id)
                removed.append(child.id)
        index += 1
    yield Op(StorageBackend.op_delete_sessions, removed[::-1])
    return removed


def tree() -> Flow[list[TopologyNode]]:
    detached: set[str] = set()
    nodes = tree_order((yield Op(StorageBackend.op_nodes, None, None)), detached)
    if not detached:
        return nodes
    return [  # no root reaches them (their parents make a cycle): marked, see `_damage`
        node.model_copy(update={"damaged": (*node.damaged, "parent_id")})
        if node.id in detached
        else node
        for node in nodes
    ]


# -- the event log ---------------------------------------------------------------------------
def events_after(cursor: int, limit: int) -> Flow[list[StoredEvent]]:
    rows: list[EventRow] = yield Op(StorageBackend.op_events_after, cursor, limit)
    return [
        StoredEvent(cursor=c, type=kind, session_id=sid, data=_event_data(payload), at=from_iso(at))
        for c, kind, sid, payload, at in rows
    ]


def _event_data(payload: str) -> dict[str, Any]:
    """An event's stored details; of a damaged event (see `_damage`), what can be shown of
    them, so that a reader following the log is never stuck on it."""
    try:
        data = None if undecodable(payload) else json.loads(payload)
    except ValueError:
        data = None
    return data if isinstance(data, dict) else {UNDECODABLE_EVENT: shown(payload)}


# -- branching: copied records, lineage, digests --------------------------------------------
LINEAGE = ("forked_from", "forked_at_turn")


def copy_records(source_id: str, target_id: str, count: int) -> Flow[int]:
    for session_id in (source_id, target_id):
        yield from _existing(session_id)
    available = yield Op(OptionalPrimitives.op_count, source_id)
    if count > available:
        raise InvalidInputError(
            f"count={count} is beyond the {available} record(s) of session "
            f"{source_id!r}; pass at most {available}."
        )
    copied: int = yield Op(OptionalPrimitives.op_copy_records, source_id, target_id, count)
    return copied


def lineage(session_id: str) -> Flow[ForkPoint | None]:
    values = yield from _when_set(session_id, LINEAGE)
    return None if values is None else ForkPoint(session_id, values[0], values[1])


def list_lineage() -> Flow[dict[str, ForkPoint]]:
    rows = yield Op(OptionalPrimitives.op_all_fields, LINEAGE)
    return _lineage(rows)


def _lineage(rows: list[tuple[Any, ...]]) -> dict[str, ForkPoint]:
    """The fork points of `(id, forked_from, forked_at_turn, ...)` rows."""
    return {row[0]: ForkPoint(row[0], row[1], row[2]) for row in rows if row[1] is not None}


TopologyParts = tuple[list[TopologyNode], list[SessionMeta], dict[str, ForkPoint], dict[str, int]]
"""What `Topology.read` is made of on a backend without `op_topology_text`: the nodes in tree
order, every session's meta, the lineage and every session's user turns."""


def topology_parts() -> Flow[TopologyParts]:
    """The parts of `Topology.read` in three statements, one pass over the sessions for
    both the lineage and the turn counts (each was a pass of its own)."""
    nodes = yield from tree()
    metas: list[SessionMeta] = yield Op(StorageBackend.op_list_sessions, None, None)
    rows: list[tuple[Any, ...]] = yield Op(
        OptionalPrimitives.op_all_fields, (*LINEAGE, "turn_count")
    )
    return nodes, metas, _lineage(rows), {row[0]: row[3] for row in rows}


def digests() -> Flow[list[SessionDigest]]:
    rows: list[DigestRow] = yield Op(OptionalPrimitives.op_digests)
    return built(digest_from_row, rows)


# -- the session lease ----------------------------------------------------------------------
LEASE = ("lease_owner", "lease_token", "lease_expires")
QUEUE = (*LEASE, "lease_waiter", "lease_wait_until")
"""The lease's `FIELDS`, and those with the next holder's place: what `choose_lease` reads."""


def choose_lease(
    session_id: str, owner: str, ttl: float, replace: str | None, row: Any, now: float
) -> tuple[Lease | None, dict[str, Any]]:
    """The lease decision on the session's `QUEUE` fields (`row`), as `op_lease` takes it:
    the lease taken (or renewed), or `None`, and the `FIELDS` to write (none: nothing
    changes). Free: nobody holds it, it expired, or its holder is `replace`. Taken by a new
    owner, it gets the next token; renewed by its owner, it keeps it. The first owner
    refused waits in line: until it takes the lease (or stops asking for `_WAITER_TTL`),
    nobody else does, so a holder that turns again at once cannot starve the others."""
    holder, token, expires, waiter, wait_until = row
    token = int(token or 0)
    free = holder is None or holder in (owner, replace) or (expires or 0.0) <= now
    queued = waiter is not None and waiter != owner and (wait_until or 0.0) > now
    if holder != owner and (not free or queued):
        if waiter is None or waiter == owner or (wait_until or 0.0) <= now:
            return None, {"lease_waiter": owner, "lease_wait_until": now + _WAITER_TTL}
        return None, {}
    lease = Lease(session_id, owner, token if holder == owner else token + 1, now + ttl)
    wait_over = {"lease_waiter": None, "lease_wait_until": 0.0} if waiter == owner else {}
    return lease, _lease_values(lease) | wait_over


def release_changes(lease: Lease, row: Any) -> tuple[bool, dict[str, Any]]:
    """Whether `lease` holds the session (its `QUEUE` fields, `row`), and the `FIELDS` that
    free it and the next holder's place its owner kept (an asker that gave up waiting must
    not keep the others out until the place lapses), as `op_release_lease` writes them."""
    holder, token, _, waiter, _ = row
    held: bool = holder == lease.owner and token == lease.token
    changes: dict[str, Any] = {"lease_owner": None, "lease_expires": 0.0} if held else {}
    if waiter == lease.owner:
        changes |= {"lease_waiter": None, "lease_wait_until": 0.0}
    return held, changes


def renew_lease(lease: Lease, ttl: float) -> Flow[Lease | None]:
    holder, token = yield from _fields(lease.session_id, LEASE[:2])
    if holder != lease.owner or token != lease.token:
        return None
    renewed = Lease(lease.session_id, lease.owner, token, time.time() + ttl)
    yield Op(StorageBackend.op_set_fields, lease.session_id, _lease_values(renewed))
    return renewed


def _lease_values(lease: Lease) -> dict[str, Any]:
    return dict(zip(LEASE, (lease.owner, lease.token, lease.expires_at), strict=True))


def get_lease(session_id: str) -> Flow[Lease | None]:
    values = yield from _when_set(session_id, LEASE)
    if values is None:
        return None
    return Lease(session_id, values[0], int(values[1] or 0), float(values[2] or 0.0))


def check_lease(lease: Lease) -> Flow[None]:
    values = yield from _fields(lease.session_id, LEASE)
    if values[0] != lease.owner or values[1] != lease.token:
        raise LeaseLostError(lease.session_id)
