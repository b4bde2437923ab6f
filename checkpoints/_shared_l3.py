"""Shared L3 prefixes: a fork that points at its source's records instead of copying them.

A session's L3 is, in append order, the first `base_count` records of the L3 of session
`base_id` (itself possibly a shared prefix, through any number of generations), then the
session's own rows. A fork that inherits its source's records unchanged writes no record
row: it sets `base_id` / `base_count` on its (still empty) session row, so it costs the same
whatever the length of the inherited history (`op_copy_records` on SQLite and PostgreSQL).
The child's own rows start at seq `base_count`, so a record's index in the whole L3 is its
seq while the prefix is shared.

Invariants (what keeps every read exact):

* The rows a prefix points at never change while it points at them. Appends to the source
  land after the cut and are not seen. The two writes that would change rows below a cut
  materialise the dependent children first (copy the inherited rows into them, seqs
  `0..base_count-1`, then clear `base_id`): dropping the oldest records of a session (a trim)
  and deleting a session. So trims, compressions and removals of a source cost a copy per
  dependent child once, and a fork costs nothing in rows; a session that trims its own
  shared prefix is materialised first too.
* A child never points at a session through a prefix the session itself only borrows: a cut
  inside the source's own shared prefix points at the source's base instead (`plan`), so a
  chain is as long as the number of generations that added records of their own.
* `base_id` is not a foreign key: the rows it points at are kept alive by materialising, not
  by the database.

The statements are written once for both SQL backends: the functions here are generators
that yield `(sql, params)` with `%s` placeholders and are sent the rows of each, driven by
SQLite's storage (placeholders turned to `?`) and PostgreSQL's steps alike.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any, TypeVar

from stello_graph.checkpoints._schema import RECORDS, SESSIONS

__all__ = [
    "Lookup",
    "drive_sqlite",
    "export_statements",
    "export_with_prefixes",
    "sqlite_marks",
    "Segment",
    "SharedPrefixes",
]

T = TypeVar("T")

Lookup = Generator[tuple[str, tuple[Any, ...]], list[tuple[Any, ...]], T]
"""A generator of statements: yields `(sql, params)`, is sent the rows, returns a value."""

_CHUNK = 500
"""Ids per statement when looking for dependents (SQLite binds at most 32,766 parameters)."""

Segment = tuple[str, int | None]
"""`(holder, count)`: the first `count` own rows of session `holder` (`None`: all of them)."""


class SharedPrefixes:
    """The shared-prefix statements of one tree (both backends name their tables alike)."""

    def __init__(self, tree_id: str) -> None:
        self.tree_id = tree_id

    def base(self, session_id: str) -> Lookup[tuple[str | None, int] | None]:
        """`(base_id, base_count)` of the session, or `None` when it is missing."""
        sql = f"SELECT base_id, base_count FROM {SESSIONS} WHERE tree_id = %s AND id = %s"
        rows = yield sql, (self.tree_id, session_id)
        return None if not rows else (rows[0][0], int(rows[0][1] or 0))

    def holder(
        self, session_id: str, count: int
    ) -> Lookup[tuple[str, tuple[str | None, int] | None]]:
        """The deepest session whose L3 starts with the first `count` records of the
        session's and holds some of them itself (a cut inside a session's own shared prefix
        is its base's), with its `base`."""
        while True:
            found = yield from self.base(session_id)
            if found is None or found[0] is None or count > found[1]:
                return session_id, found
            session_id = found[0]

    def prefix(self, holder: str, count: int) -> Lookup[list[Segment]]:
        """The segments that make the first `count` records of `holder`'s L3."""
        segments: list[Segment] = []  # built from the end
        while count > 0:
            holder, found = yield from self.holder(holder, count)
            if found is None:  # cannot happen while the invariants hold
                break
            base_id, base_count = found
            segments.append((holder, count - base_count if base_id is not None else count))
            if base_id is None:
                break
            holder, count = base_id, base_count
        segments.reverse()
        return segments

    def plan(self, session_id: str, base: tuple[str | None, int]) -> Lookup[list[Segment]]:
        """Every segment of the session's L3 (`base`: its `(base_id, base_count)`), the
        session's own rows last."""
        base_id, base_count = base
        segments = [] if base_id is None else (yield from self.prefix(base_id, base_count))
        segments.append((session_id, None))
        return segments

    def fork(
        self, source_id: str, target_id: str, count: int, first: int, empty: bool
    ) -> Lookup[None]:
        """Give the target the first `count` records of the source after its own: shared when
        the target is `empty` (a fresh fork: no row written), else copied inside the database
        with seqs from `first` (its `next_seq`) on, stored form and turns kept. A shared cut
        points at the deepest session that holds those rows itself."""
        if empty:
            holder, _ = yield from self.holder(source_id, count)
            yield (
                f"""UPDATE {SESSIONS} SET base_id = %s, base_count = %s, next_seq = %s
                WHERE tree_id = %s AND id = %s""",
                (holder, count, count, self.tree_id, target_id),
            )
            return
        segments = yield from self.prefix(source_id, count)
        copied = yield from self.copy_rows(target_id, segments, first)
        yield (
            f"UPDATE {SESSIONS} SET next_seq = %s WHERE tree_id = %s AND id = %s",
            (first + copied, self.tree_id, target_id),
        )

    def read(self, segments: list[Segment], columns: str) -> Lookup[list[tuple[Any, ...]]]:
        """The columns of the rows of `segments`, in append order."""
        rows: list[tuple[Any, ...]] = []
        for holder, count in segments:
            cut, bound = ("", ()) if count is None else (" LIMIT %s", (count,))
            found = yield (
                f"""SELECT {columns} FROM {RECORDS}
                WHERE tree_id = %s AND session_id = %s ORDER BY seq{cut}""",
                (self.tree_id, holder, *bound),
            )
            rows.extend(found)
        return rows

    def rows(self, session_id: str, columns: str) -> Lookup[list[tuple[Any, ...]] | None]:
        """The columns of every record of the session's L3, in order (`None`: missing)."""
        found = yield from self.base(session_id)
        if found is None:
            return None
        return (yield from self.read((yield from self.plan(session_id, found)), columns))

    def bases(self) -> Lookup[dict[str, tuple[str, int]]]:
        """`(base_id, base_count)` of every session of the tree that shares a prefix."""
        rows = yield (
            f"""SELECT id, base_id, base_count FROM {SESSIONS}
            WHERE tree_id = %s AND base_id IS NOT NULL""",
            (self.tree_id,),
        )
        return {row[0]: (row[1], int(row[2] or 0)) for row in rows}

    def inherited(self, base: tuple[str, int], columns: str) -> Lookup[list[tuple[Any, ...]]]:
        """The columns of the records a session with `base` inherits, in append order."""
        return (yield from self.read((yield from self.prefix(*base)), columns))

    def has_turn(self, prefix: list[Segment], turn_id: str) -> Lookup[bool]:
        """Whether a record of the shared segments was written by the turn `turn_id`."""
        for holder, count in prefix:
            segment, params = self._segment(holder, count)
            if (yield f"SELECT 1 {segment} AND r.turn_id = %s LIMIT 1", (*params, turn_id)):
                return True
        return False

    def _segment(self, holder: str, count: int | None) -> tuple[str, tuple[Any, ...]]:
        """The `FROM ... WHERE` of a segment's rows `r` (`m.low`: the holder's first seq), and
        its parameters."""
        cut, bound = ("", ()) if count is None else (" AND r.seq < m.low + %s", (count,))
        sql = f"""FROM {RECORDS} r, (SELECT MIN(seq) AS low FROM {RECORDS}
            WHERE tree_id = %s AND session_id = %s) m
            WHERE r.tree_id = %s AND r.session_id = %s{cut}"""
        return sql, (self.tree_id, holder, self.tree_id, holder, *bound)

    def humans_from(self, session_id: str, start: int) -> Lookup[tuple[int, int]]:
        """`(records, user records at index >= start)` of the session's whole L3."""
        found = yield from self.base(session_id)
        if found is None:
            return 0, 0
        total = humans = 0
        for holder, count in (yield from self.plan(session_id, found)):
            segment, params = self._segment(holder, count)
            rows = yield (
                f"""SELECT COUNT(*), COALESCE(SUM(CASE WHEN r.type = 'human'
                    AND r.seq >= m.low + %s THEN 1 ELSE 0 END), 0) {segment}""",
                (max(0, start - total), *params),
            )
            size, users = rows[0]
            total += int(size)
            humans += int(users)
        return total, humans

    def patch(self, rows: list[Any], records: int | None, humans: int) -> Lookup[list[Any]]:
        """Stats or digest rows (`id` first) with the figures of the sessions that share a
        prefix counted over their whole L3 (a one-pass query counts their own rows only):
        the column `records` (the record count; `None`: no such column) and `humans` (the
        user records after the L2 cursor).

        One statement covers every session whose prefix is held by an unshared session (one
        generation: the usual case, since a cut inside a shared prefix points at its holder);
        deeper chains are counted segment by segment."""
        shared = yield (
            f"""SELECT s.id, b.base_id IS NULL, s.memory_through,
                s.base_count + (SELECT COUNT(*) FROM {RECORDS} o
                    WHERE o.tree_id = s.tree_id AND o.session_id = s.id),
                (SELECT COUNT(*) FROM {RECORDS} o
                    WHERE o.tree_id = s.tree_id AND o.session_id = s.id AND o.type = 'human'
                    AND o.seq >= COALESCE(s.memory_through, 0))
                + (SELECT COUNT(*) FROM {RECORDS} h, (SELECT MIN(f.seq) AS low FROM {RECORDS} f
                        WHERE f.tree_id = s.tree_id AND f.session_id = s.base_id) m
                    WHERE h.tree_id = s.tree_id AND h.session_id = s.base_id
                    AND h.type = 'human' AND h.seq >= m.low + COALESCE(s.memory_through, 0)
                    AND h.seq < m.low + s.base_count)
            FROM {SESSIONS} s LEFT JOIN {SESSIONS} b ON b.tree_id = s.tree_id AND b.id = s.base_id
            WHERE s.tree_id = %s AND s.base_id IS NOT NULL""",
            (self.tree_id,),
        )
        if not shared:
            return rows
        figures: dict[str, tuple[int, int]] = {}
        for sid, flat, through, total, users in shared:
            if flat:
                figures[sid] = (int(total), int(users))
            else:
                figures[sid] = yield from self.humans_from(sid, int(through or 0))
        patched: list[Any] = []
        for row in rows:
            if row[0] in figures:
                total, users = figures[row[0]]
                values = list(row)
                values[humans] = users
                if records is not None:
                    values[records] = total
                row = tuple(values)
            patched.append(row)
        return patched

    def dependents(self, session_ids: list[str]) -> Lookup[list[str]]:
        """The sessions, outside `session_ids`, whose shared prefix points at one of them."""
        wanted, found = set(session_ids), list[str]()
        for start in range(0, len(session_ids), _CHUNK):  # a bounded number of parameters
            chunk = session_ids[start : start + _CHUNK]
            marks = ", ".join(["%s"] * len(chunk))
            rows = yield (
                f"""SELECT id FROM {SESSIONS}
                WHERE tree_id = %s AND base_id IN ({marks})""",
                (self.tree_id, *chunk),
            )
            found.extend(row[0] for row in rows if row[0] not in wanted)
        return found

    def copy_rows(self, target_id: str, segments: list[Segment], first: int) -> Lookup[int]:
        """Insert the rows of `segments` into the target, with seqs from `first` on, each
        keeping its stored form and turn; return how many."""
        offset = first
        for holder, count in segments:
            segment, params = self._segment(holder, count)
            yield (
                f"""INSERT INTO {RECORDS}
                    (tree_id, session_id, seq, type, data, created_at, turn_id, turn_seq)
                SELECT r.tree_id, %s, %s + r.seq - m.low, r.type, r.data, r.created_at,
                    r.turn_id, r.turn_seq {segment}""",
                (target_id, offset, *params),
            )
            counted = yield (
                f"SELECT COUNT(*) FROM {RECORDS} WHERE tree_id = %s AND session_id = %s",
                (self.tree_id, holder),
            )
            offset += int(counted[0][0]) if count is None else count
        return offset - first

    def materialise(self, session_id: str) -> Lookup[None]:
        """Copy the session's shared prefix, if any, into rows of its own (seqs
        `0..base_count-1`, stored form and turns kept) and clear its `base_id`."""
        base_id, base_count = (yield from self.base(session_id)) or (None, 0)
        if base_id is None:
            return
        yield from self.copy_rows(session_id, (yield from self.prefix(base_id, base_count)), 0)
        yield (
            f"""UPDATE {SESSIONS} SET base_id = NULL, base_count = 0
            WHERE tree_id = %s AND id = %s""",
            (self.tree_id, session_id),
        )

    def release(self, session_ids: list[str]) -> Lookup[None]:
        """Before the rows of `session_ids` change below a cut (a trim) or go (a deletion):
        materialise every other session whose prefix points at them."""
        for dependent in (yield from self.dependents(session_ids)):
            yield from self.materialise(dependent)


