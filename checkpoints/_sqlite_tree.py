"""`SqliteMainStorage`'s whole-tree reads: every L2, every session's figures, digests, the
streamed export. Each is one statement whatever the tree's size (its plan uses the tree-scoped
indexes), with the shared fork prefixes resolved (`_shared_l3`)."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from stello_graph.checkpoints._rows import built, stats_from_row, stored_l2, stored_node
from stello_graph.checkpoints._schema import NODES, RECORDS, SESSIONS
from stello_graph.checkpoints._shared_l3 import (
    Lookup,
    SharedPrefixes,
    T,
    export_with_prefixes,
)
from stello_graph.checkpoints._shell import FIELDS
from stello_graph.digest import DigestRow
from stello_graph.models import (
    ChildL2,
    SessionStats,
    TopologyNode,
)

if TYPE_CHECKING:
    from stello_graph.checkpoints.backend import ExportPart, L2Row, RowSink


__all__ = ["SqliteTreeReads"]


class SqliteTreeReads:
    """The whole-tree read primitives of `SqliteMainStorage` (a base of it)."""

    tree_id: str
    _shared: SharedPrefixes

    if TYPE_CHECKING:

        def _q(
            self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()
        ) -> sqlite3.Cursor: ...

        def _run(self, steps: Lookup[T]) -> T: ...

    def op_l2s(self) -> list[ChildL2]:
        rows = self._q(
            f"""SELECT id, label, memory FROM {SESSIONS}
            WHERE tree_id = ? AND role = 'standard' AND status = 'active'
                AND memory IS NOT NULL
            ORDER BY created_seq""",
            (self.tree_id,),
        )
        return built(lambda row: stored_l2(*row), rows)

    def op_session_stats(self) -> list[SessionStats]:
        # Per session, through the records' primary key. A session's seqs are contiguous
        # (appends take `next_seq` on, a trim drops the oldest), so the records after the L2
        # cursor (a count from the first record) are those from MIN(seq) + memory_through on.
        rows = self._q(
            f"""SELECT s.id, s.label, s.role, s.status, s.updated_at, n.parent_id,
                n.id IS NOT NULL, s.turn_count,
                (SELECT COUNT(*) FROM {RECORDS} r
                    WHERE r.tree_id = s.tree_id AND r.session_id = s.id),
                s.memory_through,
                CASE WHEN s.memory_through >= s.next_seq THEN 0 -- no record after the cursor
                ELSE (SELECT COUNT(*) FROM {RECORDS} r
                    WHERE r.tree_id = s.tree_id AND r.session_id = s.id AND r.type = 'human'
                    AND r.seq >= s.memory_through + (SELECT MIN(f.seq) FROM {RECORDS} f
                        WHERE f.tree_id = s.tree_id AND f.session_id = s.id)) END,
                s.memory IS NOT NULL, s.insight IS NOT NULL, s.subtree_synthesis IS NOT NULL
            FROM {SESSIONS} s
            LEFT JOIN {NODES} n ON n.tree_id = s.tree_id AND n.id = s.id
            WHERE s.tree_id = ? ORDER BY s.created_seq""",
            (self.tree_id,),
        )
        patched = self._run(self._shared.patch(rows.fetchall(), 8, 10))
        return [stats_from_row(row) for row in patched]

    def op_all_fields(self, names: Sequence[str]) -> list[tuple[Any, ...]]:
        assert FIELDS.issuperset(names)
        columns = "".join(f", {name}" for name in names)
        sql = f"SELECT id{columns} FROM {SESSIONS} WHERE tree_id = ? ORDER BY created_seq"
        return [tuple(row) for row in self._q(sql, (self.tree_id,))]

    def op_digests(self) -> list[DigestRow]:
        # The records after the L2 cursor are those from MIN(seq) + memory_through on (see
        # `op_session_stats`); a session without records counts none.
        rows = self._q(
            f"""SELECT s.id, s.label, s.role, s.status, s.updated_at, n.parent_id,
                s.turn_count, s.memory,
                CASE WHEN s.memory_through >= s.next_seq THEN 0 -- no record after the cursor
                ELSE (SELECT COUNT(*) FROM {RECORDS} r
                    WHERE r.tree_id = s.tree_id AND r.session_id = s.id AND r.type = 'human'
                    AND r.seq >= s.memory_through + (SELECT MIN(f.seq) FROM {RECORDS} f
                        WHERE f.tree_id = s.tree_id AND f.session_id = s.id)) END,
                s.insight
            FROM {SESSIONS} s
            LEFT JOIN {NODES} n ON n.tree_id = s.tree_id AND n.id = s.id
            WHERE s.tree_id = ? ORDER BY s.created_seq""",
            (self.tree_id,),
        )
        return self._run(self._shared.patch(rows.fetchall(), None, 8))

    def op_l2s_after(self, after: int, limit: int) -> list[L2Row]:
        rows = self._q(
            f"""SELECT created_seq, id, label, memory FROM {SESSIONS}
            WHERE tree_id = ? AND role = 'standard' AND status = 'active'
                AND memory IS NOT NULL AND created_seq > ?
            ORDER BY created_seq LIMIT ?""",
            (self.tree_id, after, limit),
        )
        return rows.fetchall()

    def op_export_rows(self, part: ExportPart, sink: RowSink) -> int:
        # The cursor steps through the rows as the sink takes them: one statement, and only
        # SQLite's sorter (bounded, spilling to a temporary file) holds the whole order.
        bases = self._run(self._shared.bases()) if part != "nodes" else {}
        rows = self._q(_WALK + _EXPORT[part], {"tree": self.tree_id})
        count = 0
        for row in export_with_prefixes(part, rows, bases, self._inherited_data):
            sink(row)
            count += 1
        return count

    def _inherited_data(self, base: tuple[str, int]) -> list[tuple[Any, ...]]:
        return self._run(self._shared.inherited(base, "data"))

    def op_all_nodes(self) -> list[TopologyNode]:
        sql = f"SELECT id, parent_id, label FROM {NODES} WHERE tree_id = ? ORDER BY position"
        return built(stored_node, self._q(sql, (self.tree_id,)))


_WALK = f"""WITH RECURSIVE walk(id, path) AS (
    SELECT n.id, printf('%012d', n.position) FROM {NODES} n
    WHERE n.tree_id = :tree AND (n.parent_id IS NULL OR NOT EXISTS (
        SELECT 1 FROM {NODES} p WHERE p.tree_id = n.tree_id AND p.id = n.parent_id))
    UNION ALL
    SELECT c.id, w.path || printf('%012d', c.position)
    FROM walk w JOIN {NODES} c ON c.tree_id = :tree AND c.parent_id = w.id)
