"""The whole stored tree as JSON: `export_tree(storage)`, or streamed: `write_export`.

What `stello-graph export` prints, for your own backups, dashboards or tests.

`write_export` writes the same text as `json.dumps(export_tree(storage), indent=2,
ensure_ascii=False)` without building it: on a stello storage it reads each part of the tree
(nodes, then sessions, with their records when asked) in one pass each and writes every entry
as it is read, so its memory does not grow with the tree. `export_tree` builds the data from
the same reads.

Example:
    >>> import io, json
    >>> from stello_graph import StelloAgent, export_tree
    >>> from stello_graph.export import write_export
    >>> from stello_graph.testing import ScriptedChatModel
    >>> agent = StelloAgent(model=ScriptedChatModel(default="Noted."), storage=":memory:")
    >>> branch = agent.fork(agent.main_session_id, "Pricing")
    >>> data = export_tree(agent.storage)
    >>> [session["label"] for session in data["sessions"]][1:]
    ['Pricing']
    >>> data["format"], json.loads(json.dumps(data)) == data
    ('stello-graph.export/1', True)
    >>> out = io.StringIO()
    >>> write_export(agent.storage, out)  # returns the damaged sessions it marked
    {}
    >>> out.getvalue() == json.dumps(data, indent=2, ensure_ascii=False)
    True
"""

from __future__ import annotations

from typing import Any, TextIO, cast

from stello_graph._export_rows import (
    EXPORT_FORMAT,
    Entries,
    RowReader,
    head_of,
    row_entries,
    write_entries,
)
from stello_graph.storage import MainStorage

__all__ = ["EXPORT_FORMAT", "export_tree", "write_export"]


def _head(storage: MainStorage) -> dict[str, Any]:
    main = storage.get_main_session()
    return head_of(storage.tree_id, (main.id, storage.get_memory(main.id)) if main else None)


def export_tree(storage: MainStorage, *, records: bool = False) -> dict[str, Any]:
    """The tree of `storage` as JSON-serialisable data.

    Args:
        storage: the tree to export.
        records: also include every session's L3 records (LangChain message dicts).

    Returns:
        `{"format", "tree_id", "main_session_id", "synthesis", "nodes", "sessions"}`;
        each session holds its meta, `parent_id`, `turns`, `record_count`, `system_prompt`,
        `l2` and pending `insight` (and `records` when asked). Nodes and sessions are in the
        tree's depth-first order (`MainStorage.get_tree`).
    """
    return _gathered(storage, _entries(storage, records))


def write_export(
    storage: MainStorage, out: TextIO, *, records: bool = False
) -> dict[str, tuple[str, ...]]:
    """Write the export of `storage` to `out`: the text of `json.dumps(export_tree(storage,
    records=records), indent=2, ensure_ascii=False)`, written entry by entry as the tree is
    read (each part of it in one pass on a stello storage), so memory stays flat whatever
    the size of the tree. The storage's lock is held while a part is read.

    Args:
        storage: the tree to export.
        out: a text stream (a file, `sys.stdout`).
        records: also include every session's L3 records (LangChain message dicts; decoding
            them loads LangChain).

    Returns:
        The sessions of a damaged tree the export marks, by id: the columns of each it shows
        with stand-ins (`"damaged"`), `parent_id` for a node no root reaches (`"detached"`:
        its parents make a cycle). Empty for a sound tree.
    """
    return write_entries(_head(storage), _entries(storage, records), out)


def _entries(storage: MainStorage, records: bool) -> tuple[Entries, Entries]:
    """The node and session entries of the export, streamed from the storage's rows."""
    return row_entries(cast(RowReader, storage), records)


def _gathered(storage: MainStorage, lists: tuple[Entries, Entries]) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = []
    sessions: list[dict[str, Any]] = []
    lists[0](nodes.append)
    lists[1](sessions.append)
    return {**_head(storage), "nodes": nodes, "sessions": sessions}
