"""`StelloCompiledGraph`: what the compiled stello graph does at the edge of every run.

A new run's input that leaves out `session_id` clears it (`RUN_INPUTS`, see
`stello_graph.nodes._channels`), so no run inherits it from the run before it on the same
thread, even from one that failed. `messages` is the thread's conversation and lasts.

Time travel on a stello thread branches (see `stello_graph.nodes.entry`). A run from an
earlier checkpoint of the thread (a `checkpoint_id` that is not the thread's latest) is
flagged (`TRAVEL_KEY`): its turn goes on from a fork of the session at the turn that
checkpoint stands at, and the thread continues the fork. `update_state` of `messages` at a
checkpoint between turns is LangGraph's own; the next turn from it forks the same way. A
checkpoint in the middle of a turn (a model or tool step pending) cannot be branched from:
replaying or editing it is refused with `TimeTravelError` before anything is written, as is
an edit of any key but `messages`.

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

from stello_graph._flow import Call, Flow, arun, run
from stello_graph.errors import InvalidInputError, TimeTravelError
from stello_graph.nodes._channels import RUN_INPUTS
from stello_graph.nodes.deps import StelloRuntime
from stello_graph.nodes.entry import TRAVEL_KEY

__all__ = ["REPLAY_KEY", "StelloCompiledGraph", "allow_replay", "flagged", "fresh_input"]

REPLAY_KEY = "stello_allow_replay"
"""The `configurable` key that lets one run start from an earlier checkpoint."""


def flagged(config: RunnableConfig, key: str, value: Any = True) -> RunnableConfig:
    """`config` with `configurable[key] = value`."""
    return {**config, "configurable": {**(config.get("configurable") or {}), key: value}}


def allow_replay(config: RunnableConfig) -> RunnableConfig:
    """`config`, allowed to replay from the earlier checkpoint it names (see the module)."""
    return flagged(config, REPLAY_KEY)


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


def _between_turns(snapshot: Any) -> bool:
    """Whether a checkpoint is one a turn can start from: nothing pending, a run's input,
    or `enter` pending (a turn that has not found its session yet)."""
    next_ = tuple(snapshot.next)
    source = (snapshot.metadata or {}).get("source")
    return not next_ or source == "input" or next_ == ("enter",)


def _edits_of(supersteps: Any) -> None:
    """Refuse an edit of anything but `messages` (`TimeTravelError`)."""
    for superstep in supersteps:
        for update in superstep:
            values = update.values
            keys = sorted(values) if isinstance(values, Mapping) else None
            if keys is None or not set(keys) <= {"messages"}:
                raise TimeTravelError(
                    f"Editing {keys or type(values).__name__} with `update_state`",
                    "only `messages` of a stello thread can be edited (the next turn then "
                    "goes on from a fork of the session)",
                )


def _counted(running: AbstractContextManager[None], items: Iterator[Any]) -> Iterator[Any]:
    with running:
        yield from items


class StelloCompiledGraph(CompiledStateGraph[Any, Any, Any, Any]):
    """The compiled stello graph: a `CompiledStateGraph` whose runs start fresh and whose
    time travel branches (see the module docstring)."""

    def _travel(self, config: RunnableConfig | None) -> Flow[RunnableConfig | None]:
        """`config`, flagged when it replays an earlier checkpoint between turns."""
        conf, saver = (config or {}).get("configurable") or {}, self.checkpointer
        wanted, thread = conf.get("checkpoint_id"), conf.get("thread_id")
        if not wanted or thread is None or conf.get(REPLAY_KEY) is True or config is None:
            return config
        if not isinstance(saver, BaseCheckpointSaver):
            return config
        # the thread's latest checkpoint: a run from it continues the thread as usual
        query = {
            "configurable": {"thread_id": thread, "checkpoint_ns": conf.get("checkpoint_ns", "")}
        }
        latest = yield Call(saver.get_tuple, saver.aget_tuple, (query,))
        if latest is None or latest.config["configurable"].get("checkpoint_id") == str(wanted):
            return config
        yield from self._refuse_mid_turn(config, "Replaying")
        return flagged(config, TRAVEL_KEY)

    def _refuse_mid_turn(self, config: RunnableConfig, action: str) -> Flow[None]:
        """Refuse (`TimeTravelError`) a checkpoint in the middle of a turn."""
        snapshot = yield Call(self.get_state, self.aget_state, (config,))
        if not _between_turns(snapshot):
            pending = ", ".join(snapshot.next)
            raise TimeTravelError(
                f"{action} a checkpoint in the middle of a turn ({pending} pending)",
                "a turn can go on on a branch only from a checkpoint between turns",
            )

    def _running(self) -> AbstractContextManager[None] | None:
        """The count of a run on the runtime the graph was built on (`build_graph` keeps it
        on the builder, a field LangGraph keeps in every copy); `None` for a builder
        without one."""
        runtime = getattr(self.builder, "runtime", None)
        return runtime.running() if isinstance(runtime, StelloRuntime) else None

    def stream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[Any]:
        config = run(self._travel(config), None)
        items = super().stream(fresh_input(input), config, **kwargs)
        running = self._running()
        return items if running is None else _counted(running, items)

    async def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        config = await arun(self._travel(config), None)
        with self._running() or nullcontext():
            async for item in super().astream(fresh_input(input), config, **kwargs):
                yield item

    def bulk_update_state(self, config: RunnableConfig, supersteps: Any) -> RunnableConfig:
        _edits_of(supersteps)
        run(self._refuse_mid_turn(config, "Editing"), None)
        return super().bulk_update_state(config, supersteps)

    async def abulk_update_state(self, config: RunnableConfig, supersteps: Any) -> RunnableConfig:
        _edits_of(supersteps)
        await arun(self._refuse_mid_turn(config, "Editing"), None)
        return await super().abulk_update_state(config, supersteps)