EXPORT_RECORD_COUNT = 10
"""The column of an export row (`sessions` and `records` parts) holding the record count."""
EXPORT_DATA = 14
"""The column of a `records` export row holding a record's stored form (NULL: no record)."""


def export_statements(tree: str, pad: str, counted: str, records: str) -> dict[str, str]:
    """The statement of each `ExportPart`, in the tree's depth-first pre-order, for one SQL
    backend: `tree` is the placeholder of the tree's id, `pad` the text of a position (`{}`)
    that sorts as its number, `counted` a session's record count and `records` the join of
    its records (`r`). A node's row ends with whether it is detached.

    Ordered by path (a node's positions from its root), the nodes come in depth-first
    pre-order (`_flows.tree_order`: a node whose parent is missing is a root); those no root
    reaches (their parents make a cycle: a damaged tree) come after, `detached`, in creation
    order."""
    walk = f"""WITH RECURSIVE walk(id, path) AS (
    SELECT n.id, {pad.format("n.position")} FROM stello_nodes n
    WHERE n.tree_id = {tree} AND (n.parent_id IS NULL OR NOT EXISTS (
        SELECT 1 FROM stello_nodes p WHERE p.tree_id = n.tree_id AND p.id = n.parent_id))
    UNION ALL
    SELECT c.id, w.path || {pad.format("c.position")}
    FROM walk w JOIN stello_nodes c ON c.tree_id = {tree} AND c.parent_id = w.id),
every(id, path, detached) AS (
    SELECT id, path, 0 FROM walk
    UNION ALL
    SELECT n.id, {pad.format("n.position")}, 1 FROM stello_nodes n
    WHERE n.tree_id = {tree} AND n.id NOT IN (SELECT id FROM walk))
"""
    nodes = f"FROM every w JOIN stello_nodes n ON n.tree_id = {tree} AND n.id = w.id"
    sessions = f"""SELECT s.id, s.label, s.role, s.status, s.tags, s.metadata, s.created_at,
            s.updated_at, n.parent_id, s.turn_count, {counted}, s.system_prompt, s.memory,
            s.insight"""
    joined = f"{nodes} JOIN stello_sessions s ON s.tree_id = {tree} AND s.id = w.id"
    return {
        "nodes": f"{walk}SELECT n.id, n.parent_id, n.label, w.detached {nodes} "
        "ORDER BY w.detached, w.path",
        "sessions": f"{walk}{sessions} {joined} ORDER BY w.detached, w.path",
        "records": f"{walk}{sessions}, r.data {joined} {records} "
        "ORDER BY w.detached, w.path, r.seq",
    }


