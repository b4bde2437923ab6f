"""SQLite files as an earlier version of stello-graph left them, for the migration tests."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from stello_graph.checkpoints import _schema


def file_at_version(path: Path, version: int) -> sqlite3.Connection:
    """A new file at `path` with stello's schema as of `version` (the migrations up to it),
    and an autocommit connection on it (the caller closes it)."""
    conn = sqlite3.connect(path, isolation_level=None)
    released = _schema.MIGRATIONS
    try:
        _schema.MIGRATIONS = released[:version]
        _schema.SCHEMA_VERSION = version
        _schema.migrate(conn, str(path), begin=lambda: conn.execute("BEGIN IMMEDIATE"))
    finally:
        _schema.MIGRATIONS = released
        _schema.SCHEMA_VERSION = len(released)
    return conn


def put_old_session(
    conn: sqlite3.Connection, session_id: str, label: str = "", tree_id: str = "default"
) -> None:
    """A session row as every version up to 9 wrote it (today's storage also gives it a key
    for its records, a column those versions do not have)."""
    at = "2026-01-01T00:00:00+00:00"
    conn.execute(
        """INSERT INTO stello_sessions (tree_id, id, label, role, status, tags, metadata,
            created_at, updated_at, created_seq)
        VALUES (?, ?, ?, 'standard', 'active', '[]', '{}', ?, ?,
            (SELECT COALESCE(MAX(created_seq), 0) + 1 FROM stello_sessions))""",
        (tree_id, session_id, label, at, at),
    )
