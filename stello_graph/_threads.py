"""The checkpoint threads of an agent's turns, and the session lease around a graph run.

Each session's turns run on one checkpoint thread, `stello/{tree}/{session}` (escaped, so no
two trees sharing a checkpointer ever meet). Earlier versions named it
`stello:{tree}:{session}`; a turn left in flight there is found and finished on that thread.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import StateSnapshot

from stello_graph._flow import Call, Flow, arun, run
from stello_graph._ids import legacy_thread_id, thread_id
from stello_graph.checkpoints._threaded_saver import AsyncInThreads
from stello_graph.lease import Handback, SessionLeases
from stello_graph.models import Lease

__all__ = ["CheckpointThreads", "arun_held", "run_held"]


def thread_config(thread: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread}}


def _belongs(state: StateSnapshot, sid: str, *, in_flight: bool) -> bool:
    """Whether the state of a legacy thread is `sid`'s (a turn still in flight, if asked).

    The legacy id `stello:{tree}:{session}` is ambiguous, but for a given session id it names
    one tree only, so the session the state holds tells whose thread it is.
    """
    return state.values.get("session_id") == sid and (bool(state.next) or not in_flight)


class CheckpointThreads:
    """Which thread each session's turns run on; pruning and dropping them."""

    def __init__(
        self,
        graph: CompiledStateGraph[Any, Any, Any, Any],
        checkpointer: BaseCheckpointSaver[Any] | None,
        tree_id: str,
        *,
        prune: bool,
        hold: bool = False,
    ) -> None:
        self.graph, self.checkpointer, self.tree_id = graph, checkpointer, tree_id
        self.prune = prune
        self._holding = checkpointer if isinstance(checkpointer, AsyncInThreads) else None
        """The checkpointer, when it is one of stello's savers (which can hold runs)."""
        if hold and self._holding is not None:
            # the saver holds each run's first steps until the turn gets past its first model
            # step; `finished` / `_failed` then drop them (pruned) or write them (kept)
            self._holding.hold_first_steps = True
        self._found: dict[str, str] = {}  # session id -> its checkpoint thread, once looked up

    def config(self, sid: str) -> RunnableConfig:
        return thread_config(self._found.get(sid) or thread_id(self.tree_id, sid))

    def _legacy(self, sid: str) -> RunnableConfig:
        return thread_config(legacy_thread_id(self.tree_id, sid))

    def resolve(self, sid: str) -> None:
        """Look up once which thread `sid`'s turns run on (see `StelloAgent.config`)."""
        run(self._resolve(sid), None)

    async def aresolve(self, sid: str) -> None:
        """Async twin of `resolve`."""
        await arun(self._resolve(sid), None)

    def _resolve(self, sid: str) -> Flow[None]:
        saver, graph = self.checkpointer, self.graph
        if saver is None or sid in self._found:
            return
        found = thread_id(self.tree_id, sid)
        if (yield Call(saver.get_tuple, saver.aget_tuple, (thread_config(found),))) is None:
            legacy = yield Call(graph.get_state, graph.aget_state, (self._legacy(sid),))
            if _belongs(legacy, sid, in_flight=True):
                found = legacy_thread_id(self.tree_id, sid)
        self._found[sid] = found

    def prunes_in_memory(self, sid: str) -> bool:
        """Whether ending a turn of `sid` now (`finished`) would touch no checkpoint row on
        disk: no checkpointer, no pruning, or a saver that holds the whole run so far in
        memory (`unwritten`). Then the session need not stay held while the run is pruned."""
        if self.checkpointer is None or not self.prune:
            return True
        saver = self._holding
        return saver is not None and saver.unwritten(self.config(sid)["configurable"]["thread_id"])

    def finished(self, sid: str, interrupted: bool) -> None:
        """A turn of `sid` ended: prune its thread (if asked); next turns use the new id.

        A turn that waits on an interrupt keeps its thread, written out now."""
        run(self._finished(sid, interrupted), None)

    async def afinished(self, sid: str, interrupted: bool) -> None:
        """Async twin of `finished`."""
        await arun(self._finished(sid, interrupted), None)

    def _finished(self, sid: str, interrupted: bool) -> Flow[None]:
        saver = self.checkpointer
        if interrupted:
            yield from self._failed()
        elif saver is not None:
            thread = self.config(sid)["configurable"]["thread_id"]
            if self.prune:
                yield Call(saver.delete_thread, saver.adelete_thread, (thread,))
            self._found[sid] = thread_id(self.tree_id, sid)

    def _failed(self) -> Flow[None]:
        """A run stopped before its turn ended (an error, an interrupt): write out what the
        saver holds, so that the turn can be resumed (`StelloSqliteSaver.flush`)."""
        if self._holding is not None:
            yield Call(self._holding.flush, self._holding.aflush)

    def ended_in_memory(self, sid: str) -> bool:
        """Whether `sid`'s run is held in memory and ended at its last checkpoint (nothing
        written after it, so no interrupt): a stream then ends the turn without reading
        the thread, which would write every held step first (the agent's own savers hold
        runs)."""
        saver = self._holding
        return saver is not None and saver.ended(self.config(sid)["configurable"]["thread_id"])

    @contextmanager
    def running(self, sid: str, back: Handback) -> Iterator[None]:
        """Around a graph run (of `sid`, lent its lease with `back`): `_failed()` when it
        raises before its turn's commit. One that raises after (`back.committed`: a
        checkpoint write that failed) ended a stored turn: its thread is pruned as
        `finished` prunes it, as far as the saver still can (what it leaves is a turn in
        flight that a resume finds stored, and that the session's next turn replaces)."""
        try:
            yield
        except BaseException:
            run(self._raised(sid, back), None)
            raise

    @asynccontextmanager
    async def arunning(self, sid: str, back: Handback) -> AsyncIterator[None]:
        """Async twin of `running`."""
        try:
            yield
        except BaseException:
            await arun(self._raised(sid, back), None)
            raise

    def _raised(self, sid: str, back: Handback) -> Flow[None]:
        if back.committed is not None:
            with suppress(Exception):
                yield from self._finished(sid, False)
        else:
            yield from self._failed()

    def drop(self, sid: str) -> None:
        """Delete the checkpoint threads of a removed session (the legacy one if it is its)."""
        run(self._drop(sid), None)

    async def adrop(self, sid: str) -> None:
        """Async twin of `drop`."""
        await arun(self._drop(sid), None)

    def _drop(self, sid: str) -> Flow[None]:
        self._found.pop(sid, None)
        saver, graph = self.checkpointer, self.graph
        if saver is None:
            return
        yield Call(saver.delete_thread, saver.adelete_thread, (thread_id(self.tree_id, sid),))
        legacy = yield Call(graph.get_state, graph.aget_state, (self._legacy(sid),))
        if _belongs(legacy, sid, in_flight=False):
            yield Call(
                saver.delete_thread, saver.adelete_thread, (legacy_thread_id(self.tree_id, sid),)
            )


@contextmanager
def run_held(
    leases: SessionLeases, sid: str, handback: Handback | None = None, *, prefetch: bool = False
) -> Iterator[Lease]:
    """Hold the session for a whole run (its checkpoint thread included: pruning it must not
    race another agent's run), lending the lease to the graph's nodes. With `handback`, the
    turn's commit may free the lease in its own transaction when the handback allows it
    (pruning the run will touch nothing on disk); with `prefetch` too, the session is read
    with its lease for the run's opening step, and refused if missing or archived."""
    hold = leases.hold(sid, handback=handback, prefetch=prefetch)
    with hold as lease, leases.lending(lease, handback):
        yield lease


@asynccontextmanager
async def arun_held(
    leases: SessionLeases, sid: str, handback: Handback | None = None, *, prefetch: bool = False
) -> AsyncIterator[Lease]:
    """Async twin of `run_held`."""
    async with leases.ahold(sid, handback=handback, prefetch=prefetch) as lease:
        with leases.lending(lease, handback):
            yield lease
