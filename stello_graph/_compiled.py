"""`StelloCompiledGraph`: what the compiled stello graph does at the edge of every run.

A new run's input that leaves out `session_id` clears it (`RUN_INPUTS`, see
`stello_graph.nodes._channels`), so no run inherits it from the run before it on the same
thread, even from one that failed. `messages` is the thread's conversation and lasts.

Time travel on a stello thread is refused, with a `TimeTravelError` that says what to do.

LangGraph can replay a thread from an earlier checkpoint (a run whose config names a
`checkpoint_id` that is not the thread's latest) and edit a thread's state
(`update_state`). For a stello turn both would diverge from the session: its L3 is written
by committed turns, not by checkpoints, so a replayed turn would re-ask the model for a turn
that is already in L3 (or append a second copy of it after the turns that followed), and an
edited state would commit records the session never had. The compiled stello graph refuses
both; going back to an earlier turn is a fork of the session at that turn.

Reading the history (`get_state`, `get_state_history`) and continuing the latest checkpoint
(`Command(resume=...)`, or `None` after a crash, with or without its own `checkpoint_id`)
work as usual. A recovery tool that re-runs a step on purpose, knowing the turn's commit is
idempotent, names `configurable[REPLAY_KEY] = True` (`allow_replay(config)`).

A run of the compiled graph of `build_graph` is counted on the graph's runtime while it runs
(`StelloRuntime.running`, found through the graph's builder), so a server that closes idle
trees never closes one under a run.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph.state import CompiledStateGraph

from stello_graph.errors import InvalidInputError, TimeTravelError
from stello_graph.nodes._channels import RUN_INPUTS
from stello_graph.nodes.deps import StelloRuntime

__all__ = ["REPLAY_KEY", "StelloCompiledGraph", "allow_replay", "fresh_input"]

REPLAY_KEY = "stello_allow_replay"
"""The `configurable` key that lets one run start from an earlier checkpoint."""


def allow_replay(config: RunnableConfig) -> RunnableConfig:
    """`config`, allowed to replay from the earlier checkpoint it names (see the module)."""
    return {**config, "configurable": {**(config.get("configurable") or {}), REPLAY_KEY: True}}


_REPLAY = "Replaying a run from an earlier checkpoint"
_EDIT = "Editing the state with `update_state`"


def _latest_query(config: RunnableConfig | None) -> tuple[str, RunnableConfig] | None:
    """The checkpoint a run asks to start from, and the query of its thread's latest."""
    conf = (config or {}).get("configurable") or {}
    wanted = conf.get("checkpoint_id")
    if not wanted or conf.get("thread_id") is None or conf.get(REPLAY_KEY) is True:
        return None
    query: RunnableConfig = {
        "configurable": {
            "thread_id": conf["thread_id"],
            "checkpoint_ns": conf.get("checkpoint_ns", ""),
        }
    }
    return str(wanted), query


def _check_turn(input: Mapping[str, Any]) -> None:
    given = [key for key in ("input", "messages") if input.get(key) is not None]
    if len(given) == 2:
        raise InvalidInputError('A turn takes "input" or "messages", not both.')
    if not given:
        raise InvalidInputError(
            'A turn needs "input" (with "session_id") or "messages"; the input has neither.'
        )


def fresh_input(input: Any) -> Any:
    """A new run's input, with `None` for each run input it leaves out (which clears it).

    Raises:
        InvalidInputError: a turn given both `input` and `messages`, or neither (the
            state's `messages` is the thread's conversation: only the input tells).
    """
    if isinstance(input, Mapping):
        if (input.get("op") or "turn") == "turn":
            _check_turn(input)
        return {**dict.fromkeys(RUN_INPUTS), **input}
    return input  # a `Command`, or `None` (continue the latest checkpoint)


def _is_latest(wanted: str, latest: Any) -> bool:
    return latest is None or latest.config["configurable"].get("checkpoint_id") == wanted


class StelloCompiledGraph(CompiledStateGraph[Any, Any, Any, Any]):
    """The compiled stello graph: a `CompiledStateGraph` whose runs start fresh and that
    refuses time travel (see the module docstring)."""

    def _saver(self) -> BaseCheckpointSaver[Any] | None:
        saver = self.checkpointer
        return saver if isinstance(saver, BaseCheckpointSaver) else None

    def _refuse_replay(self, config: RunnableConfig | None) -> None:
        found, saver = _latest_query(config), self._saver()
        if found is not None and saver is not None:
            wanted, query = found
            if not _is_latest(wanted, saver.get_tuple(query)):
                raise TimeTravelError(_REPLAY)

    async def _arefuse_replay(self, config: RunnableConfig | None) -> None:
        found, saver = _latest_query(config), self._saver()
        if found is not None and saver is not None:
            wanted, query = found
            if not _is_latest(wanted, await saver.aget_tuple(query)):
                raise TimeTravelError(_REPLAY)

    def _runtime(self) -> StelloRuntime | None:
        """The runtime the graph was built on (`build_graph` keeps it on the builder, a
        field LangGraph keeps in every copy); `None` for a builder without one."""
        found = getattr(self.builder, "runtime", None)
        return found if isinstance(found, StelloRuntime) else None

    def _running(self) -> AbstractContextManager[None]:
        runtime = self._runtime()
        return nullcontext() if runtime is None else runtime.running()

    def stream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[Any]:
        self._refuse_replay(config)
        run = super().stream(fresh_input(input), config, **kwargs)
        return run if self._runtime() is None else self._counted(run)

    def _counted(self, run: Iterator[Any]) -> Iterator[Any]:
        with self._running():
            yield from run

    async def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        await self._arefuse_replay(config)
        with self._running():
            async for item in super().astream(fresh_input(input), config, **kwargs):
                yield item

    def bulk_update_state(self, *args: Any, **kwargs: Any) -> RunnableConfig:
        raise TimeTravelError(_EDIT)

    async def abulk_update_state(self, *args: Any, **kwargs: Any) -> RunnableConfig:
        raise TimeTravelError(_EDIT)

    def update_state(self, *args: Any, **kwargs: Any) -> RunnableConfig:
        raise TimeTravelError(_EDIT)

    async def aupdate_state(self, *args: Any, **kwargs: Any) -> RunnableConfig:
        raise TimeTravelError(_EDIT)
