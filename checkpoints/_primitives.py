"""The primitive step of the storage's flows, and the optional primitives composed of the
required ones.

A flow names each primitive it calls by the protocol's own method (`Op`), and `drive` /
`adrive` run it on a backend's sync or async primitives. A backend implements the required
primitives (`StorageBackend`); each one of `OptionalPrimitives` it lacks runs as the flow here
instead, over the required ones, written once for both drivers. Those read more than a
primitive of its own would (a whole session's records to count them, every node to find
one), which is right for a small store and slow for a large one: the reference backends
implement every optional primitive in one statement, and a third-party backend adds those
its figures need.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from stello_graph._flow import Storage
from stello_graph._flow import arun as adrive  # a flow on the async primitives of a backend
from stello_graph._flow import run as drive  # a flow on the sync primitives of a backend
from stello_graph.checkpoints._rows import stats_from_row
from stello_graph.checkpoints._serde import encode_message, to_iso
from stello_graph.checkpoints.backend import OptionalPrimitives, StorageBackend
from stello_graph.errors import SessionNotFoundError

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

    from stello_graph.checkpoints._serde import RecordTurn
    from stello_graph.digest import DigestRow
    from stello_graph.models import SessionStats, TopologyNode

__all__ = ["DEFAULTS", "Flow", "Op", "adrive", "drive", "node_by_id", "one", "values"]

T = TypeVar("T")
P = ParamSpec("P")


class Op(Storage):
    """One call of a backend primitive, named by the protocol's own method:
    `Op(OptionalPrimitives.op_count, session_id)` calls the backend's `op_count` when driven
    sync and its `aop_count` twin when driven async (the core's `Storage` step). On a
    backend without that primitive (an optional one), its composed default runs instead."""

    __slots__ = ("method",)

    def __init__(
        self, method: Callable[Concatenate[Any, P], object], /, *args: P.args, **kwargs: P.kwargs
    ) -> None:
        super().__init__(method, *args, **kwargs)
        self.method = method

    def run(self, storage: object) -> Any:
        method = getattr(storage, self.name, None)
        return (
            drive(self.missing(), storage) if method is None else method(*self.args, **self.kwargs)
        )

    async def arun(self, storage: object) -> Any:
        method = getattr(storage, f"a{self.name}", None)
        if method is None:
            return await adrive(self.missing(), storage)
        return await method(*self.args, **self.kwargs)

    def missing(self) -> Flow[Any]:
        """The composed default of an optional primitive the backend lacks."""
        default = DEFAULTS.get(self.method)
        if default is None:
            raise TypeError(f"The storage backend lacks {self.name}, a required primitive.")
        return default(*self.args, **self.kwargs)


Flow = Generator[Op, Any, T]
"""A storage operation: yields primitives, receives their results, returns its own."""


def one(method: Callable[Concatenate[Any, P], T], /, *args: P.args, **kwargs: P.kwargs) -> Flow[T]:
    """The flow of a single primitive call: its result."""
    result: T = yield Op(method, *args, **kwargs)
    return result


_FIGURES = ("turn_count", "memory", "memory_through", "insight", "subtree_synthesis")


def values(session_id: str, names: Sequence[str]) -> Flow[tuple[Any, ...] | None]:
    """The named `FIELDS` of the session (`None` for a missing session)."""
    found = yield Op(StorageBackend.op_read_session, session_id, names, False)
    return None if found is None else found[1]


def count(session_id: str) -> Flow[int]:
    records: Sequence[BaseMessage] = yield Op(StorageBackend.op_records, session_id)
    return len(records)


def has_turn(session_id: str, turn_id: str) -> Flow[bool]:
    turns: list[RecordTurn] = yield Op(StorageBackend.op_turns, session_id)
    return any(turn == turn_id for turn, _ in turns)


def node_by_id(node_id: str) -> Flow[TopologyNode | None]:
    """The node (`None` when there is none)."""
    found: list[TopologyNode] = yield Op(StorageBackend.op_nodes, node_id, None)
    return found[0] if found else None


def all_fields(names: Sequence[str]) -> Flow[list[tuple[Any, ...]]]:
    rows = []
    for meta in (yield Op(StorageBackend.op_list_sessions, None, None)):
        found = yield from values(meta.id, names)
        if found is not None:
            rows.append((meta.id, *found))
    return rows


def copy_records(source_id: str, target_id: str, count: int) -> Flow[int]:
    target = yield Op(StorageBackend.op_read_session, target_id, (), False)
    if target is None:
        raise SessionNotFoundError(target_id)
    if (yield Op(StorageBackend.op_read_session, source_id, (), False)) is None:
        raise SessionNotFoundError(source_id)
    records = (yield Op(StorageBackend.op_records, source_id))[:count]
    turns = (yield Op(StorageBackend.op_turns, source_id))[:count]
    encoded = [encode_message(record) for record in records]
    at = to_iso(target[0].updated_at)  # the target's own: its `updated_at` stays as it is
    copied: int = yield Op(StorageBackend.op_append, target_id, encoded, at, False, turns)
    return copied


_Figures = tuple[tuple[Any, ...], bool, tuple[Any, ...], int]


def _figures() -> Flow[list[_Figures]]:
    """Per session in creation order: `(id, label, role, status, updated_at, its node's
    parent)`, whether it has a node, its `_FIGURES` with its record count, and the user turns
    among its records after the L2's cursor."""
    nodes = {node.id: node for node in (yield Op(StorageBackend.op_nodes, None, None))}
    found = []
    for meta in (yield Op(StorageBackend.op_list_sessions, None, None)):
        read = yield Op(StorageBackend.op_read_session, meta.id, _FIGURES, True)
        if read is None:  # removed between the two reads
            continue
        _, values, records = read
        stale = sum(1 for record in records[values[2] or 0 :] if record.type == "human")
        node = nodes.get(meta.id)
        parent = node.parent_id if node is not None else None
        row = (meta.id, meta.label, meta.role, meta.status, to_iso(meta.updated_at), parent)
        found.append((row, node is not None, (*values, len(records)), stale))
    return found


def digests() -> Flow[list[DigestRow]]:
    rows: list[DigestRow] = []
    for row, _, values, stale in (yield from _figures()):
        turns, memory, _, insight, _, _ = values
        rows.append((*row, int(turns or 0), memory, stale, insight))
    return rows


def session_stats() -> Flow[list[SessionStats]]:
    stats = []
    for row, in_tree, values, stale in (yield from _figures()):
        turns, memory, through, insight, subtree, records = values
        figures = (in_tree, int(turns or 0), records, int(through or 0), stale)
        present = (memory is not None, insight is not None, subtree is not None)
        stats.append(stats_from_row((*row, *figures, *present)))
    return stats


DEFAULTS: dict[Callable[..., object], Callable[..., Flow[Any]]] = {
    OptionalPrimitives.op_count: count,
    OptionalPrimitives.op_has_turn: has_turn,
    OptionalPrimitives.op_all_fields: all_fields,
    OptionalPrimitives.op_copy_records: copy_records,
    OptionalPrimitives.op_digests: digests,
    OptionalPrimitives.op_session_stats: session_stats,
}
"""The composed flow of each optional primitive, by the protocol's method."""
