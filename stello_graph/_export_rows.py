"""The export's JSON written from stored rows: what `stello_graph.export` streams on a stello
storage, and `stello-graph export` from a `TreeRows` snapshot (no model built, no pydantic
imported: decoding records, with `records=True`, loads LangChain)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC
from typing import TYPE_CHECKING, Any, Protocol, TextIO

if TYPE_CHECKING:
    from stello_graph.checkpoints._sqlite_rows import TreeRows
    from stello_graph.checkpoints.backend import ExportPart, RowSink

__all__ = [
    "EXPORT_FORMAT",
    "RowReader",
    "head_of",
    "node_entry",
    "session_entries",
    "write_export_rows",
    "write_rows",
]

EXPORT_FORMAT = "stello-graph.export/1"
"""The `format` field of an export; the number changes with its shape."""

_ITEM = "\n    "
"""What comes before each line of a list item: the items of the export's two lists sit at the
second level of `json.dumps(..., indent=2)`."""


class RowReader(Protocol):
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


def session_entries(
    reader: RowReader, records: bool, emit: Callable[[dict[str, Any]], None]
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


def node_entry(row: tuple[Any, ...]) -> dict[str, Any]:
    return {"id": row[0], "parent_id": row[1], "label": row[2]}


def head_of(tree_id: str, main: tuple[str, str | None] | None) -> dict[str, Any]:
    """The export's first members, from the main session's id and synthesis."""
    return {
        "format": EXPORT_FORMAT,
        "tree_id": tree_id,
        "main_session_id": main[0] if main else None,
        "synthesis": main[1] if main else None,
    }


def write_export_rows(rows: TreeRows, out: TextIO, *, records: bool = False) -> None:
    """What `write_export` writes for the storage of the same SQLite file, read from `rows`
    (one snapshot, no model built: what `stello-graph export` runs)."""
    write_rows(rows, head_of(rows.tree_id, rows.main_session()), out, records)


def write_rows(reader: RowReader, head: dict[str, Any], out: TextIO, records: bool) -> None:
    text = json.dumps(head, indent=2, ensure_ascii=False)
    out.write(text[:-2] + ',\n  "nodes": ')  # the head's members, without its closing brace
    _write_list(out, lambda emit: reader.export_rows("nodes", lambda r: emit(node_entry(r))))
    out.write(',\n  "sessions": ')
    _write_list(out, lambda emit: session_entries(reader, records, emit))
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
