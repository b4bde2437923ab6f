"""What stello's two checkpoint savers share: `AsyncInThreads` (their sync methods around the
first steps of runs they keep in memory, and async twins of them, each run in a thread) and
`HeldRuns` (those first steps).

LangGraph's `SqliteSaver` and `PostgresSaver` are sync savers whose async methods raise. The
agent drives them from both sides (`turn` and `aturn` on one thread), so its savers take this
mixin first in their bases: each async method runs its sync twin in a worker thread, never
on the event loop; the calls of one saver go through one queue (`CallQueue`), so those asked
at once run one after another in one thread, as the saver's one connection would have them.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

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

__all__ = [
    "HELD_CHECKPOINTS",
    "AsyncInThreads",
    "HeldRun",
    "HeldRuns",
    "saved",
    "thread_of",
]

T = TypeVar("T")

HELD_CHECKPOINTS = 3
"""Checkpoints of a run `hold_first_steps` keeps in memory at most: the run's input, the one
after its START step and the one after its first node step (a stello turn's first model
call). A run whose input goes straight to the state (the turn graph's: it has no START
step) is held up to its first node step too: two checkpoints."""

_START = "__start__"
"""LangGraph's START channel: a run's input written there runs a START step first."""


def thread_of(config: RunnableConfig | None) -> str | None:
    """The thread id of `config`, if it names one."""
    found = ((config or {}).get("configurable") or {}).get("thread_id")
    return None if found is None else str(found)


def saved(config: RunnableConfig, checkpoint_id: str) -> RunnableConfig:
    """What `put(config, ...)` returns for the checkpoint `checkpoint_id`."""
    conf = config["configurable"]
    return {"configurable": {"thread_id": str(conf["thread_id"]),
                             "checkpoint_ns": conf["checkpoint_ns"],
                             "checkpoint_id": checkpoint_id}}  # fmt: skip


@dataclass(slots=True)
class HeldRun:
    """The first steps of one thread's run, not written yet: checkpoint ids in order and the
    operations that write them, in the order they were asked for."""

    checkpoints: list[str]
    ops: list[Any] = field(default_factory=list)
    size: int = HELD_CHECKPOINTS
    """The checkpoints it holds at most: up to the one after the run's first node step."""
    ended: bool = False
    """Its last operation is a checkpoint: nothing was asked after it (no interrupt, no
    step in flight), so a run that stopped there ended there."""


class HeldRuns(dict[str, HeldRun]):
    """The held runs of a saver with `hold_first_steps`, by thread (used under its lock)."""

    def hold_put(
        self,
        config: RunnableConfig,
        checkpoint_id: str,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
        op: Any,
        *,
        enabled: bool,
    ) -> RunnableConfig | None:
        """Hold `op`, the write of checkpoint `checkpoint_id` (`put(config, ..., new_versions)`),
        and return `put`'s result, when the checkpoint joins a held run (a run's input starts
        one, when `enabled`); `None`, holding nothing, when it has to be written."""
        conf = config["configurable"]
        thread, ns = str(conf["thread_id"]), conf["checkpoint_ns"]
        if ns != "":
            return None
        held = self.get(thread)
        if metadata.get("source") == "input" and enabled:
            if held is not None:  # an earlier run that nobody ended: it is written first
                return None
            # an input written to START runs a START step before the first node
            size = HELD_CHECKPOINTS if _START in new_versions else HELD_CHECKPOINTS - 1
            self[thread] = held = HeldRun([checkpoint_id], size=size)
        elif (
            held is None
            or len(held.checkpoints) >= held.size
            or held.checkpoints[-1] != conf.get("checkpoint_id")
        ):
            return None
        else:
            held.checkpoints.append(checkpoint_id)
        held.ops.append(op)
        held.ended = True
        return saved(config, checkpoint_id)

    def hold_writes(self, config: RunnableConfig, op: Any) -> bool:
        """Hold `op`, the writes of a step after the checkpoint `config` names, when they
        belong to a held run's steps up to its first node (START, if it has one, and the
        first node); else hold nothing."""
        conf = config["configurable"]
        held = self.get(str(conf["thread_id"]))
        if held is None or str(conf["checkpoint_id"]) not in held.checkpoints[: held.size - 1]:
            return False
        held.ops.append(op)
        held.ended = False
        return True


