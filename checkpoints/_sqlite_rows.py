"""Whole-tree rows of a SQLite file, read without models: the streamed export's statements,
and `TreeRows`, a read-only snapshot of one tree for `stello-graph tree` and `export`.

`SqliteMainStorage.export_rows` and `TreeRows.export_rows` run the same statements
(`export_rows` here), so both give the same rows. This module imports neither pydantic nor
LangChain: a process that only prints a tree would otherwise spend most of its life importing
them. `TreeRows` reads only a file at the current schema version; an older one is read
through `SqliteMainStorage`, which brings it up to date first.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stello_graph.checkpoints import _schema
from stello_graph.checkpoints._damage import META, row_damage
from stello_graph.checkpoints._schema import ROWS, SESSIONS, read_version
from stello_graph.checkpoints._shared_l3 import (
    SharedPrefixes,
    drive_sqlite,
    export_statements,
    export_with_prefixes,
)
from stello_graph.checkpoints._sqlite_conn import (
    connect_read_only,
    quick_check,
    stream_rows,
)

if TYPE_CHECKING:
    from stello_graph.checkpoints.backend import ExportPart, RowSink

__all__ = ["SessionMark", "TreeRows", "export_rows"]

SessionMark = tuple[str, str, int, str | None, int | None, tuple[str, ...]]
"""What a printed tree shows of a session: id, status, user turns, its lineage
(`forked_from`, `forked_at_turn`), and the columns of its row that do not decode."""

EXPORT = export_statements(
    ":tree",
    "printf('%012d', {})",
    f"(SELECT COUNT(*) FROM {ROWS} c WHERE c.l3_key = s.l3_key)",
    f"LEFT JOIN {ROWS} r ON r.l3_key = s.l3_key",
)
"""The rows of each `ExportPart`, in the tree's depth-first pre-order."""


def export_rows(
    conn: sqlite3.Connection,
    where: str,
    shared: SharedPrefixes,
    part: ExportPart,
    sink: RowSink,
) -> int:
    """Hand `sink` every row of `part` of `shared.tree_id`'s tree, as it is read; how many.

    One statement steps through the rows as the sink takes them: only SQLite's sorter
    (bounded, spilling to a temporary file) holds the whole order. Shared fork prefixes are
    resolved (`export_with_prefixes`)."""

    def query(sql: str, params: Sequence[Any]) -> list[Any]:  # a whole-tree read
        return list(stream_rows(conn, sql, params, where))

    bases = drive_sqlite(shared.bases(), query) if part != "nodes" else {}
    count = 0
    with closing(stream_rows(conn, EXPORT[part], {"tree": shared.tree_id}, where)) as rows:
        for row in export_with_prefixes(
            part, rows, bases, lambda base: drive_sqlite(shared.inherited(base, "data"), query)
        ):
            sink(row)
            count += 1
    return count


class TreeRows:
    """One tree of a SQLite file, opened read-only in one read transaction, so every read
    sees the same snapshot of the file (WAL lets writers go on meanwhile).

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from stello_graph import StelloAgent
        >>> from stello_graph.testing import ScriptedChatModel
        >>> path = Path(tempfile.mkdtemp()) / "tree.db"
        >>> with StelloAgent(model=ScriptedChatModel(default="ok"), storage=path) as agent:
        ...     _ = agent.fork(agent.main_session_id, "Pricing")
        >>> with TreeRows.open(path, "default") as rows:
        ...     labels = []
        ...     rows.export_rows("nodes", lambda row: labels.append(row[2]))
        2
        >>> labels
        ['Main Session', 'Pricing']
    """

    def __init__(self, conn: sqlite3.Connection, tree_id: str, where: str) -> None:
        self._conn = conn
        self._shared = SharedPrefixes(tree_id)
        self._where = where

    @classmethod
    def open(cls, path: Path, tree_id: str) -> TreeRows | None:
        """The tree `tree_id` of the file at `path`, or `None` when it cannot be read this way:
        the file is not at the current schema version, or cannot be opened read-only (read it
        through `SqliteMainStorage`, which says why or brings it up to date)."""
        try:
            conn = connect_read_only(path)
        except sqlite3.Error:
            return None
        try:
            conn.isolation_level = None  # the transaction is this reader's, explicitly
            conn.execute("BEGIN")
            if read_version(conn) == _schema.SCHEMA_VERSION:
                return cls(conn, tree_id, repr(str(path)))
        except sqlite3.Error:
            pass
        conn.close()
        return None

    @property
    def tree_id(self) -> str:
        return self._shared.tree_id

    def close(self) -> None:
        """End the read transaction and close the file."""
        self._conn.close()

    def __enter__(self) -> TreeRows:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _query(self, sql: str, params: Sequence[Any] | Mapping[str, Any]) -> list[Any]:
        return list(stream_rows(self._conn, sql, params, self._where))

    def check(self) -> None:
        """SQLite's `PRAGMA quick_check` of the file.

        Raises:
            DamagedDataError: the file is damaged (the message says what was found).
        """
        quick_check(self._conn, self._where)

    def export_rows(self, part: ExportPart, sink: RowSink) -> int:
        """What `SqliteMainStorage.export_rows(part, sink)` gives on the same file."""
        return export_rows(self._conn, self._where, self._shared, part, sink)

    def main_session(self) -> tuple[str, str | None] | None:
        """The id and synthesis of the tree's main session (the first created), if any."""
        row = self._query(
            f"""SELECT id, memory FROM {SESSIONS} WHERE tree_id = ? AND role = 'main'
            ORDER BY created_seq LIMIT 1""",
            (self.tree_id,),
        )
        return None if not row else (row[0][0], row[0][1])

    def session_marks(self) -> list[SessionMark]:
        """Every session's `SessionMark`, in creation order."""
        rows = self._query(
            f"""SELECT id, status, turn_count, forked_from, forked_at_turn, {META}
            FROM {SESSIONS} WHERE tree_id = ? ORDER BY created_seq""",
            (self.tree_id,),
        )
        return [(*row[:5], row_damage(row[5:])) for row in rows]
