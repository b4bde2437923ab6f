"""`stello-graph tree` and `stello-graph export`: read a stored tree, never change it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from stello_graph.cli._common import CliError, Console, open_tree
from stello_graph.storage import MainStorage
from stello_graph.topology import Topology

__all__ = ["EXPORT_FORMAT", "export_tree", "run_export", "run_tree"]

EXPORT_FORMAT = "stello-graph.export/1"
"""The `format` field of `stello-graph export` output; the number changes with its shape."""


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
        data = export_tree(storage, records=args.records)
    console.say(json.dumps(data, indent=2, ensure_ascii=False))
    return 0


def _session_entry(
    storage: MainStorage, tree: Topology, session_id: str, records: bool
) -> dict[str, Any]:
    meta = tree.sessions[session_id]
    entry: dict[str, Any] = meta.model_dump(mode="json")
    node = tree.node(session_id)
    entry["parent_id"] = node.parent_id if node else None
    entry["turns"] = tree.turns.get(session_id, 0)
    entry["record_count"] = storage.count_records(session_id)
    entry["system_prompt"] = storage.get_system_prompt(session_id)
    standard = meta.role == "standard"
    entry["l2"] = storage.get_memory(session_id) if standard else None
    entry["insight"] = storage.get_insight(session_id) if standard else None
    if records:
        from langchain_core.messages import messages_to_dict

        entry["records"] = messages_to_dict(storage.list_records(session_id))
    return entry


def export_tree(storage: MainStorage, *, records: bool = False) -> dict[str, Any]:
    """The tree of `storage` as JSON-serialisable data.

    Args:
        storage: the tree to export.
        records: also include every session's L3 records (LangChain message dicts).

    Returns:
        `{"format", "tree_id", "main_session_id", "synthesis", "nodes", "sessions"}`;
        each session holds its meta, `parent_id`, `turns`, `record_count`, `system_prompt`,
        `l2` and pending `insight` (and `records` when asked).
    """
    tree = Topology.read(storage)
    main = storage.get_main_session()
    return {
        "format": EXPORT_FORMAT,
        "tree_id": storage.tree_id,
        "main_session_id": main.id if main else None,
        "synthesis": storage.get_memory(main.id) if main else None,
        "nodes": [node.model_dump(mode="json") for node in tree.nodes],
        "sessions": [
            _session_entry(storage, tree, node.id, records)
            for node in tree.nodes
            if node.id in tree.sessions
        ],
    }
