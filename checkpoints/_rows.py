"""Models built from rows the storage wrote itself, without validating them again.

Every value in a stello table was validated when it was written (`check_meta`, the write
paths' checks), so a whole-tree read (100,000 nodes, sessions or L2s) does not need pydantic to
check each row once more: it costs more than the read itself. These builders give the same
models a validated construction gives (equal, same `model_dump`, same fields set), filled
directly.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from pydantic import BaseModel

from stello_graph.checkpoints._serde import from_iso
from stello_graph.models import ChildL2, SessionMeta, SessionStats, TopologyNode

__all__ = [
    "built",
    "no_collection",
    "stats_from_row",
    "stored_l2",
    "stored_meta",
    "stored_model",
    "stored_node",
]

M = TypeVar("M", bound=BaseModel)
R = TypeVar("R")
T = TypeVar("T")

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
    if paused:
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
    if names is None:
        names = _FIELDS[cls] = set(cls.model_fields)
    model = _new(cls)
    _set_dict(model, values)
    # Shared by every model built here (they are frozen): pydantic copies the set before
    # changing it (`model_copy(update=...)`), so one set per class is safe and saves one
    # object per row.
    _set_fields(model, names)
    _set_extra(model, None)
    _set_private(model, None)
    return model


def stored_node(row: Sequence[Any]) -> TopologyNode:
    """The node of an `(id, parent_id, label)` row."""
    return stored_model(TopologyNode, {"id": row[0], "parent_id": row[1], "label": row[2]})


def stored_l2(session_id: str, label: str, l2: str) -> ChildL2:
    """The `ChildL2` of a session's stored L2."""
    return stored_model(ChildL2, {"session_id": session_id, "label": label, "l2": l2})


def stored_meta(row: Sequence[Any]) -> SessionMeta:
    """The `SessionMeta` of a `MetaRow` (`(id, label, role, status, tags, metadata,
    created_at, updated_at)`, as `_serde.meta_to_row` wrote it)."""
    sid, label, role, status, tags, metadata, created_at, updated_at = row
    return stored_model(
        SessionMeta,
        {
            "id": sid,
            "label": label,
            "role": role,
            "status": status,
            "tags": () if tags == "[]" else tuple(json.loads(tags)),
            "metadata": {} if metadata == "{}" else json.loads(metadata),
            "created_at": from_iso(created_at),
            "updated_at": from_iso(updated_at),
        },
    )


def stats_from_row(row: Sequence[Any]) -> SessionStats:
    """The `SessionStats` of a row of the SQL backends' session-stats statement: `(id,
    label, role, status, updated_at, parent_id, in_tree, turns, records, memory_through,
    turns_since_memory, has_memory, has_insight, has_subtree_synthesis)`."""
    return SessionStats(
        id=row[0],
        label=row[1],
        role=row[2],
        status=row[3],
        updated_at=from_iso(row[4]),
        parent_id=row[5],
        in_tree=bool(row[6]),
        turns=row[7],
        records=row[8],
        memory_through=row[9] or 0,
        turns_since_memory=row[10],
        has_memory=bool(row[11]),
        has_insight=bool(row[12]),
        has_subtree_synthesis=bool(row[13]),
    )
