"""`KeptTurnSaver`: a checkpointer of the user's, behind the agent's turns, that keeps one
checkpoint per finished turn.

With the default `"async"` durability LangGraph checkpoints a stello turn without tools
three times (the run's input, after its START step, after the model step that commits it)
and writes the steps' results twice more as pending writes. A saver the agent prunes drops
all of that once the turn is committed; a saver of the user's keeps it, though nothing can
use it afterwards: a turn's history is its session's L3, and replaying a stello thread from
an earlier checkpoint is refused (`TimeTravelError`).

So the agent runs its turns on such a saver through this one. It holds a run's first steps
in memory, as the agent's own savers do (`HeldRuns`): the first `HELD_CHECKPOINTS`
checkpoints and the writes of the first two steps.

* A turn that ends in its first model step (`end_run`) writes its last checkpoint only, as
  the child of the thread's checkpoint before the run: one checkpoint per turn, a chain.
  Its channel values are written as one checkpoint of the run, so a saver that stores each
  channel's value by version (PostgreSQL, in memory) is given every channel the run changed.
* A run that gets further (a tool round), stops (an error, an interrupt: `flush`), or whose
  thread is read first, writes everything it held, in order, then goes on as LangGraph
  asks: what a crash keeps is then what the agent's own saver keeps (BENCHMARKS.md, "What a
  crash keeps").

Everything else is the user's saver's own: its versions, its serializer, its reads.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)

from stello_graph.checkpoints._threaded_saver import HeldRun, HeldRuns, thread_of

__all__ = ["KeptTurnSaver"]

_Put = tuple[RunnableConfig, Checkpoint, CheckpointMetadata, ChannelVersions]
_Writes = tuple[RunnableConfig, Sequence[tuple[str, Any]], str, str]


def _last_checkpoint(held: HeldRun) -> _Put | None:
    """The held run's last checkpoint, as the child of the checkpoint the run started from,
    with every channel the run gave a new version (the newest of each)."""
    puts: list[_Put] = [args for kind, args in held.ops if kind == "put"]
    if not puts:
        return None
    first_config, _, _, _ = puts[0]
    config, checkpoint, metadata, _ = puts[-1]
    conf = {k: v for k, v in config["configurable"].items() if k != "checkpoint_id"}
    parent = first_config["configurable"].get("checkpoint_id")
    if parent is not None:
        conf["checkpoint_id"] = parent
    current = checkpoint["channel_versions"]
    changed = {key for *_, versions in puts for key in versions}
    versions = {key: current[key] for key in changed if key in current}
    return {**config, "configurable": conf}, checkpoint, metadata, versions


class KeptTurnSaver(BaseCheckpointSaver[Any]):
    """`inner`, with each run's first steps held in memory and a finished turn kept as its
    last checkpoint (see the module). Thread-safe; its async methods use `inner`'s."""

    def __init__(self, inner: BaseCheckpointSaver[Any]) -> None:
        super().__init__(serde=inner.serde)
        self.inner = inner
        """The saver everything is written to and read from."""
        self._held = HeldRuns()
        self._lock = threading.Lock()

    @property
    def config_specs(self) -> list[Any]:
        return list(self.inner.config_specs)

    def get_next_version(self, current: Any, channel: None) -> Any:
        return self.inner.get_next_version(current, channel)

    # -- what is held -----------------------------------------------------------------------
    def _hold_put(self, args: _Put) -> tuple[RunnableConfig | None, HeldRun | None]:
        """`(put's result, None)` when the checkpoint is held; else `(None, what is held of
        its thread, to be written first)`."""
        config, checkpoint, metadata, _ = args
        with self._lock:
            done = self._held.hold_put(
                config, checkpoint["id"], metadata, ("put", args), enabled=True
            )
            return (done, None) if done is not None else (None, self._take(config))

    def _hold_writes(self, args: _Writes) -> tuple[bool, HeldRun | None]:
        with self._lock:
            if self._held.hold_writes(args[0], ("writes", args)):
                return True, None
            return False, self._take(args[0])

    def _take(self, config: RunnableConfig | None) -> HeldRun | None:
        thread = thread_of(config)
        return None if thread is None else self._held.pop(thread, None)

    def _take_all(self) -> list[HeldRun]:
        with self._lock:
            runs = list(self._held.values())
            self._held.clear()
        return runs

    def _taken(self, config: RunnableConfig | None) -> list[HeldRun]:
        """What a read of `config`'s thread (of every thread, without one) must write first."""
        if thread_of(config) is None:
            return self._take_all()
        with self._lock:
            held = self._take(config)
        return [] if held is None else [held]

    def _write(self, runs: Sequence[HeldRun | None]) -> None:
        for held in runs:
            for kind, args in held.ops if held is not None else ():
                if kind == "put":
                    self.inner.put(*args)
                else:
                    self.inner.put_writes(*args)

    async def _awrite(self, runs: Sequence[HeldRun | None]) -> None:
        for held in runs:
            for kind, args in held.ops if held is not None else ():
                if kind == "put":
                    await self.inner.aput(*args)
                else:
                    await self.inner.aput_writes(*args)

    def _ended(self, thread_id: str) -> _Put | None:
        with self._lock:
            held = self._held.pop(str(thread_id), None)
        return None if held is None else _last_checkpoint(held)

    # -- the agent's calls --------------------------------------------------------------------
    def end_run(self, thread_id: str) -> None:
        """The turn on `thread_id` is committed and its run finished: write the last
        checkpoint of what is held of the run (nothing, if it was written already)."""
        last = self._ended(thread_id)
        if last is not None:
            self.inner.put(*last)

    async def aend_run(self, thread_id: str) -> None:
        """Async twin of `end_run`."""
        last = self._ended(thread_id)
        if last is not None:
            await self.inner.aput(*last)

    def flush(self) -> None:
        """Write everything held, as it was asked for (a run that stopped can resume)."""
        self._write(self._take_all())

    async def aflush(self) -> None:
        """Async twin of `flush`."""
        await self._awrite(self._take_all())

    # -- the saver's interface -----------------------------------------------------------------
    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        args = (config, checkpoint, metadata, new_versions)
        done, earlier = self._hold_put(args)
        if done is not None:
            return done
        self._write([earlier])
        return self.inner.put(*args)

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        args = (config, checkpoint, metadata, new_versions)
        done, earlier = self._hold_put(args)
        if done is not None:
            return done
        await self._awrite([earlier])
        return await self.inner.aput(*args)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        held, earlier = self._hold_writes((config, list(writes), task_id, task_path))
        if not held:
            self._write([earlier])
            self.inner.put_writes(config, writes, task_id, task_path)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        held, earlier = self._hold_writes((config, list(writes), task_id, task_path))
        if not held:
            await self._awrite([earlier])
            await self.inner.aput_writes(config, writes, task_id, task_path)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        self._write(self._taken(config))
        return self.inner.get_tuple(config)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        await self._awrite(self._taken(config))
        return await self.inner.aget_tuple(config)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        self._write(self._taken(config))
        return self.inner.list(config, filter=filter, before=before, limit=limit)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        await self._awrite(self._taken(config))
        async for found in self.inner.alist(config, filter=filter, before=before, limit=limit):
            yield found

    def delete_thread(self, thread_id: str) -> None:
        with self._lock:
            self._held.pop(str(thread_id), None)
        self.inner.delete_thread(thread_id)

    async def adelete_thread(self, thread_id: str) -> None:
        with self._lock:
            self._held.pop(str(thread_id), None)
        await self.inner.adelete_thread(thread_id)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._write(self._taken({"configurable": {"thread_id": source_thread_id}}))
        self.inner.copy_thread(source_thread_id, target_thread_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._awrite(self._taken({"configurable": {"thread_id": source_thread_id}}))
        await self.inner.acopy_thread(source_thread_id, target_thread_id)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self.flush()
        self.inner.prune(thread_ids, strategy=strategy)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self.aflush()
        await self.inner.aprune(thread_ids, strategy=strategy)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self.flush()
        self.inner.delete_for_runs(run_ids)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self.aflush()
        await self.inner.adelete_for_runs(run_ids)

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, Any]:
        self._write(self._taken(config))
        return self.inner.get_delta_channel_history(config=config, channels=channels)

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, Any]:
        await self._awrite(self._taken(config))
        return await self.inner.aget_delta_channel_history(config=config, channels=channels)
