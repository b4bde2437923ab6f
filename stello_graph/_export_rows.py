"""The export's JSON written from stored rows: what `stello_graph.export` streams on a stello
storage, and `stello-graph export` from a `TreeRows` snapshot (no model built, no pydantic
imported: decoding records, with `records=True`, loads LangChain)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from stello_graph.checkpoints._damage import (
    ROLES,
    STATUSES,
    UNDECODABLE,
    meta_damage,
    shown,
    undecodable,
)

if TYPE_CHECKING:
    from stello_graph.checkpoints._sqlite_rows import TreeRows
    from stello_graph.checkpoints.backend import ExportPart, RowSink

__all__ = [
    "EXPORT_FORMAT",
    "Entries",
    "RowReader",
    "head_of",
    "row_entries",
    "write_entries",
    "write_export_rows",
]

EXPORT_FORMAT = "stello-graph.export/1"
"""The `format` field of an export; the number changes with its shape."""

UNDECODABLE_RECORD = "undecodable"
"""The key of a record that does not decode, in an export: `{"undecodable": <its text>}`."""

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
    """The export entry of a session row (`ExportPart` `"sessions"`), without records; of a
    damaged row, what decodes, stand-ins, and its columns that do not (`"damaged"`)."""
    parent_id, turns, record_count, system_prompt, memory, insight = row[8:14]
    try:
        entry = _meta_entry(row, ())
        sound = row[2] in ROLES and row[3] in STATUSES and not any(map(undecodable, row[:14]))
    except (ValueError, TypeError):
        sound = False
    if not sound:
        damaged = meta_damage(row[:8])
        entry = _meta_entry(row, damaged)
    standard = entry["role"] == "standard"
    entry.update(
        parent_id=parent_id,
        turns=turns,
        record_count=record_count,
        system_prompt=system_prompt,
        l2=memory if standard else None,
        insight=insight if standard else None,
    )
    if not sound:
        if undecodable(parent_id):
            entry["parent_id"], damaged = shown(parent_id), (*damaged, "parent_id")
        for key, column, value in (
            ("system_prompt", "system_prompt", system_prompt),
            ("l2", "memory", memory),
            ("insight", "insight", insight),
        ):
            if undecodable(value):
                entry[key], damaged = UNDECODABLE, (*damaged, column)
        entry["damaged"] = list(damaged)
    return entry


def _loaded(text: str, kind: type) -> Any:
    value = json.loads(text)
    if not isinstance(value, kind):
        raise ValueError(f"not a JSON {kind.__name__}")
    return value


def _meta_entry(row: tuple[Any, ...], bad: tuple[str, ...]) -> dict[str, Any]:
    """The meta part of a session row's entry, a stand-in for each of the columns `bad`
    (those of a damaged row that do not decode)."""
    sid, label, role, status, tags, metadata, created, updated = row[:8]
    return {
        "id": shown(sid) if bad else sid,
        "label": UNDECODABLE if "label" in bad else label,
        "role": "standard" if "role" in bad else role,
        "status": "active" if "status" in bad else status,
        "tags": [] if "tags" in bad or tags == "[]" else _loaded(tags, list),
        "metadata": {} if "metadata" in bad or metadata == "{}" else _loaded(metadata, dict),
        "created_at": None if "created_at" in bad else _json_time(created),
        "updated_at": None if "updated_at" in bad else _json_time(updated),
    }


def _record_dict(data: str) -> dict[str, Any]:
    """A stored record as `messages_to_dict` gives it (the message decoded: LangChain); a
    record that does not decode, as `{"undecodable": <its stored text>}`."""
    from langchain_core.messages import message_to_dict

    from stello_graph.checkpoints._serde import decode_message

    if not undecodable(data):
        try:
            return message_to_dict(decode_message(data))
        except (ValueError, TypeError, KeyError, AttributeError):
            pass
    return {UNDECODABLE_RECORD: shown(data)}


def session_entries(
    reader: RowReader, records: bool, emit: Callable[[dict[str, Any]], None]
) -> None:
    """`emit` every session entry in tree order, with its records when asked (one pass)."""
    if not records:
        reader.export_rows("sessions", lambda row: emit(_entry(row)))
        return
    held: list[dict[str, Any]] = []  # the entry being filled: one session's records at most

    def take(row: tuple[Any, ...]) -> None:
        if held and held[0]["id"] != shown(row[0]):
            emit(held.pop())
        if not held:
            held.append({**_entry(row), "records": []})
        if row[14] is not None:
            record = _record_dict(row[14])
            held[0]["records"].append(record)
            if UNDECODABLE_RECORD in record and "records" not in held[0].get("damaged", ()):
                held[0]["damaged"] = [*held[0].get("damaged", ()), "records"]

    reader.export_rows("records", take)
    if held:
        emit(held.pop())


def node_entry(row: tuple[Any, ...]) -> dict[str, Any]:
    """The export entry of a node row (`ExportPart` `"nodes"`): a label that does not
    decode is `"(undecodable)"`, marked `"damaged"`; a node no root reaches (its parents
    make a cycle) is marked `"detached"`."""
    nid, parent, label = row[0], row[1], row[2]
    entry: dict[str, Any] = {"id": nid, "parent_id": parent, "label": label}
    damaged = [c for c, v in zip(("id", "parent_id", "label"), row, strict=False) if undecodable(v)]
    if damaged:
        entry.update(id=shown(nid), parent_id=None if parent is None else shown(parent))
        entry.update(damaged=damaged, label=UNDECODABLE if "label" in damaged else label)
    if len(row) > 3 and row[3]:
        entry["detached"] = True
    return entry


def head_of(tree_id: str, main: tuple[str, str | None] | None) -> dict[str, Any]:
    """The export's first members, from the main session's id and synthesis."""
    synthesis = main[1] if main else None
    return {
        "format": EXPORT_FORMAT,
        "tree_id": tree_id,
        "main_session_id": shown(main[0]) if main else None,
        "synthesis": UNDECODABLE if undecodable(synthesis) else synthesis,
    }


Emit = Callable[[dict[str, Any]], None]
Entries = Callable[[Emit], object]
"""One list of the export: `entries(emit)` calls `emit` on each entry, in order."""


def row_entries(reader: RowReader, records: bool) -> tuple[Entries, Entries]:
    """The export's node and session entries, from the rows `reader` streams (one pass each)."""
    return (
        lambda emit: reader.export_rows("nodes", lambda row: emit(node_entry(row))),
        lambda emit: session_entries(reader, records, emit),
    )