def export_with_prefixes(
    part: str,
    rows: Iterable[tuple[Any, ...]],
    bases: dict[str, tuple[str, int]],
    inherited: Callable[[tuple[str, int]], list[tuple[Any, ...]]],
) -> Iterator[tuple[Any, ...]]:
    """Export rows (`_EXPORT` of either SQL backend, the session id first) with the shared
    prefixes resolved: a sharing session's record count includes what it inherits, and in the
    `records` part its inherited records (`inherited(base)`, rows of one column: the stored
    form) come before its own rows, in place of the NULL row of a session without own rows."""
    if not bases:  # the `nodes` part is given none
        yield from rows
        return
    current: str | None = None
    for row in rows:
        base = bases.get(row[0])
        if base is None:
            yield row
            continue
        patched = list(row)
        patched[EXPORT_RECORD_COUNT] = int(row[EXPORT_RECORD_COUNT]) + base[1]
        if part != "records":
            yield tuple(patched)
            continue
        if row[0] != current:  # the session's first row: its inherited records come first
            current = row[0]
            found = inherited(base)
            for (data,) in found:
                yield (*patched[:EXPORT_DATA], data)
            if found and row[EXPORT_DATA] is None:
                continue
        yield tuple(patched)


def sqlite_marks(sql: str) -> str:
    """A statement written for both SQL backends (here, `_rows`), with SQLite's placeholders."""
    return sql.replace("%s", "?")


def drive_sqlite(steps: Lookup[T], run: Any) -> T:
    """Run `steps` with `run(sql, params) -> rows` (placeholders turned to SQLite's `?`)."""
    try:
        sql, params = next(steps)
        while True:
            sql, params = steps.send(run(sqlite_marks(sql), params))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
