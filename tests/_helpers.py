"""Helpers several suites share: settling a call made sync or async, damaging a file."""

from __future__ import annotations

import inspect
import random
import sqlite3
from pathlib import Path
from typing import Any

__all__ = ["corrupt_pages", "settle"]


async def settle(value: Any) -> Any:
    """Await `value` if the call returned a coroutine; drain it if it returned an iterator."""
    if inspect.isawaitable(value):
        return await value
    if hasattr(value, "__aiter__"):
        return [item async for item in value]
    if hasattr(value, "__next__"):
        return list(value)
    return value


def corrupt_pages(db: Path) -> None:
    """Overwrite the first page of the records' b-tree (its root) with noise: the kind of
    damage SQLite's `quick_check` finds, in a table the commands' first probe does not
    read."""
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size = conn.execute("PRAGMA page_size").fetchone()[0]
        sql = "SELECT rootpage FROM sqlite_master WHERE name = 'stello_record_rows'"
        root = conn.execute(sql).fetchone()[0]
    conn.close()
    with db.open("r+b") as f:  # the page's cell pointers and first cells
        f.seek((root - 1) * size + 8)
        f.write(random.Random(7).randbytes(400))
