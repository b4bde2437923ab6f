"""The whole stored tree as JSON-serialisable data: `export_tree(storage)`.

What `stello-graph export` prints, for your own backups, dashboards or tests.

Example:
    >>> import json
    >>> from stello_graph import StelloAgent, export_tree
    >>> from stello_graph.testing import ScriptedChatModel
    >>> agent = StelloAgent(model=ScriptedChatModel(default="Noted."), storage=":memory:")
    >>> branch = agent.fork(agent.main_session_id, "Pricing")
    >>> data = export_tree(agent.storage)
    >>> [session["label"] for session in data["sessions"]][1:]
    ['Pricing']
    >>> data["format"], json.loads(json.dumps(data)) == data
    ('stello-graph.export/1', True)
"""

from __future__ import annotations

from typing import Any

from stello_graph.storage import MainStorage
from stello_graph.topology import Topology

__all__ = ["EXPORT_FORMAT", "export_tree"]

EXPORT_FORMAT = "stello-graph.export/1"
"""The `format` field of an export; the number changes with its shape."""


def _session_entry(
    storage: MainStorage,
    tree: Topology,
    session_id: str,
    records: bool,
    counts: dict[str, int] | None,
) -> dict[str, Any]:
    meta = tree.sessions[session_id]
    entry: dict[str, Any] = meta.model_dump(mode="json")
    node = tree.node(session_id)
    entry["parent_id"] = node.parent_id if node else None
    entry["turns"] = tree.turns.get(session_id, 0)
    found = None if counts is None else counts.get(session_id)
    entry["record_count"] = storage.count_records(session_id) if found is None else found
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
    stats = getattr(storage, "list_session_stats", None)  # every record count in one read
    counts = {s.id: s.records for s in stats()} if callable(stats) else None
    main = storage.get_main_session()
    return {
        "format": EXPORT_FORMAT,
        "tree_id": storage.tree_id,
        "main_session_id": main.id if main else None,
        "synthesis": storage.get_memory(main.id) if main else None,
        "nodes": [node.model_dump(mode="json") for node in tree.nodes],
        "sessions": [
            _session_entry(storage, tree, node.id, records, counts)
            for node in tree.nodes
            if node.id in tree.sessions
        ],
    }
