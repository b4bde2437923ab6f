"""`stello-graph tree` and `stello-graph export`: read a stored tree, never change its data
(a file of an older schema version is brought up to date first, as every open does).

A file at the current schema version is read through `TreeRows` (one read-only snapshot, no
model built, neither pydantic nor LangChain imported: the process is mostly Python's own
start); an older file, and the star map, go through `SqliteMainStorage` and `Topology`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from stello_graph._export_rows import EXPORT_FORMAT, write_export_rows
from stello_graph._tree_text import NodeRow, tree_text
from stello_graph.checkpoints._sqlite_rows import TreeRows
from stello_graph.cli._common import CliError, Console, check_tree, open_tree
from stello_graph.lineage import ForkPoint

__all__ = ["EXPORT_FORMAT", "run_export", "run_tree"]


def _summary(sessions: int, archived: int, turns: int) -> str:
    return f"{sessions} session(s), {archived} archived, {turns} turn(s)"


def _printed(rows: TreeRows) -> tuple[str, str]:
    """The tree's text and summary line, as `Topology.read(storage)` gives them."""
    nodes: list[NodeRow] = []
    rows.export_rows("nodes", lambda row: nodes.append(NodeRow(*row)))
    ids = {node.id for node in nodes}
    marks = [mark for mark in rows.session_marks() if mark[0] in ids]
    archived = {sid for sid, status, *_ in marks if status == "archived"}
    lineage = {
        sid: ForkPoint(sid, source, at) for sid, _, _, source, at in marks if source is not None
    }
    turns = sum(mark[2] for mark in marks)
    return tree_text(nodes, archived, lineage), _summary(len(nodes), len(archived), turns)


def run_tree(args: argparse.Namespace, console: Console) -> int:
    """Print the tree as text; with `--svg OUT`, also write its star map (`-`: stdout only)."""
    path = Path(args.db)
    check_tree(path, args.tree_id)
    rows = None if args.svg else TreeRows.open(path, args.tree_id)
    if rows is not None:
        with rows:
            text, summary = _printed(rows)
        console.say(text or "(empty tree)")
        console.say(summary)
        return 0
    from stello_graph.topology import Topology  # builds models: pydantic

    with open_tree(path, args.tree_id) as storage:
        tree = Topology.read(storage)
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
    path = Path(args.db)
    check_tree(path, args.tree_id)
    rows = TreeRows.open(path, args.tree_id)
    if rows is not None:
        with rows:
            write_export_rows(rows, console.stdout, records=args.records)
    else:
        from stello_graph.export import write_export  # the storage's models: pydantic

        with open_tree(path, args.tree_id) as storage:
            write_export(storage, console.stdout, records=args.records)  # streamed as read
    console.say()
    return 0
