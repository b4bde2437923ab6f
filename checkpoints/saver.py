"""LangGraph checkpointers on the same SQLite file as the `SqliteMainStorage`.

`StelloSqliteSaver` is LangGraph's `SqliteSaver` with working async methods (run in worker
threads), so one agent can be driven both from threads and from asyncio on one file.
`open_sqlite(path)` opens the stello storage and such a saver on the same database file.

This module imports LangGraph; `stello_graph.checkpoints` loads it only when one of its
names is used.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import AsyncIterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import ChannelVersions, Checkpoint, CheckpointMetadata
from langgraph.checkpoint.base import CheckpointTuple as _CheckpointTuple
from langgraph.checkpoint.sqlite import SqliteSaver

from stello_graph.checkpoints.sqlite import SqliteMainStorage

__all__ = ["StelloSqliteSaver", "open_sqlite", "sqlite_saver"]

BUSY_TIMEOUT_MS = 30_000


class StelloSqliteSaver(SqliteSaver):
    """`SqliteSaver` whose async methods work too (each runs the sync one in a thread)."""

    async def aget_tuple(self, config: RunnableConfig) -> _CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[_CheckpointTuple]:
        found = await asyncio.to_thread(
            lambda: list(self.list(config, filter=filter, before=before, limit=limit))
        )
        for item in found:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    def close(self) -> None:
        """Close the saver's connection."""
        self.conn.close()


def sqlite_saver(path: str | os.PathLike[str]) -> StelloSqliteSaver:
    """A `StelloSqliteSaver` on its own connection to `path` (WAL, busy timeout)."""
    conn = sqlite3.connect(os.fspath(path), check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA synchronous=NORMAL")
    return StelloSqliteSaver(conn)


def open_sqlite(
    path: str | os.PathLike[str], *, tree_id: str = "default", allow_foreign_tables: bool = False
) -> tuple[SqliteMainStorage, StelloSqliteSaver]:
    """Open the stello storage and a LangGraph checkpointer on the same SQLite file
    (`allow_foreign_tables` as `SqliteMainStorage` takes it).

    Example:
        >>> storage, saver = open_sqlite("app.db")  # doctest: +SKIP
        >>> agent = StelloAgent(model=model, storage=storage, checkpointer=saver)  # doctest: +SKIP
    """
    storage = SqliteMainStorage(path, tree_id=tree_id, allow_foreign_tables=allow_foreign_tables)
    return storage, sqlite_saver(path)