class AsyncInThreads(BaseCheckpointSaver[str]):
    """The methods both savers share around the steps they hold (put it before the saver in
    the bases), and their async twins, each running the sync method in a worker thread.

    The saver says how it writes (`_write`: what is held of a thread, then an operation
    `_put_op` or `_writes_op` makes) and how it translates its database's errors (`_errors`).
    It knows, by thread, the greatest checkpoint id the thread has on disk (`_known`; `""`
    when a read found nothing) and, for a saver that deletes with its next write, the
    greatest one deleted (`_deleted`: rows up to it are no longer read).

    What it can take in memory (no I/O: the first steps it holds) goes through the
    `_in_memory_*` hooks; the async twin then does it on the caller's thread, without the
    round trip through a worker thread (under many concurrent turns on one event loop, each
    hop waits for the GIL).
    """

    conn: Any

    def __init__(
        self, conn: Any, *args: Any, hold_first_steps: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(conn, *args, **kwargs)  # type: ignore[call-arg]
        self.hold_first_steps = hold_first_steps
        """Hold each run's first steps in memory (see the saver's class)."""
        self._held = HeldRuns()
        self._known: dict[str, str] = {}  # thread -> greatest checkpoint id it has on disk
        self._deleted: dict[str, str] = {}  # thread -> greatest checkpoint id deleted
        self._memory_lock = self._new_lock()
        """The lock the `_in_memory_*` hooks run under (`_in_memory`). The saver also holds
        it while it writes, so an async caller never waits for it on the event loop."""

    # -- what each saver fills in -----------------------------------------------------------
    def _new_lock(self) -> AbstractContextManager[bool]:
        """The saver's `_memory_lock`."""
        return threading.RLock()

    def _errors(self) -> AbstractContextManager[None]:
        """A failure of the database in the block, raised as stello's typed error."""
        raise NotImplementedError

    def _write(
        self, config: RunnableConfig | None, op: Any = None, checkpoint_id: str | None = None
    ) -> Any:
        """Write what is held of `config`'s thread (of every thread, and the deleted threads'
        rows, without one), then `op`, the write of checkpoint `checkpoint_id` when given;
        return `put`'s result (for a checkpoint)."""
        raise NotImplementedError

    def _put_op(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> Any:
        """The operation that writes the checkpoint, for `_write` (now or when held): the
        upstream saver's `put`, unless the saver has its own."""
        return functools.partial(super().put, config, checkpoint, metadata, new_versions)

    def _writes_op(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> Any:
        """The operation that writes a task's writes, as `_put_op`."""
        return functools.partial(super().put_writes, config, list(writes), task_id, task_path)

    # -- in memory --------------------------------------------------------------------------
    def _in_memory(self, hook: Callable[..., T], *args: Any, wait: bool) -> T | None:
        """`hook(*args)` under `_memory_lock`; with `wait=False`, `None` at once when the
        lock is taken (its holder may be writing, waiting for a database lock that a task
        of this very event loop holds: waiting here would stall the loop until a timeout)."""
        lock = cast("Any", self._memory_lock)
        if not lock.acquire(blocking=wait):
            return None
        try:
            return hook(*args)
        finally:
            lock.release()

    def unwritten(self, thread_id: str) -> bool:
        """Whether nothing of the thread is stored and a run's first steps are held in
        memory (those already asked for, and those still on their way from LangGraph's
        background writer): pruning the thread after a turn committed in its first step
        then touches the database not at all.

        Never waits: while the saver writes (its lock taken) the answer is `False`, the safe
        one (the caller keeps the session held while it prunes). It is asked as a turn
        commits, on the event loop of an async turn, where waiting for a writer that waits
        for a database lock held by a task of that loop would stall the loop until the
        database's busy timeout."""
        return bool(self._in_memory(self._unwritten, str(thread_id), wait=False))

    def _unwritten(self, thread_id: str) -> bool:
        return self.hold_first_steps and not self._known.get(thread_id)

    def ended(self, thread_id: str) -> bool:
        """Whether the thread's run is held in memory and ended at its last checkpoint
        (`HeldRun.ended`: nothing of it is on disk, and it waits on no interrupt). Never
        waits for the saver's lock: `False` while the saver writes."""
        return bool(self._in_memory(self._held_ended, str(thread_id), wait=False))

    def _held_ended(self, thread_id: str) -> bool:
        held = self._held.get(thread_id)
        return held is not None and held.ended

    def _saw(self, thread: str, checkpoint_id: str) -> None:
        if checkpoint_id > self._known.get(thread, ""):
            self._known[thread] = checkpoint_id

    def _in_memory_put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig | None:
        """Take the checkpoint without I/O and return `put`'s result, or `None` (and change
        nothing) when it has to be written. Called under `_memory_lock`."""
        op = self._put_op(config, checkpoint, metadata, new_versions)
        on = self.hold_first_steps
        return self._held.hold_put(config, checkpoint["id"], metadata, new_versions, op, enabled=on)

    def _in_memory_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> bool:
        """Take the writes without I/O (`True`), or change nothing (`False`). Called under
        `_memory_lock`."""
        return self._held.hold_writes(config, self._writes_op(config, writes, task_id, task_path))

    def _in_memory_delete(self, thread_id: str) -> bool:
        """Delete the thread without I/O (`True`): a thread whose held run is all there is
        of it; else (`False`) drop what is held of it, its rows are to be deleted now.
        Called under `_memory_lock`."""
        held, known = self._held.pop(thread_id, None), self._known.pop(thread_id, None)
        return held is not None and not known

    # -- sync -------------------------------------------------------------------------------
    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        args = (config, checkpoint, metadata, new_versions)
        done = self._in_memory(self._in_memory_put, *args, wait=True)
        if done is not None:
            return done
        return cast("RunnableConfig", self._write(config, self._put_op(*args), checkpoint["id"]))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        args = (config, writes, task_id, task_path)
        if not self._in_memory(self._in_memory_writes, *args, wait=True):
            self._write(config, self._writes_op(*args))

    def flush(self) -> None:
        """Write everything held, and delete the deleted threads' rows, now."""
        self._write(None)

    def _flush_read(self, config: RunnableConfig | None) -> None:
        """Before a read: write what is held of `config`'s thread (everything, and the
        deleted threads' rows, when it names none)."""
        thread = thread_of(config)
        if thread is None or thread in self._held:
            self._write(config)

    def _hidden(self, found: _CheckpointTuple) -> bool:
        """Whether `found`, as read, is of a thread deleted since."""
        bound = self._deleted.get(thread_of(found.config) or "")
        return bound is not None and str(found.config["configurable"]["checkpoint_id"]) <= bound

    def get_tuple(self, config: RunnableConfig) -> _CheckpointTuple | None:
        with self._errors():
            self._flush_read(config)
            found = super().get_tuple(config)
        thread = thread_of(config)
        if thread is None:
            return found
        with self._memory_lock:
            if found is None:
                if not config["configurable"].get("checkpoint_id"):
                    self._known.setdefault(thread, "")  # nothing on disk: nothing to delete
                return None
            if self._hidden(found):
                return None
            self._saw(thread, str(found.config["configurable"]["checkpoint_id"]))
        return found

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[_CheckpointTuple]:
        with self._errors():
            self._flush_read(config)
            for found in super().list(config, filter=filter, before=before, limit=limit):
                if not self._hidden(found):
                    yield found

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """The history of `channels` as `get_tuple` reads the thread: what is held of it is
        written first; of a thread deleted since the saver's last write (its rows still on
        disk), upstream's walk over `get_tuple` replaces the saver's own query."""
        if thread_of(config) in self._deleted:
            return BaseCheckpointSaver.get_delta_channel_history(
                self, config=config, channels=channels
            )
        with self._errors():
            self._flush_read(config)
            return super().get_delta_channel_history(config=config, channels=channels)

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint and write of `thread_id`: what is held of it at once (see
        the saver's class for its rows)."""
        thread = str(thread_id)
        if not self._in_memory(self._in_memory_delete, thread, wait=True):
            with self._errors():
                super().delete_thread(thread)

    def close(self) -> None:
        """Write what is held (and delete the deleted threads' rows), then close the saver's
        connection (or connection pool). What could not be written is forgotten: closing
        again does nothing."""
        try:
            self.flush()
        finally:
            self._held.clear()
            self._deleted.clear()
            with self._errors():
                self.conn.close()

    # -- async ------------------------------------------------------------------------------
    @functools.cached_property
    def _calls(self) -> CallQueue:
        """The async calls that need a thread, run in order by one drain at a time: they
        serialise on the saver's one connection anyway, and the calls of a gathered round of
        turns then share one hand-off to a thread instead of one each."""
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
        args = (config, checkpoint, metadata, new_versions)
        done = self._in_memory(self._in_memory_put, *args, wait=False)
        if done is not None:
            return done
        return await self._calls.call(self.put, *args)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        args = (config, writes, task_id, task_path)
        if not self._in_memory(self._in_memory_writes, *args, wait=False):
            await self._calls.call(self.put_writes, *args)

    async def aflush(self) -> None:
        """Async twin of `flush` (write what the saver holds)."""
        await self._calls.call(self.flush)

    async def adelete_thread(self, thread_id: str) -> None:
        if not self._in_memory(self._in_memory_delete, str(thread_id), wait=False):
            await self._calls.call(self.delete_thread, thread_id)
