"""`stello-graph tree` and `stello-graph export`: read a stored tree, never change its data
(a file of an older schema version is brought up to date first, as every open does).

A SQLite file at the current schema version is read through `TreeRows` (one read-only
snapshot, no model built, neither pydantic nor LangChain imported: the process is mostly
Python's own start); an older file, the star map and a PostgreSQL database go through the
storage (`open_storage`) and `Topology` / `write_export`.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stello_graph._export_rows import EXPORT_FORMAT, write_export_rows
from stello_graph._tree_text import NodeRow, marked_rows, tree_order, tree_text
from stello_graph.checkpoints import is_postgres_dsn
from stello_graph.checkpoints._damage import shown, undecodable
from stello_graph.checkpoints._sqlite_rows import TreeRows
from stello_graph.cli._common import CliError, Console, check_tree, open_storage
from stello_graph.lineage import ForkPoint

if TYPE_CHECKING:
    from stello_graph.checkpoints import BackendStorage

__all__ = ["EXPORT_FORMAT", "run_export", "run_tree"]


def _summary(sessions: int, archived: int, turns: int) -> str:
    return f"{sessions} session(s), {archived} archived, {turns} turn(s)"


def _printed(rows: TreeRows) -> tuple[str, str, dict[str, tuple[str, ...]]]:
    """The tree's text and summary line, as `Topology.read(storage)` gives them (a damaged
    tree's too: what does not decode, and nodes detached from a cycle, marked)."""
    nodes: list[NodeRow] = []
    unreached: list[bool] = []

    def take(row: tuple[Any, ...]) -> None:
        nodes.append(NodeRow(*row[:3]))
        unreached.append(bool(row[3]))

    rows.export_rows("nodes", take)
    damaged: dict[str, tuple[str, ...]] = {}
    if any(unreached) or any(undecodable(value) for node in nodes for value in node):
        detached: set[str] = set()
        nodes, damaged = marked_rows(tree_order(nodes, detached), detached)
    ids = {node.id for node in nodes}
    marks = [mark for mark in rows.session_marks() if shown(mark[0]) in ids]
    archived = {shown(sid) for sid, status, *_ in marks if status == "archived"}
    lineage = {
        shown(sid): ForkPoint(shown(sid), shown(source), at)
        for sid, _, _, source, at, _ in marks
        if source is not None
    }
    for sid, *_, bad in marks:
        if bad:
            key = shown(sid)
            damaged[key] = tuple(dict.fromkeys((*damaged.get(key, ()), *bad)))
    turns = sum(mark[2] for mark in marks)
    text = tree_text(nodes, archived, lineage, damaged)
    return text, _summary(len(nodes), len(archived), turns), damaged


def _warn_damaged(console: Console, damaged: Mapping[str, Sequence[str]], how: str) -> None:
    """Say on stderr that the output holds stand-ins for what does not decode."""
    if damaged:
        listed = ", ".join(f"{sid} ({', '.join(columns)})" for sid, columns in damaged.items())
        console.warning(
            f"{len(damaged)} session(s) of this tree are damaged, {how} marked (stand-ins "
            "for the columns that do not decode; parent_id: its parents make a cycle, shown "
            f"as a root): {listed}. Write their values again, or restore the file from a "
            "backup."
        )


def _rows(args: argparse.Namespace) -> TreeRows | None:
    """The fast reader of a SQLite file at the current schema version (`None`: read it
    through the storage); checks first that the file holds the tree."""
    if is_postgres_dsn(args.db):
        return None
    path = Path(args.db)
    check_tree(path, args.tree_id)
    return TreeRows.open(path, args.tree_id)


def _opened(args: argparse.Namespace) -> BackendStorage:
    """The storage of the tree, its pages checked first when it is a SQLite file."""
    from stello_graph.checkpoints import SqliteMainStorage  # the storage's models: pydantic

    storage, _ = open_storage(args.db, args.tree_id)
    if isinstance(storage, SqliteMainStorage):  # PRAGMA quick_check: SQLite's alone
        try:
            storage.check()
        except BaseException:
            storage.close()
            raise
    return storage


def run_tree(args: argparse.Namespace, console: Console) -> int:
    """Print the tree as text; with `--svg OUT`, also write its star map (`-`: stdout only)."""
    rows = None if args.svg else _rows(args)
    if rows is not None:
        with rows:
            rows.check()
            text, summary, damaged = _printed(rows)
        console.say(text or "(empty tree)")
        console.say(summary)
        _warn_damaged(console, damaged, "shown")
        return 0
    from stello_graph.topology import Topology  # builds models: pydantic

    with _opened(args) as storage:
        tree = Topology.read(storage)
        _warn_damaged(console, tree.damaged, "shown")
    if args.svg == "-":
        console.write(tree.render_svg(size=args.size) + "\n")
        return 0
    console.say(tree.render_text() or "(empty tree)")
    archived = sum(meta.status == "archived" for meta in tree.sessions.values())
    console.say(_summary(len(tree), archived, sum(tree.turns.values())))
    if args.svg:
        out = Path(args.svg)
        if not out.parent.is_dir():
            raise CliError(f"cannot write {args.svg!r}: no directory {str(out.parent)!r}.")
        out.write_text(tree.render_svg(size=args.size), encoding="utf-8")
        console.say(f"star map: {out}")
    return 0


def run_export(args: argparse.Namespace, console: Console) -> int:
    """Print the tree as JSON: nodes, sessions (meta, turns, L2, insight), the synthesis."""
    rows = _rows(args)
    if rows is not None:
        with rows:
            rows.check()
            damaged = write_export_rows(rows, console.stdout, records=args.records)
    else:
        from stello_graph.export import write_export  # the storage's models: pydantic

        with _opened(args) as storage:
            damaged = write_export(storage, console.stdout, records=args.records)
    console.say()
    _warn_damaged(console, damaged, "exported")
    return 0
