"""Damaged rows: what a read does with stored values that do not decode.

A session's row is damaged when a text column holds bytes that are not UTF-8 (SQLite keeps
whatever it is given), a JSON column (tags, metadata, a record) is not the JSON stello
wrote, or an enum column (role, status) holds an unknown value; a node is detached when its
parents make a cycle. A read of the damaged session itself raises `DamagedDataError` naming
the session and the column. A whole-tree read never fails on one damaged row: it shows every
other row as it is, and the damaged one as a placeholder (the label `UNDECODABLE`, no tags,
...) marked `damaged` with its columns.

SQLite refuses to fetch a text that is not UTF-8 (`OperationalError: Could not decode to
UTF-8 column ...`); a whole-tree read then reads its rows again with `tolerant_text`, which
gives such a text as an `Undecodable` (each byte that is not UTF-8 a lone surrogate, kept by
`surrogateescape`). A text read in one piece with others (the JSON text of a whole tree) is
split back with `marked`. So a builder tells a value that does not decode by its type alone.

This module imports neither pydantic nor LangChain (`stello-graph tree` uses it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from stello_graph.errors import DamagedDataError

__all__ = [
    "META",
    "META_COLUMNS",
    "ROLES",
    "STATUSES",
    "UNDECODABLE",
    "Undecodable",
    "damaged_error",
    "marked",
    "meta_damage",
    "row_damage",
    "shown",
    "tolerant_text",
    "undecodable",
    "undecodable_column",
]

UNDECODABLE = "(undecodable)"
"""What a whole-tree read shows in place of a text that does not decode (a label, an L2)."""

ROLES = ("standard", "main")
STATUSES = ("active", "archived")
META_COLUMNS = ("id", "label", "role", "status", "tags", "metadata", "created_at", "updated_at")
"""The columns of a `MetaRow` (`_serde`), in order."""
META = ", ".join(META_COLUMNS)
"""`META_COLUMNS` as a statement lists them."""

_NOT_UTF8 = re.compile(r"Could not decode to UTF-8 column '(.*)", re.DOTALL)
"""SQLite's message (cut short after so many characters: a long column name loses its end)."""


class Undecodable(str):
    """A stored text that is not UTF-8, as a whole-tree read gives it: each byte that is not
    UTF-8 a lone surrogate. Only stand-ins for it are shown (`UNDECODABLE`, `shown`)."""

    __slots__ = ()


def tolerant_text(raw: bytes) -> str:
    """A SQLite text as Python reads it, or an `Undecodable` when it is not UTF-8 (the
    `text_factory` of a whole-tree read of damaged rows)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return Undecodable(raw.decode("utf-8", "surrogateescape"))


def undecodable(value: object) -> bool:
    """Whether `value` is a stored text that is not UTF-8 (see `Undecodable`)."""
    return type(value) is Undecodable


def marked(value: Any) -> Any:
    """`value`, an `Undecodable` when it is a text holding lone surrogates (a part of a text
    read with `tolerant_text`, parsed)."""
    if type(value) is not str or value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return Undecodable(value)
    return value


def shown(text: str) -> str:
    """`text` with every byte that was not UTF-8 shown as U+FFFD."""
    if type(text) is not Undecodable:
        return text
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def undecodable_column(exc: BaseException) -> str | None:
    """The column SQLite could not decode as UTF-8, when that is what `exc` says."""
    found = _NOT_UTF8.search(str(exc))
    return None if found is None else found.group(1).split("' with text", 1)[0]


def damaged_error(session_id: str, column: str, cause: object) -> DamagedDataError:
    """The error of a read of one session whose stored `column` does not decode."""
    return DamagedDataError(
        f"Session {shown(session_id)!r}: column {column!r} cannot be decoded: {cause}. Its "
        "stored row is damaged; whole-tree reads (the tree, digests, the export) show it as a "
        "placeholder. Write the value again (put_session, put_node, ...) or restore the row "
        "from a backup."
    )


def row_damage(row: Sequence[Any]) -> tuple[str, ...]:
    """`meta_damage` of the first columns of `row` (a `MetaRow` and more), after a cheap look
    that passes a sound row (a known role and status, texts that decode, tags and metadata
    that parse; the timestamps are not parsed): for the rows of a whole tree."""
    tags, metadata = row[4], row[5]
    if (
        row[2] in ROLES
        and row[3] in STATUSES
        and type(row[0]) is str
        and type(row[1]) is str
        and (tags == "[]" or (type(tags) is str and type(_loads(tags)) is list))
        and (metadata == "{}" or (type(metadata) is str and type(_loads(metadata)) is dict))
    ):
        return ()
    return meta_damage(row[:8])


def meta_damage(row: Sequence[Any]) -> tuple[str, ...]:
    """The columns of a `MetaRow` that do not decode, in column order (empty: sound)."""
    sid, label, role, status, tags, metadata, created_at, updated_at = row
    listed = _loads(tags)
    bad = {
        "id": not isinstance(sid, str),
        "label": not isinstance(label, str),
        "role": role not in ROLES,
        "status": status not in STATUSES,
        "tags": not (isinstance(listed, list) and all(isinstance(tag, str) for tag in listed)),
        "metadata": not isinstance(_loads(metadata), dict),
        "created_at": _parsed(created_at, datetime.fromisoformat) is None,
        "updated_at": _parsed(updated_at, datetime.fromisoformat) is None,
    }
    return tuple(
        name
        for name, value in zip(META_COLUMNS, row, strict=True)
        if bad[name] or undecodable(value)
    )


def _loads(text: object) -> Any:
    """The JSON value of `text` (`None` when it is not JSON text)."""
    return _parsed(text, json.loads)


def _parsed(text: object, parse: Callable[[str], Any]) -> Any:
    """`parse(text)`, or `None` when `text` is not a text `parse` reads."""
    if not isinstance(text, str):
        return None
    try:
        return parse(text)
    except ValueError:
        return None
