"""Models built from rows the storage wrote itself, without validating them again.

Every value in a stello table was validated when it was written (`check_meta`, the write
paths' checks), so a whole-tree read (100,000 nodes, sessions or L2s) does not need pydantic to
check each row once more: it costs more than the read itself. These builders give the same
models a validated construction gives (equal, same `model_dump`, same fields set), filled
directly. A row damaged since it was written (see `_damage`) becomes a placeholder marked
`damaged`, so one such row never makes the rest of the tree unreadable.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import BaseModel

from stello_graph.checkpoints._damage import (
    META,
    ROLES,
    STATUSES,
    UNDECODABLE,
    Undecodable,
    meta_damage,
    shown,
    undecodable,
)
from stello_graph.checkpoints._serde import from_iso
from stello_graph.models import ChildL2, SessionMeta, SessionStats, TopologyNode

__all__ = [
    "ALL_NODES",
    "CHILDREN",
    "EVENTS_AFTER",
    "GET_GLOBAL",
    "GET_NODE",
    "L2S_AFTER",
    "PUT_GLOBAL",
    "PUT_NODE",
    "built",
    "listed_sessions",
    "no_collection",
    "stats_from_row",
    "stored_l2",
    "stored_meta",
    "stored_model",
    "stored_node",
]

M = TypeVar("M", bound=BaseModel)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
R = TypeVar("R")
T = TypeVar("T")

# -- statements both SQL backends run, as written for PostgreSQL (`%s`; SQLite's `?`) --------
_NODE = "SELECT id, parent_id, label FROM stello_nodes WHERE tree_id = %s"
GET_NODE = f"{_NODE} AND id = %s"
CHILDREN = f"{_NODE} AND parent_id = %s ORDER BY position"
ALL_NODES = f"{_NODE} ORDER BY position"
PUT_NODE = """INSERT INTO stello_nodes (tree_id, id, parent_id, label, position)
    VALUES (%s, %s, %s, %s,
        (SELECT COALESCE(MAX(position), 0) + 1 FROM stello_nodes WHERE tree_id = %s))
    ON CONFLICT (tree_id, id) DO UPDATE SET
        parent_id = excluded.parent_id, label = excluded.label"""
GET_GLOBAL = "SELECT value FROM stello_globals WHERE tree_id = %s AND key = %s"
PUT_GLOBAL = """INSERT INTO stello_globals (tree_id, key, value) VALUES (%s, %s, %s)
    ON CONFLICT (tree_id, key) DO UPDATE SET value = excluded.value"""
EVENTS_AFTER = """SELECT cursor, kind, session_id, payload, at FROM stello_events
    WHERE tree_id = %s AND cursor > %s ORDER BY cursor LIMIT %s"""
L2S_AFTER = """SELECT created_seq, id, label, memory FROM stello_sessions
    WHERE tree_id = %s AND role = 'standard' AND status = 'active'
        AND memory IS NOT NULL AND created_seq > %s
    ORDER BY created_seq LIMIT %s"""


def listed_sessions(tree_id: str, status: str | None, role: str | None) -> tuple[str, list[str]]:
    """The statement of `op_list_sessions` (placeholders `%s`) and its parameters."""
    where, params = ["tree_id = %s"], [tree_id]
    for column, value in (("role", role), ("status", status)):
        if value is not None:
            where.append(f"{column} = %s")
            params.append(value)
    sql = f"SELECT {META} FROM stello_sessions WHERE {' AND '.join(where)} ORDER BY created_seq"
    return sql, params


_new = object.__new__
_FIELDS: dict[type[BaseModel], set[str]] = {}

# `BaseModel`'s slots, set through their descriptors (a C call each, no attribute lookup):
# what `object.__setattr__` would reach, without pydantic's frozen-model `__setattr__`.
_SLOTS = vars(BaseModel)
_set_dict = _SLOTS["__dict__"].__set__
_set_fields = _SLOTS["__pydantic_fields_set__"].__set__
_set_extra = _SLOTS["__pydantic_extra__"].__set__
_set_private = _SLOTS["__pydantic_private__"].__set__


@contextmanager
def no_collection() -> Iterator[None]:
    """The cyclic garbage collector paused for the block.

    Building 100,000 objects in a row otherwise triggers a collection every 700 of them,
    each walking the young objects again (about a third of a whole-tree read); the objects
    a whole-tree read builds hold no cycles, and the collector runs again once it is done.
    """
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def built(make: Callable[[R], T], rows: Iterable[R]) -> list[T]:
    """`[make(row) for row in rows]`, with the cyclic garbage collector paused meanwhile."""
    with no_collection():
        return [make(row) for row in rows]


def stored_model(cls: type[M], values: dict[str, Any]) -> M:
    """A `cls` holding `values` as they are: every field given, of its declared type."""
    names = _FIELDS.get(cls)
    if names is None:  # as a validated construction sets them (`damaged`: only when given)
        names = _FIELDS[cls] = {n for n, f in cls.model_fields.items() if not f.exclude}
    model = _new(cls)
    _set_dict(model, values)
    # Shared by every model built here (they are frozen): pydantic copies the set before
    # changing it (`model_copy(update=...)`), so one set per class is safe and saves one
    # object per row.
    _set_fields(model, names)
    _set_extra(model, None)
    _set_private(model, None)
    return model


def _text(text: str) -> str:
    """`text`, or `UNDECODABLE` for a text that does not decode."""
    return UNDECODABLE if type(text) is Undecodable else text


def stored_node(row: Sequence[Any]) -> TopologyNode:
    """The node of an `(id, parent_id, label)` row; of a damaged one (text that is not
    UTF-8), a placeholder marked `damaged` (see `_damage`)."""
    nid, parent, label = row[0], row[1], row[2]
    if not (undecodable(nid) or undecodable(label) or undecodable(parent)):
        return stored_model(
            TopologyNode, {"id": nid, "parent_id": parent, "label": label, "damaged": ()}
        )
    columns = ("id", "parent_id", "label")
    return stored_model(
        TopologyNode,
        {
            "id": shown(nid),
            "parent_id": shown(parent),
            "label": _text(label),
            "damaged": tuple(c for c, v in zip(columns, row, strict=False) if undecodable(v)),
        },
    )


def stored_l2(session_id: str, label: str, l2: str) -> ChildL2:
    """The `ChildL2` of a session's stored L2 (a text that does not decode: `UNDECODABLE`)."""
    return stored_model(
        ChildL2, {"session_id": shown(session_id), "label": _text(label), "l2": _text(l2)}
    )


