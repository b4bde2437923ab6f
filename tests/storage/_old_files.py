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
