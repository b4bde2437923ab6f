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
    >>> write_export(agent.storage, out)
    >>> out.getvalue() == json.dumps(data, indent=2, ensure_ascii=False)
    True
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC
from typing import TYPE_CHECKING, Any, Protocol, TextIO

if TYPE_CHECKING:  # not at run time: `stello-graph export` writes a tree without pydantic
    from stello_graph.checkpoints._sqlite_rows import TreeRows
    from stello_graph.checkpoints.backend import ExportPart, RowSink
    from stello_graph.storage import MainStorage
    from stello_graph.topology import Topology

__all__ = ["EXPORT_FORMAT", "export_tree", "write_export"]

EXPORT_FORMAT = "stello-graph.export/1"
"""The `format` field of an export; the number changes with its shape."""

_ITEM = "\n    "
"""What comes before each line of a list item: the items of the export's two lists sit at the
second level of `json.dumps(..., indent=2)`."""


class _RowReader(Protocol):
    """A storage that streams the rows of a tree part (every stello storage)."""

    def export_rows(self, part: ExportPart, sink: RowSink) -> int: ...


def _json_time(text: str) -> str:
    """A stored timestamp as `SessionMeta.model_dump(mode="json")` writes it (UTC, `Z`)."""
    if text.endswith("+00:00"):  # as `_serde.to_iso` writes every one
        return text[:-6] + "Z"
    from stello_graph.checkpoints._serde import from_iso

    return from_iso(text).astimezone(UTC).isoformat().replace("+00:00", "Z")


def _entry(row: tuple[Any, ...]) -> dict[str, Any]:
    """The export entry of a session row (`ExportPart` `"sessions"`), without records."""
    sid, label, role, status, tags, metadata, created, updated = row[:8]
    parent_id, turns, record_count, system_prompt, memory, insight = row[8:14]
    standard = role == "standard"
    return {
        "id": sid,
        "label": label,
        "role": role,
        "status": status,
        "tags": [] if tags == "[]" else json.loads(tags),
        "metadata": {} if metadata == "{}" else json.loads(metadata),
        "created_at": _json_time(created),
        "updated_at": _json_time(updated),
        "parent_id": parent_id,
        "turns": turns,
        "record_count": record_count,
        "system_prompt": system_prompt,
        "l2": memory if standard else None,
        "insight": insight if standard else None,
    }


def _record_dict(data: str) -> dict[str, Any]:
    """A stored record as `messages_to_dict` gives it (the message decoded: LangChain)."""
    from langchain_core.messages import message_to_dict

    from stello_graph.checkpoints._serde import decode_message

    return message_to_dict(decode_message(data))


def _session_rows(
    reader: _RowReader, records: bool, emit: Callable[[dict[str, Any]], None]
) -> None:
    """`emit` every session entry in tree order, with its records when asked (one pass)."""
    if not records:
        reader.export_rows("sessions", lambda row: emit(_entry(row)))
        return
    held: list[dict[str, Any]] = []  # the entry being filled: one session's records at most

    def take(row: tuple[Any, ...]) -> None:
        if held and held[0]["id"] != row[0]:
            emit(held.pop())
        if not held:
            held.append({**_entry(row), "records": []})
        if row[14] is not None:
            held[0]["records"].append(_record_dict(row[14]))

    reader.export_rows("records", take)
    if held:
        emit(held.pop())


def _node_entry(row: tuple[Any, ...]) -> dict[str, Any]:
    return {"id": row[0], "parent_id": row[1], "label": row[2]}


def _head(storage: MainStorage) -> dict[str, Any]:
    main = storage.get_main_session()
    return _head_of(storage.tree_id, (main.id, storage.get_memory(main.id)) if main else None)


def _head_of(tree_id: str, main: tuple[str, str | None] | None) -> dict[str, Any]:
    """The export's first members, from the main session's id and synthesis."""
    return {
        "format": EXPORT_FORMAT,
        "tree_id": tree_id,
        "main_session_id": main[0] if main else None,
        "synthesis": main[1] if main else None,
    }


def _streams(storage: MainStorage) -> _RowReader | None:
    return storage if callable(getattr(storage, "export_rows", None)) else None  # type: ignore[return-value]


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
    reader = _streams(storage)
    if reader is None:
        return _export_by_session(storage, records)
    nodes: list[dict[str, Any]] = []
    sessions: list[dict[str, Any]] = []
    reader.export_rows("nodes", lambda row: nodes.append(_node_entry(row)))
    _session_rows(reader, records, sessions.append)
    return {**_head(storage), "nodes": nodes, "sessions": sessions}