def stored_meta(row: Sequence[Any]) -> SessionMeta:
    """The `SessionMeta` of a `MetaRow` (`(id, label, role, status, tags, metadata,
    created_at, updated_at)`, as `_serde.meta_to_row` wrote it); of a damaged row, a
    placeholder marked `damaged` with the columns that do not decode (see `_damage`)."""
    sid, label, role, status, tags, metadata, created_at, updated_at = row
    try:
        if role in ROLES and status in STATUSES and not (undecodable(sid) or undecodable(label)):
            return stored_model(
                SessionMeta,
                {
                    "id": sid,
                    "label": label,
                    "role": role,
                    "status": status,
                    "tags": () if tags == "[]" else tuple(_json(tags, list)),
                    "metadata": {} if metadata == "{}" else _json(metadata, dict),
                    "created_at": from_iso(created_at),
                    "updated_at": from_iso(updated_at),
                    "damaged": (),
                },
            )
    except (ValueError, TypeError):
        pass
    # damaged: every column that decodes, a stand-in for each other one, and those columns
    bad = meta_damage(row) or ("row",)
    return stored_model(
        SessionMeta,
        {
            "id": shown(sid) if isinstance(sid, str) else str(sid),
            "label": UNDECODABLE if "label" in bad else label,
            "role": "standard" if "role" in bad else role,
            "status": "active" if "status" in bad else status,
            "tags": () if "tags" in bad else tuple(json.loads(tags)),
            "metadata": {} if "metadata" in bad else json.loads(metadata),
            "created_at": _EPOCH if "created_at" in bad else from_iso(created_at),
            "updated_at": _EPOCH if "updated_at" in bad else from_iso(updated_at),
            "damaged": bad,
        },
    )


def _json(text: str, kind: type[T]) -> T:
    """The JSON value of `text`, a `kind`.

    Raises:
        ValueError: `text` does not decode, or holds another kind of value.
    """
    found = None if undecodable(text) else json.loads(text)
    if not isinstance(found, kind):
        raise ValueError(f"not a {kind.__name__}")
    return found


def stats_from_row(row: Sequence[Any]) -> SessionStats:
    """The `SessionStats` of a row of the SQL backends' session-stats statement: `(id,
    label, role, status, updated_at, parent_id, in_tree, turns, records, memory_through,
    turns_since_memory, has_memory, has_insight, has_subtree_synthesis)`; of a damaged row,
    stand-ins for what does not decode, marked `damaged`."""
    sid, label, role, status = row[0], row[1], row[2], row[3]
    damaged: tuple[str, ...] = ()
    if not (role in ROLES and status in STATUSES and not (undecodable(sid) or undecodable(label))):
        damaged = tuple(
            name
            for name, bad in (
                ("id", undecodable(sid)),
                ("label", undecodable(label)),
                ("role", role not in ROLES),
                ("status", status not in STATUSES),
            )
            if bad
        )
        sid, label = shown(sid), _text(label)
        role = role if role in ROLES else "standard"
        status = status if status in STATUSES else "active"
    try:
        updated_at = from_iso(row[4])
    except ValueError:
        updated_at, damaged = _EPOCH, (*damaged, "updated_at")
    return SessionStats(
        id=sid,
        label=label,
        role=role,
        status=status,
        updated_at=updated_at,
        parent_id=shown(row[5]),
        in_tree=bool(row[6]),
        turns=row[7],
        records=row[8],
        memory_through=row[9] or 0,
        turns_since_memory=row[10],
        has_memory=bool(row[11]),
        has_insight=bool(row[12]),
        has_subtree_synthesis=bool(row[13]),
        damaged=damaged,
    )
