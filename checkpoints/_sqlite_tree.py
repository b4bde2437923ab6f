"""`SqliteMainStorage`'s whole-tree reads: every L2, every session's figures, digests, the
streamed export. Each is one statement whatever the tree's size (its plan uses the tree-scoped
indexes), with the shared fork prefixes resolved (`_shared_l3`)."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from stello_graph._tree_text import TOPOLOGY_SESSION_COLUMNS, TopologyText
from stello_graph.checkpoints._rows import L2S_AFTER, stats_from_row
from stello_graph.checkpoints._schema import NODES, ROWS, SESSIONS
from stello_graph.checkpoints._shared_l3 import Lookup, SharedPrefixes, T, sqlite_marks
from stello_graph.checkpoints._shell import FIELDS
from stello_graph.checkpoints._sqlite_rows import export_rows
from stello_graph.digest import ROLE_CODE, STATUS_CODE, DigestRow
from stello_graph.errors import StorageError
from stello_graph.models import (
    SessionStats,
)

if TYPE_CHECKING:
    from stello_graph.checkpoints.backend import ExportPart, L2Row, RowSink


__all__ = ["SqliteTreeReads"]

_TOPOLOGY_TEXT = f"""SELECT
    (SELECT json_group_array(json_array(id, parent_id, label)) FROM (
        SELECT id, parent_id, label FROM {NODES} WHERE tree_id = :tree ORDER BY position)),
    (SELECT json_group_array(json_array({", ".join(TOPOLOGY_SESSION_COLUMNS)}))
        FROM {SESSIONS} WHERE tree_id = :tree)"""
_HUMANS_AFTER = f"""CASE WHEN s.memory_through >= s.next_seq THEN 0 -- no record after the cursor
    ELSE (SELECT COUNT(*) FROM {ROWS} r
        WHERE r.l3_key = s.l3_key AND r.type = 'human'
        AND r.seq >= s.memory_through + (SELECT MIN(f.seq) FROM {ROWS} f
            WHERE f.l3_key = s.l3_key)) END"""
"""A session's user records after its L2 cursor: a session's seqs are contiguous (appends
take `next_seq` on, a trim drops the oldest), so those from MIN(seq) + memory_through on."""


class SqliteTreeReads:
    """The whole-tree read primitives of `SqliteMainStorage` (a base of it)."""

    tree_id: str
    path: str
    _shared: SharedPrefixes
    _conn: sqlite3.Connection

    if TYPE_CHECKING:

        def _fetch(
            self,
            sql: str,
            params: Sequence[Any] | Mapping[str, Any] = (),
            session_id: str | None = None,
        ) -> list[Any]: ...

        def _run(self, steps: Lookup[T], session_id: str | None = None) -> T: ...

    def op_session_stats(self) -> list[SessionStats]:
        # Per session, through the records' primary key.
        rows = self._fetch(
            f"""SELECT s.id, s.label, s.role, s.status, s.updated_at, n.parent_id,
                n.id IS NOT NULL, s.turn_count,
                (SELECT COUNT(*) FROM {ROWS} r
                    WHERE r.l3_key = s.l3_key),
                s.memory_through, {_HUMANS_AFTER},
                s.memory IS NOT NULL, s.insight IS NOT NULL, s.subtree_synthesis IS NOT NULL
            FROM {SESSIONS} s
            LEFT JOIN {NODES} n ON n.tree_id = s.tree_id AND n.id = s.id
            WHERE s.tree_id = ? ORDER BY s.created_seq""",
            (self.tree_id,),
        )
        patched = self._run(self._shared.patch(rows, 8, 10))
        return [stats_from_row(row) for row in patched]

    def op_all_fields(self, names: Sequence[str]) -> list[tuple[Any, ...]]:
        assert FIELDS.issuperset(names)
        columns = "".join(f", {name}" for name in names)
        sql = f"SELECT id{columns} FROM {SESSIONS} WHERE tree_id = ? ORDER BY created_seq"
        return [tuple(row) for row in self._fetch(sql, (self.tree_id,))]

    def op_digests(self) -> list[DigestRow]:
        # A session without records counts none after its cursor. The parent is the row's
        # copy of its node's (`node_parent`, kept by the nodes' triggers): no join.
        rows = self._fetch(
            f"""SELECT s.id, s.label, {ROLE_CODE}, {STATUS_CODE}, s.updated_at, s.node_parent,
                s.turn_count, s.memory, {_HUMANS_AFTER}, s.insight
            FROM {SESSIONS} s WHERE s.tree_id = ? ORDER BY s.created_seq""",
            (self.tree_id,),
        )
        return self._run(self._shared.patch(rows, None, 8))

    def op_l2s_after(self, after: int, limit: int) -> list[L2Row]:
        rows: list[L2Row] = self._fetch(sqlite_marks(L2S_AFTER), (self.tree_id, after, limit))
        return rows

    def op_export_rows(self, part: ExportPart, sink: RowSink) -> int:
        return export_rows(self._conn, repr(self.path), self._shared, part, sink)

    def op_topology_text(self) -> TopologyText | None:
        # One statement, so one snapshot; the nodes' ordered subquery is not flattened into
        # an aggregate (SQLite keeps its ORDER BY), so they come in creation order. The
        # sessions come in the table's order (a scan: ordering them costs a third more).
        try:
            row = self._fetch(_TOPOLOGY_TEXT, {"tree": self.tree_id})[0]
        except StorageError as exc:
            if getattr(exc.__cause__, "sqlite_errorcode", None) == sqlite3.SQLITE_TOOBIG:
                return None  # longer than SQLite's longest value: `topology_parts` then
            raise
        return TopologyText(row[0], row[1])
