"""The checkpoint threads of an agent's turns.

Each session's turns run on one checkpoint thread, `stello/{tree}/{session}` (escaped, so no
two trees sharing a checkpointer ever meet). Earlier versions named it
`stello:{tree}:{session}`; a turn left in flight there is found and finished on that thread.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import START
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import StateSnapshot, StateUpdate

from stello_graph._compiled import fresh_input
from stello_graph._flow import Call, Flow
from stello_graph._ids import legacy_thread_id, thread_id

__all__ = ["CheckpointThreads"]


def thread_config(thread: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread}}


class CheckpointThreads:
    """Which thread each session's turns run on; writing a turn to it, pruning and dropping
    them."""

    def __init__(
        self,
        graph: CompiledStateGraph[Any, Any, Any, Any],
        checkpointer: BaseCheckpointSaver[Any] | None,
        tree_id: str,
        *,
        prune: bool,
    ) -> None:
        self.graph, self.checkpointer, self.tree_id = graph, checkpointer, tree_id
        self.prune = prune
        self._found: dict[str, str] = {}  # session id -> its checkpoint thread, once looked up
        self._left_empty: dict[str, int] = {}
        """Session id -> the token of the lease under which this agent's last turn left the
        session's thread empty (its first round committed a reply without tools)."""

    def config(self, sid: str) -> RunnableConfig:
        return thread_config(self._found.get(sid) or thread_id(self.tree_id, sid))

    def _legacy(self, sid: str, *, in_flight: bool) -> Flow[bool]:
        """Whether the legacy thread of `sid` is its (holding a turn in flight, if asked).

        The legacy id `stello:{tree}:{session}` is ambiguous, but for a given session id it
        names one tree only, so the session its state holds tells whose thread it is.
        """
        graph, config = self.graph, thread_config(legacy_thread_id(self.tree_id, sid))
        state: StateSnapshot = yield Call(graph.get_state, graph.aget_state, (config,))
        return state.values.get("session_id") == sid and (bool(state.next) or not in_flight)

    def left_empty(self, sid: str, token: int) -> None:
        """This agent's turn under the lease `token` left `sid`'s thread empty."""
        self._left_empty[sid] = token

    def resolve(self, sid: str, fresh: bool = False, token: int | None = None) -> Flow[bool]:
        """Look up once which thread `sid`'s turns run on (see `StelloAgent.config`); with
        `fresh`, read each time whether it holds nothing (no turn in flight): the answer.
        No read is needed under the lease `token` right after the one under which this agent
        left the thread empty (`left_empty`): every turn writes the thread under the
        session's lease, and whoever took it since would have moved the token on."""
        saver, known = self.checkpointer, self._found.get(sid)
        if saver is None or (known is not None and not fresh):
            return saver is None
        left = self._left_empty.pop(sid, None)
        if known is not None and token is not None and left == token - 1:
            return True
        found = known or thread_id(self.tree_id, sid)
        empty = (yield Call(saver.get_tuple, saver.aget_tuple, (thread_config(found),))) is None
        if empty and known is None and (yield from self._legacy(sid, in_flight=True)):
            found, empty = legacy_thread_id(self.tree_id, sid), False
        self._found[sid] = found
        return empty

    def seed(self, sid: str, payload: Any, update: Any = None) -> Flow[None]:
        """Write a turn that ran its first round without the checkpointer to `sid`'s thread:
        its input, and the first round's `update` (a reply that asks for tools), as if the
        graph had run them; without `update` (the round failed) the turn waits there for
        `resume`, which runs its first round again."""
        if update is None:
            steps = [[StateUpdate(fresh_input(payload), START)]]
        else:  # the state after the round: the input's keys but its session are cleared by then
            steps = [[StateUpdate({"session_id": sid, **update}, "model")]]
        graph = self.graph  # LangGraph's own update: the turn is written as the graph runs it
        write = partial(CompiledStateGraph.bulk_update_state, graph)
        awrite = partial(CompiledStateGraph.abulk_update_state, graph)
        yield Call(write, awrite, (self.config(sid), steps))

    def finished(self, sid: str, interrupted: bool, token: int | None = None) -> Flow[None]:
        """A turn of `sid` ended on its thread: prune it (if asked); next turns use the new
        id. A turn that waits on an interrupt keeps its thread. A turn under the lease
        `token` that pruned its thread left it empty (`left_empty`)."""
        saver = self.checkpointer
        if saver is not None and not interrupted:
            thread = self.config(sid)["configurable"]["thread_id"]
            if self.prune:
                yield Call(saver.delete_thread, saver.adelete_thread, (thread,))
                if token is not None:
                    self.left_empty(sid, token)
            self._found[sid] = thread_id(self.tree_id, sid)

    def drop(self, sid: str) -> Flow[None]:
        """Delete the checkpoint threads of a removed session (the legacy one if it is its)."""
        self._found.pop(sid, None)
        saver = self.checkpointer
        if saver is None:
            return
        yield Call(saver.delete_thread, saver.adelete_thread, (thread_id(self.tree_id, sid),))
        if (yield from self._legacy(sid, in_flight=False)):
            yield Call(
                saver.delete_thread, saver.adelete_thread, (legacy_thread_id(self.tree_id, sid),)
            )