def write_export_rows(
    rows: TreeRows, out: TextIO, *, records: bool = False
) -> dict[str, tuple[str, ...]]:
    """What `write_export` writes (and returns) for the storage of the same SQLite file,
    read from `rows` (one snapshot, no model built: what `stello-graph export` runs)."""
    head = head_of(rows.tree_id, rows.main_session())
    return write_entries(head, row_entries(rows, records), out)


def write_entries(
    head: dict[str, Any], lists: tuple[Entries, Entries], out: TextIO
) -> dict[str, tuple[str, ...]]:
    """Write the export (its head, then the `nodes` and `sessions` lists, entry by entry as
    they are emitted); return what it marked `damaged` (or `detached`), by id."""
    damaged: dict[str, tuple[str, ...]] = {}
    text = json.dumps(head, indent=2, ensure_ascii=False)
    out.write(text[:-2] + ',\n  "nodes": ')  # the head's members, without its closing brace
    _write_list(out, lists[0], damaged)
    out.write(',\n  "sessions": ')
    _write_list(out, lists[1], damaged)
    out.write("\n}")
    return damaged


def _write_list(out: TextIO, produce: Entries, damaged: dict[str, tuple[str, ...]]) -> None:
    """Write the items `produce` emits as a JSON list at the second level of indentation."""
    first = [True]

    def emit(item: dict[str, Any]) -> None:
        text = _dumps_entry(item).replace("\n", _ITEM)
        out.write(("[" if first[0] else ",") + _ITEM + text)
        first[0] = False
        if "damaged" in item or "detached" in item:  # what it marks, by id
            columns = (*item.get("damaged", ()), *(["parent_id"] if item.get("detached") else []))
            sid = item["id"]
            damaged[sid] = tuple(dict.fromkeys((*damaged.get(sid, ()), *columns)))

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
