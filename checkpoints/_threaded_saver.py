"""What stello's two checkpoint savers share: `AsyncInThreads`, their database's errors typed
and async twins of their sync methods, each run in a thread.

LangGraph's `SqliteSaver` and `PostgresSaver` are sync savers whose async methods raise. The
agent drives them from both sides (`turn` and `aturn` on one thread), so its savers take this
mixin first in their bases: each async method runs its sync twin in a worker thread, never
on the event loop; the calls of one saver go through one queue (`CallQueue`), so those asked
at once run one after another in one thread, as the saver's one connection would have them.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    DeltaChannelHistory,
)
from langgraph.checkpoint.base import CheckpointTuple as _CheckpointTuple

from stello_graph.checkpoints._queue import CallQueue

__all__ = ["AsyncInThreads"]


class AsyncInThreads(BaseCheckpointSaver[str]):
    """The savers' sync methods with their database's errors typed (`_errors`), and their
    async twins, each running the sync method in a worker thread (put it before the saver
    in the bases)."""

    conn: Any

    def _errors(self) -> AbstractContextManager[None]:
        """A failure of the database in the block, raised as stello's typed error."""
        raise NotImplementedError

    # -- sync -------------------------------------------------------------------------------
    def get_tuple(self, config: RunnableConfig) -> _CheckpointTuple | None:
        with self._errors():
            return super().get_tuple(config)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[_CheckpointTuple]:
        with self._errors():
            yield from super().list(config, filter=filter, before=before, limit=limit)

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        with self._errors():
            return super().get_delta_channel_history(config=config, channels=channels)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        with self._errors():
            return super().put(config, checkpoint, metadata, new_versions)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        with self._errors():
            super().put_writes(config, writes, task_id, task_path)

    def delete_thread(self, thread_id: str) -> None:
        with self._errors():
            super().delete_thread(str(thread_id))

    def close(self) -> None:
        """Close the saver's connection (or connection pool)."""
        with self._errors():
            self.conn.close()

    # -- async ------------------------------------------------------------------------------
    @functools.cached_property
    def _calls(self) -> CallQueue:
        """The async calls, run in order by one drain at a time: they serialise on the
        saver's one connection anyway, and the calls of a gathered round of turns then share
        one hand-off to a thread instead of one each."""
        return CallQueue(self._start_drain)

    def _start_drain(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            loop.run_in_executor(None, self._calls.drain)
        except RuntimeError:  # the loop's executor is shut down: the loop is going away
            self._calls.abandon(loop)

    async def aget_tuple(self, config: RunnableConfig) -> _CheckpointTuple | None:
        return await self._calls.call(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[_CheckpointTuple]:
        found = await self._calls.call(
            lambda: list(self.list(config, filter=filter, before=before, limit=limit))
        )
        for item in found:
            yield item

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return await self._calls.call(
            self.get_delta_channel_history, config=config, channels=channels
        )

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await self._calls.call(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await self._calls.call(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await self._calls.call(self.delete_thread, thread_id)