"""
"""Every node with its path of positions from its root: ordered by path, the tree's
depth-first pre-order (`_flows.tree_order`: a node whose parent is missing is a root)."""

_EXPORT: dict[str, str] = {
    "nodes": f"""SELECT n.id, n.parent_id, n.label
        FROM walk w JOIN {NODES} n ON n.tree_id = :tree AND n.id = w.id ORDER BY w.path""",
    "sessions": f"""SELECT s.id, s.label, s.role, s.status, s.tags, s.metadata, s.created_at,
            s.updated_at, n.parent_id, s.turn_count,
            (SELECT COUNT(*) FROM {RECORDS} r WHERE r.tree_id = s.tree_id AND r.session_id = s.id),
            s.system_prompt, s.memory, s.insight
        FROM walk w JOIN {NODES} n ON n.tree_id = :tree AND n.id = w.id
        JOIN {SESSIONS} s ON s.tree_id = :tree AND s.id = w.id ORDER BY w.path""",
    "records": f"""SELECT s.id, s.label, s.role, s.status, s.tags, s.metadata, s.created_at,
            s.updated_at, n.parent_id, s.turn_count,
            (SELECT COUNT(*) FROM {RECORDS} c WHERE c.tree_id = s.tree_id AND c.session_id = s.id),
            s.system_prompt, s.memory, s.insight, r.data
        FROM walk w JOIN {NODES} n ON n.tree_id = :tree AND n.id = w.id
        JOIN {SESSIONS} s ON s.tree_id = :tree AND s.id = w.id
        LEFT JOIN {RECORDS} r ON r.tree_id = :tree AND r.session_id = w.id
        ORDER BY w.path, r.seq""",
}
