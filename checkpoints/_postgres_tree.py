"""The whole-tree reads of `PostgresMainStorage`, as statements (a base of `Statements`):
every L2, every session's figures, digests, the export. Each is one statement whatever the
tree's size, with the shared fork prefixes resolved (`_shared_l3`)."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

from stello_graph._tree_text import TOPOLOGY_SESSION_COLUMNS, TopologyText
from stello_graph.checkpoints._postgres_conn import Query, Steps, unescape_text
from stello_graph.checkpoints._postgres_schema import NODES, RECORDS, SESSIONS
from stello_graph.checkpoints._rows import L2S_AFTER, stats_from_row
from stello_graph.checkpoints._shared_l3 import (
    Lookup,
    SharedPrefixes,
    T,
    export_statements,
    export_with_prefixes,
)
from stello_graph.checkpoints._shell import FIELDS
from stello_graph.digest import DigestRow
from stello_graph.errors import InvalidInputError
from stello_graph.models import (
    SessionStats,
)

if TYPE_CHECKING:
    from stello_graph.checkpoints.backend import ExportPart, L2Row, RowSink

__all__ = ["TreeStatements", "checked_fields"]

_EXPORT = export_statements(
    "%s",
    "lpad({}::text, 12, '0')",
    f"(SELECT COUNT(*) FROM {RECORDS} c WHERE c.tree_id = s.tree_id AND c.session_id = s.id)",
    f"LEFT JOIN {RECORDS} r ON r.tree_id = %s AND r.session_id = w.id",
)

C = TypeVar("C", bound=Collection[str])

_TOPOLOGY_TEXT = f"""SELECT
    (SELECT COALESCE(json_agg(json_build_array(id, parent_id, label) ORDER BY position),
        '[]')::text FROM {NODES} WHERE tree_id = %s),
    (SELECT COALESCE(json_agg(json_build_array({", ".join(TOPOLOGY_SESSION_COLUMNS)})),
        '[]')::text FROM {SESSIONS} WHERE tree_id = %s)"""
_HUMANS_AFTER = f"""CASE WHEN s.memory_through >= s.next_seq THEN 0 -- no record after the cursor
    ELSE (SELECT COUNT(*) FROM {RECORDS} r
        WHERE r.tree_id = s.tree_id AND r.session_id = s.id AND r.type = 'human'
        AND r.seq >= s.memory_through + (SELECT MIN(f.seq) FROM {RECORDS} f
            WHERE f.tree_id = s.tree_id AND f.session_id = s.id)) END"""
"""As SQLite's: a session's seqs are contiguous, so the user records after the L2 cursor are
those from MIN(seq) + memory_through on."""


def checked_fields(names: C) -> C:
    """`names`, once each is known to be a per-session column (`FIELDS`): they go in SQL.

    Raises:
        InvalidInputError: one is not.
    """
    if not FIELDS.issuperset(names):
        raise InvalidInputError(f"Unknown session fields: {sorted(set(names) - FIELDS)}.")
    return names


def _unescaped(text: str) -> str:
    """A JSON text of rows with the texts `escape_text` stored read back (their marker is
    `\\u0001` in JSON: a text without it holds none)."""
    if "\\u0001" not in text:
        return text
    rows = [
        [unescape_text(v) if isinstance(v, str) else v for v in row] for row in json.loads(text)
    ]
    return json.dumps(rows, ensure_ascii=False)


class TreeStatements:
    """The whole-tree read primitives of one tree, and the driver of shared-prefix steps."""

    tree_id: str
    shared: SharedPrefixes

    @staticmethod
    def run(lookup: Lookup[T]) -> Steps[T]:
        """The shared-prefix statements of `lookup`, as steps of a primitive."""
        try:
            sql, params = next(lookup)
            while True:
                sql, params = lookup.send((yield Query(sql, params)).rows)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def l2s_after(self, after: int, limit: int) -> Steps[list[L2Row]]:
        rows = (yield Query(L2S_AFTER, (self.tree_id, after, limit))).rows
        return [cast("L2Row", tuple(row)) for row in rows]

    def export_rows(self, part: ExportPart, sink: RowSink) -> Steps[int]:
        # one statement; its rows arrive whole (no server-side cursor yet), then go one by one
        sql = _EXPORT[part]
        # every placeholder of the walk and of the part is the tree's id
        rows = [tuple(row) for row in (yield Query(sql, (self.tree_id,) * sql.count("%s"))).rows]
        bases = (yield from self.run(self.shared.bases())) if part != "nodes" else {}
        inherited: dict[tuple[str, int], list[tuple[Any, ...]]] = {}
        if part == "records":  # read here: the rows are handed over after the steps end
            for base in bases.values():
                inherited[base] = yield from self.run(self.shared.inherited(base, "data"))
        rows = list(export_with_prefixes(part, rows, bases, inherited.__getitem__))
        for row in rows:
            sink(row)
        return len(rows)

    def session_stats(self) -> Steps[list[SessionStats]]:
        rows = (
            yield Query(
                f"""SELECT s.id, s.label, s.role, s.status, s.updated_at, n.parent_id,
                    n.id IS NOT NULL, s.turn_count,
                    (SELECT COUNT(*) FROM {RECORDS} r
                        WHERE r.tree_id = s.tree_id AND r.session_id = s.id),
                    s.memory_through, {_HUMANS_AFTER}, s.memory IS NOT NULL, s.insight IS NOT NULL,
                    s.subtree_synthesis IS NOT NULL
                FROM {SESSIONS} s
                LEFT JOIN {NODES} n ON n.tree_id = s.tree_id AND n.id = s.id
                WHERE s.tree_id = %s ORDER BY s.created_seq""",
                (self.tree_id,),
            )
        ).rows
        rows = yield from self.run(self.shared.patch(rows, 8, 10))
        return [stats_from_row(row) for row in rows]

    def all_fields(self, names: Sequence[str]) -> Steps[list[tuple[Any, ...]]]:
        columns = "".join(f", {name}" for name in checked_fields(names))
        sql = f"SELECT id{columns} FROM {SESSIONS} WHERE tree_id = %s ORDER BY created_seq"
        rows = (yield Query(sql, (self.tree_id,))).rows
        return [tuple(row) for row in rows]

    def digests(self) -> Steps[list[DigestRow]]:
        rows = (
            yield Query(
                f"""SELECT s.id, s.label, s.role, s.status, s.updated_at, n.parent_id,
                    s.turn_count, s.memory, {_HUMANS_AFTER}, s.insight
                FROM {SESSIONS} s
                LEFT JOIN {NODES} n ON n.tree_id = s.tree_id AND n.id = s.id
                WHERE s.tree_id = %s ORDER BY s.created_seq""",
                (self.tree_id,),
            )
        ).rows
        rows = yield from self.run(self.shared.patch(rows, None, 8))
        return [cast("DigestRow", tuple(row)) for row in rows]

    def topology_text(self) -> Steps[TopologyText]:
        # One statement, so one snapshot; `json` keeps the order `json_agg` was given.
        row = (yield Query(_TOPOLOGY_TEXT, (self.tree_id, self.tree_id))).rows[0]
        return TopologyText(_unescaped(row[0]), _unescaped(row[1]))
