"""Whole-tree reads of `MainStorage` for views, exports and integrators of large trees.

* `topology_text` - what `Topology.read` needs as two JSON texts, in one statement (SQLite,
  PostgreSQL); `topology_parts` - the same as models, in one read of three statements.
* `list_turn_counts` - every session's user turns, in one read.
* `iter_session_l2s(batch=...)` - the L2s of `get_all_session_l2s`, a page at a time: the
  caller holds one page, never 100,000 L2s, and the storage is free between pages.
* `export_rows(part, sink)` - every node, session or record of the tree handed over one
  row at a time as the backend reads it (`stello_graph.export` streams its JSON from them).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Protocol

from stello_graph._tree_text import TopologyText
from stello_graph.checkpoints._flows import TopologyParts, topology_parts
from stello_graph.checkpoints._primitives import Flow, one
from stello_graph.checkpoints._rows import built, stored_l2
from stello_graph.checkpoints.backend import OptionalPrimitives, StorageBackend
from stello_graph.errors import InvalidInputError
from stello_graph.models import ChildL2

if TYPE_CHECKING:
    from stello_graph.checkpoints._txn import Transactions
    from stello_graph.checkpoints.backend import ExportPart, L2Row, RowSink

__all__ = ["EXPORT_PARTS", "MAX_L2_BATCH", "BulkReads"]

MAX_L2_BATCH = 100_000
"""The largest page `iter_session_l2s` reads at once."""

EXPORT_PARTS = ("nodes", "sessions", "records")
"""The parts `export_rows` reads (see `checkpoints.backend.ExportPart`)."""


class TopologyTextBackend(Protocol):
    """The optional primitive of the reference backends (SQLite, PostgreSQL) that
    `topology_text` uses where the backend has it."""

    def op_topology_text(self) -> TopologyText | None: ...


def _batch(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_L2_BATCH:
        raise InvalidInputError(f"batch must be an int from 1 to {MAX_L2_BATCH:,}, got {value!r}.")
    return value


def _part(value: object) -> ExportPart:
    if value not in EXPORT_PARTS:
        raise InvalidInputError(f"part must be one of {EXPORT_PARTS}, got {value!r}.")
    return value  # type: ignore[return-value]


def _page(rows: list[L2Row], size: int) -> tuple[int | None, list[ChildL2]]:
    """The position to read on from (`None` after the last page), and the page's
    `ChildL2`s."""
    after = None if len(rows) < size else rows[-1][0]
    return after, built(lambda row: stored_l2(*row[1:]), rows)


def _turn_counts() -> Flow[dict[str, int]]:
    return dict((yield from one(OptionalPrimitives.op_all_fields, ("turn_count",))))


class BulkReads:
    """The whole-tree reads of `BackendStorage` (a part of it)."""

    _txn: Transactions

    def topology_text(self) -> TopologyText | None:
        """Every node and every session's meta, lineage and user turns, as the two JSON texts
        of a `TopologyText`, in one statement (`Topology.read`); `None` on a backend without
        `op_topology_text`, or when the text would be longer than the database's longest
        value (`topology_parts` then; on PostgreSQL, inside a transaction, that failure
        has aborted the transaction and is raised)."""
        if not self._txn.has(TopologyTextBackend.op_topology_text):
            return None
        return self._txn.read(one(TopologyTextBackend.op_topology_text))

    async def atopology_text(self) -> TopologyText | None:
        """Async twin of `topology_text`."""
        if not self._txn.has(TopologyTextBackend.op_topology_text, in_async=True):
            return None
        return await self._txn.aread(one(TopologyTextBackend.op_topology_text))

    def topology_parts(self) -> TopologyParts:
        """The nodes in tree order, every session's meta, the lineage and every session's
        user turns, in one read under the storage's lock (`Topology.read` on a backend
        without `topology_text`): three statements, the lineage and the turn counts in one
        pass over the sessions."""
        return self._txn.read(topology_parts())

    async def atopology_parts(self) -> TopologyParts:
        """Async twin of `topology_parts`."""
        return await self._txn.aread(topology_parts())

    def list_turn_counts(self) -> dict[str, int]:
        """Every session's user turns, by id, in one read: what a view of the tree shows
        beside each node, without `list_session_stats`' record counts."""
        return self._txn.read(_turn_counts())

    async def alist_turn_counts(self) -> dict[str, int]:
        """Async twin of `list_turn_counts`."""
        return await self._txn.aread(_turn_counts())

    def iter_session_l2s(self, *, batch: int = 1_000) -> Iterator[list[ChildL2]]:
        """The L2s of `get_all_session_l2s` (every active standard session that has one, in
        creation order), `batch` at a time: one read per page, the storage free between
        them. A session created while paging is included when it sorts after the page
        being read (they all do: creation order); the pages are not one snapshot.

        Raises:
            InvalidInputError: `batch` is not an int from 1 to 100,000 (raised at once).
        """
        return self._l2_pages(_batch(batch))

    def _l2_pages(self, batch: int) -> Iterator[list[ChildL2]]:
        after: int | None = 0
        while after is not None:
            rows: list[L2Row] = self._txn.read(one(StorageBackend.op_l2s_after, after, batch))
            after, page = _page(rows, batch)
            if page:
                yield page

    async def aiter_session_l2s(self, *, batch: int = 1_000) -> AsyncIterator[list[ChildL2]]:
        """Async twin of `iter_session_l2s` (a bad `batch` raises at the first step)."""
        size = _batch(batch)
        after: int | None = 0
        while after is not None:
            rows: list[L2Row] = await self._txn.aread(one(StorageBackend.op_l2s_after, after, size))
            after, page = _page(rows, size)
            if page:
                yield page

    def export_rows(self, part: ExportPart, sink: RowSink) -> int:
        """Hand `sink` every row of `part` (`"nodes"`, `"sessions"` or `"records"`, see
        `checkpoints.backend.ExportPart`), in the tree's depth-first pre-order, as the
        backend reads them (SQLite: one statement, no row kept); return how many.

        The storage's lock is held meanwhile: `sink` must not call the storage.

        Raises:
            InvalidInputError: an unknown `part`.
        """
        return self._txn.read(one(StorageBackend.op_export_rows, _part(part), sink))

    async def aexport_rows(self, part: ExportPart, sink: RowSink) -> int:
        """Async twin of `export_rows` (on SQLite `sink` runs in the storage's worker
        thread)."""
        return await self._txn.aread(one(StorageBackend.op_export_rows, _part(part), sink))
