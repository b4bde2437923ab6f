"""`KeptTurnSaver`: a checkpointer of the user's, behind the agent's turns, that keeps one
checkpoint per finished turn.

With the default `"async"` durability LangGraph checkpoints a stello turn without tools
twice (the run's input, after the model step that commits it: the turn graph has no START
step) and writes the step's results once more as pending writes. A saver the agent prunes drops
all of that once the turn is committed; a saver of the user's keeps it, though nothing can
use it afterwards: a turn's history is its session's L3 (a run from an earlier checkpoint of
a stello thread goes on from a fork of the session, `stello_graph.nodes.entry`).

So the agent runs its turns on such a saver through this one. It holds a run's first steps
in memory, as the agent's own savers do (`HeldRuns`): its checkpoints and writes up to
its first node step (`HELD_CHECKPOINTS`).

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

import copy
import threading
from collections.abc import AsyncIterator, Collection, Iterator, Mapping, Sequence
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


def _thread_config(thread_id: str | None) -> RunnableConfig | None:
    return None if thread_id is None else {"configurable": {"thread_id": str(thread_id)}}


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
        self._latest: dict[str, str] = {}  # thread -> newest checkpoint id given or read
        self._early: dict[tuple[str, str], list[_Writes]] = {}  # (thread, id) -> writes
        self._lock = threading.Lock()

    @property
    def config_specs(self) -> list[Any]:
        return list(self.inner.config_specs)

    def get_next_version(self, current: Any, channel: None) -> Any:
        return self.inner.get_next_version(current, channel)

    # -- what is held -----------------------------------------------------------------------
    def _saw(self, thread: str | None, checkpoint_id: str) -> None:
        """Note the newest checkpoint of `thread` this saver was given or read (under the
        lock)."""
        if thread is not None and checkpoint_id > self._latest.get(thread, ""):
            self._latest[thread] = checkpoint_id

    def _hold_put(self, args: _Put) -> tuple[RunnableConfig | None, HeldRun | None, list[_Writes]]:
        """`(put's result, None, ...)` when the checkpoint is held; else `(None, what is
        held of its thread, to be written first, ...)`; last, the writes for the checkpoint
        that came before it (`_hold_writes`), to be given again after it."""
        config, checkpoint, metadata, new_versions = args
        thread = thread_of(config)
        with self._lock:
            self._saw(thread, checkpoint["id"])
            early = self._early.pop((thread or "", checkpoint["id"]), [])
            done = self._held.hold_put(
                config, checkpoint["id"], metadata, new_versions, ("put", args), enabled=True
            )
            earlier = None if done is not None else self._take(config)
        return done, earlier, early

    def _hold_writes(self, args: _Writes) -> tuple[bool, HeldRun | None]:
        """`(True, None)` when the writes are held, or kept until their checkpoint comes
        (LangGraph gives a step's writes and the checkpoint before it from different
        threads: a write may come first); else `(False, what is held of the thread)`."""
        config = args[0]
        thread, wanted = thread_of(config), config["configurable"].get("checkpoint_id")
        with self._lock:
            if self._held.hold_writes(config, ("writes", args)):
                return True, None
            latest = None if thread is None else self._latest.get(thread)
            if latest is not None and wanted is not None and str(wanted) > latest:
                self._early.setdefault((str(thread), str(wanted)), []).append(args)
                return True, None
            return False, self._take(config)

    def _take(self, config: RunnableConfig | None) -> HeldRun | None:
        """What is held of `config`'s thread, and the writes kept for its checkpoints still
        to come, taken (under the lock)."""
        thread = thread_of(config)
        if thread is None:
            return None
        held = self._held.pop(thread, None)
        early = [key for key in self._early if key[0] == thread]
        if early:
            held = held or HeldRun([])
            held.ops.extend(("writes", args) for key in early for args in self._early.pop(key))
        return held

    def _take_all(self) -> list[HeldRun]:
        with self._lock:
            runs = list(self._held.values())
            self._held.clear()
            early = [args for found in self._early.values() for args in found]
            self._early.clear()
        return [*runs, HeldRun([], [("writes", args) for args in early])]

    def _taken(self, config: RunnableConfig | None) -> list[HeldRun]:
        """What a read of `config`'s thread (of every thread, without one) must write first."""
        if thread_of(config) is None:
            return self._take_all()
        with self._lock:
            held = self._take(config)
        return [] if held is None else [held]

    def _read(self, config: RunnableConfig, found: CheckpointTuple | None) -> None:
        thread = thread_of(config)
        with self._lock:
            if found is not None:
                self._saw(thread, str(found.config["configurable"]["checkpoint_id"]))
            elif thread is not None and not config["configurable"].get("checkpoint_id"):
                self._latest.setdefault(thread, "")  # nothing on the thread yet

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

    def _ended(self, thread_id: str) -> tuple[HeldRun | None, _Put | None]:
        with self._lock:
            held = self._held.pop(str(thread_id), None)
        return held, None if held is None else _last_checkpoint(held)

    def _restore(self, thread_id: str, held: HeldRun) -> None:
        """A run whose last checkpoint could not be written is held again (`flush` then
        writes it as it was asked for)."""
        with self._lock:
            self._held.setdefault(str(thread_id), held)

    # -- the agent's calls --------------------------------------------------------------------
    def end_run(self, thread_id: str) -> None:
        """The turn on `thread_id` is committed and its run finished: write the last
        checkpoint of what is held of the run (nothing, if it was written already)."""
        held, last = self._ended(thread_id)
        if held is not None and last is not None:
            try:
                self.inner.put(*last)
            except BaseException:
                self._restore(thread_id, held)
                raise

    async def aend_run(self, thread_id: str) -> None:
        """Async twin of `end_run`."""
        held, last = self._ended(thread_id)
        if held is not None and last is not None:
            try:
                await self.inner.aput(*last)
            except BaseException:
                self._restore(thread_id, held)
                raise

    def flush(self, thread_id: str | None = None) -> None:
        """Write what is held of `thread_id` (of every thread, without one), as it was asked
        for: a run that stopped can resume."""
        self._write(self._taken(_thread_config(thread_id)))

    async def aflush(self, thread_id: str | None = None) -> None:
        """Async twin of `flush`."""
        await self._awrite(self._taken(_thread_config(thread_id)))

    def ended(self, thread_id: str) -> bool:
        """Whether a run of `thread_id` is held and nothing was asked of the saver after its
        newest checkpoint (no interrupt, no step in flight): a run that ended there."""
        with self._lock:
            held = self._held.get(str(thread_id))
            return held is not None and held.ended

    # -- the saver's interface -----------------------------------------------------------------
    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        args = (config, checkpoint, metadata, new_versions)
        done, earlier, early = self._hold_put(args)
        if done is None:
            self._write([earlier])
            done = self.inner.put(*args)
        for writes in early:
            self.put_writes(*writes)
        return done

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        args = (config, checkpoint, metadata, new_versions)
        done, earlier, early = self._hold_put(args)
        if done is None:
            await self._awrite([earlier])
            done = await self.inner.aput(*args)
        for writes in early:
            await self.aput_writes(*writes)
        return done

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
        found = self.inner.get_tuple(config)
        self._read(config, found)
        return found

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        await self._awrite(self._taken(config))
        found = await self.inner.aget_tuple(config)
        self._read(config, found)
        return found

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

    def _forget(self, thread_id: str) -> None:
        with self._lock:
            self._take(_thread_config(thread_id))
            self._latest.pop(str(thread_id), None)

    def delete_thread(self, thread_id: str) -> None:
        self._forget(thread_id)
        self.inner.delete_thread(thread_id)

    async def adelete_thread(self, thread_id: str) -> None:
        self._forget(thread_id)
        await self.inner.adelete_thread(thread_id)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._write(self._taken({"configurable": {"thread_id": source_thread_id}}))
        self.inner.copy_thread(source_thread_id, target_thread_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._awrite(self._taken({"configurable": {"thread_id": source_thread_id}}))
        await self.inner.acopy_thread(source_thread_id, target_thread_id)

    def with_allowlist(self, extra_allowlist: Collection[tuple[str, ...]]) -> KeptTurnSaver:
        """This saver over `inner.with_allowlist(...)`, holding the same runs (LangGraph
        asks it of a graph's checkpointer when it compiles with strict msgpack)."""
        inner = self.inner.with_allowlist(extra_allowlist)
        if inner is self.inner:
            return self
        twin = copy.copy(self)  # the same held runs and lock
        twin.inner, twin.serde = inner, inner.serde
        return twin

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