def write_export(storage: MainStorage, out: TextIO, *, records: bool = False) -> None:
    """Write the export of `storage` to `out`: the text of `json.dumps(export_tree(storage,
    records=records), indent=2, ensure_ascii=False)`, written entry by entry as the tree is
    read (each part of it in one pass on a stello storage), so memory stays flat whatever
    the size of the tree. The storage's lock is held while a part is read.

    Args:
        storage: the tree to export.
        out: a text stream (a file, `sys.stdout`).
        records: also include every session's L3 records (LangChain message dicts; decoding
            them loads LangChain).
    """
    reader = _streams(storage)
    if reader is None:
        out.write(json.dumps(export_tree(storage, records=records), indent=2, ensure_ascii=False))
        return
    _write_rows(reader, _head(storage), out, records)


def write_export_rows(rows: TreeRows, out: TextIO, *, records: bool = False) -> None:
    """What `write_export` writes for the storage of the same SQLite file, read from `rows`
    (one snapshot, no model built: what `stello-graph export` runs)."""
    _write_rows(rows, _head_of(rows.tree_id, rows.main_session()), out, records)


def _write_rows(reader: _RowReader, head: dict[str, Any], out: TextIO, records: bool) -> None:
    text = json.dumps(head, indent=2, ensure_ascii=False)
    out.write(text[:-2] + ',\n  "nodes": ')  # the head's members, without its closing brace
    _write_list(out, lambda emit: reader.export_rows("nodes", lambda r: emit(_node_entry(r))))
    out.write(',\n  "sessions": ')
    _write_list(out, lambda emit: _session_rows(reader, records, emit))
    out.write("\n}")


def _write_list(out: TextIO, produce: Callable[[Callable[[dict[str, Any]], None]], object]) -> None:
    """Write the items `produce` emits as a JSON list at the second level of indentation."""
    first = [True]

    def emit(item: dict[str, Any]) -> None:
        text = _dumps_entry(item).replace("\n", _ITEM)
        out.write(("[" if first[0] else ",") + _ITEM + text)
        first[0] = False

    produce(emit)
    out.write("[]" if first[0] else "\n  ]")


_ENCODE = json.JSONEncoder(ensure_ascii=False).encode
"""One encoder for every scalar (`json.dumps` with options builds a new one per call)."""


def _scalar(value: object) -> str:
    if value is None:
        return "null"
    if type(value) is int:
        return str(value)
    return _ENCODE(value)


def _dumps_entry(entry: dict[str, Any]) -> str:
    """`json.dumps(entry, indent=2, ensure_ascii=False)` of a flat entry (a node, a session).

    Built member by member: `json.dumps` with `indent` leaves ~30 objects in reference cycles
    per call, which pile up between the collector's full passes (the heap then grows with the
    tree); scalars and empty values need no indenting encoder, so most entries leave none.
    """
    members = []
    for key, value in entry.items():
        if isinstance(value, (dict, list)) and value:
            text = json.dumps(value, indent=2, ensure_ascii=False).replace("\n", "\n  ")
        elif isinstance(value, (dict, list)):
            text = "{}" if isinstance(value, dict) else "[]"
        else:
            text = _scalar(value)
        members.append(f"  {_ENCODE(key)}: {text}")
    return "{\n" + ",\n".join(members) + "\n}" if members else "{}"


# -- a storage without `export_rows`: one read per session --------------------------------
def _export_by_session(storage: MainStorage, records: bool) -> dict[str, Any]:
    from stello_graph.topology import Topology

    tree = Topology.read(storage)
    return {
        **_head(storage),
        "nodes": [node.model_dump(mode="json") for node in tree.nodes],
        "sessions": list(_entries_by_session(storage, tree, records)),
    }


def _entries_by_session(
    storage: MainStorage, tree: Topology, records: bool
) -> Iterator[dict[str, Any]]:
    for node in tree.nodes:
        meta = tree.sessions.get(node.id)
        if meta is None:
            continue
        standard = meta.role == "standard"
        entry: dict[str, Any] = meta.model_dump(mode="json")
        entry["parent_id"] = node.parent_id
        entry["turns"] = tree.turns.get(node.id, 0)
        entry["record_count"] = storage.count_records(node.id)
        entry["system_prompt"] = storage.get_system_prompt(node.id)
        entry["l2"] = storage.get_memory(node.id) if standard else None
        entry["insight"] = storage.get_insight(node.id) if standard else None
        if records:
            from langchain_core.messages import messages_to_dict

            entry["records"] = messages_to_dict(storage.list_records(node.id))
        yield entry
