"""`stello-graph tree` and `stello-graph export`: read a stored tree, never change it."""

from __future__ import annotations

import argparse
from pathlib import Path

from stello_graph.cli._common import CliError, Console, open_tree
from stello_graph.export import EXPORT_FORMAT, export_tree, write_export
from stello_graph.topology import Topology

__all__ = ["EXPORT_FORMAT", "export_tree", "run_export", "run_tree"]


def _summary(tree: Topology) -> str:
    archived = sum(meta.status == "archived" for meta in tree.sessions.values())
    turns = sum(tree.turns.values())
    return f"{len(tree)} session(s), {archived} archived, {turns} turn(s)"


def run_tree(args: argparse.Namespace, console: Console) -> int:
    """Print the tree as text; with `--svg OUT`, also write its star map (`-`: stdout only)."""
    with open_tree(Path(args.db), args.tree_id) as storage:
        tree = Topology.read(storage)
    if args.svg == "-":
        console.write(tree.render_svg(size=args.size) + "\n")
        return 0
    console.say(tree.render_text() or "(empty tree)")
    console.say(_summary(tree))
    if args.svg:
        out = Path(args.svg)
        if not out.parent.is_dir():
            raise CliError(f"cannot write {args.svg!r}: no directory {str(out.parent)!r}.")
        out.write_text(tree.render_svg(size=args.size), encoding="utf-8")
        console.say(f"star map: {out}")
    return 0


def run_export(args: argparse.Namespace, console: Console) -> int:
    """Print the tree as JSON: nodes, sessions (meta, turns, L2, insight), the synthesis."""
    with open_tree(Path(args.db), args.tree_id) as storage:
        write_export(storage, console.stdout, records=args.records)  # streamed as it is read
    console.say()
    return 0
