"""The topology edges as nodes: fork, consolidate, integrate, and the router at START.

A graph built by `build_stello_graph` runs a turn for `{"session_id", "input"}` (or
`{"messages": [...]}`, see `stello_graph.nodes.entry`) and one of these operations for
`{"op": "fork" | "consolidate" | "integrate", ...}`:

* `fork`: `{"op": "fork", "session_id": source, "fork": {"label": ..., ...}}` writes the
  child session and its TopologyNode in one transaction -> `{"forked": {...}}`.
* `consolidate`: `{"op": "consolidate", "session_id": ...}` -> `{"l2": ...}`.
* `integrate`: `{"op": "integrate"}` reads the children's L2, writes the synthesis and the
  insights -> `{"integration": {"synthesis": ..., "insights": {...}}}`.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Literal

from langchain_core.runnables import RunnableConfig

from stello_graph._flow import Call, Flow, Storage, arun, run
from stello_graph._fork import ForkRequest, afork_session, fork_session
from stello_graph._validate import check_id
from stello_graph.errors import InvalidInputError, MainSessionNotFoundError
from stello_graph.events import emit
from stello_graph.main_session import MainSession
from stello_graph.models import IntegrationResult, SessionMeta
from stello_graph.nodes._runnable import StelloNode
from stello_graph.nodes.deps import StelloRuntime
from stello_graph.nodes.entry import TRAVEL_KEY, needs_entry
from stello_graph.nodes.forking import afork_request, fork_request
from stello_graph.nodes.scheduling import (
    aconsolidate_now,
    aintegrate_flat,
    consolidate_now,
    integrate_flat,
)
from stello_graph.nodes.state import (
    ConsolidateState,
    ForkState,
    IntegrateState,
    TreeState,
    TurnState,
)
from stello_graph.storage import MainStorage

__all__ = [
    "OPS",
    "make_consolidate_node",
    "make_fork_node",
    "make_integrate_node",
    "route_start",
    "run_fork",
    "arun_fork",
    "run_integrate",
    "arun_integrate",
]


class StelloRouted(TurnState, ForkState, TreeState, total=False):
    """What `route_start` reads: `op`, `mode` for integrations, a turn's input keys."""


OPS = ("turn", "fork", "consolidate", "integrate")


def route_start(
    state: StelloRouted, config: RunnableConfig
) -> Literal["enter", "model", "fork", "consolidate", "integrate", "plan_tree"]:
    """Router at START: a turn unless the input names another operation in `op`.

    A turn given as `messages`, or without a `session_id`, first goes through `enter`
    (`stello_graph.nodes.entry`), as does every turn of a run from an earlier checkpoint
    (`TRAVEL_KEY`: it may go on from a fork). `{"op": "integrate", "mode": "tree"}`
    integrates level by level (`stello_graph.nodes.tree`).
    """
    op = state.get("op") or "turn"
    if op == "turn":  # a turn given both "input" and "messages" is refused by `fresh_input`
        travel = (config.get("configurable") or {}).get(TRAVEL_KEY) is True
        return "enter" if travel or needs_entry(state) else "model"
    if op == "integrate":
        mode = state.get("mode") or "flat"
        if mode not in ("flat", "tree"):
            raise InvalidInputError(f"Unknown integration mode {mode!r}; use 'flat' or 'tree'.")
        return "plan_tree" if mode == "tree" else "integrate"
    if op in ("fork", "consolidate"):
        return op
    raise InvalidInputError(f"Unknown op {op!r}; use one of {list(OPS)}.")


# -- fork -----------------------------------------------------------------------------------
# Each operation is a pair of functions (sync, async) the node calls and `StelloAgent` calls
# too: one code path, with or without a graph run around it.
def _spec(state: ForkState) -> tuple[str, dict[str, Any]]:
    spec = state.get("fork")
    if not isinstance(spec, dict) or "label" not in spec:
        raise InvalidInputError('A fork needs "fork": {"label": ..., ...} in the input.')
    return check_id(state.get("session_id")), spec


def _forked(deps: StelloRuntime, req: ForkRequest, meta: SessionMeta) -> ForkState:
    emit(deps.bus, "session_forked", meta.id, parent_id=req.source_id, label=meta.label, by="user")
    return {"forked": {"session_id": meta.id, "label": meta.label, "parent_id": req.source_id}}


def run_fork(deps: StelloRuntime, state: ForkState) -> ForkState:
    """The `fork` operation: the child session and its TopologyNode, in one transaction."""
    req = fork_request(deps, *_spec(state))
    return _forked(deps, req, fork_session(deps.storage, req))


async def arun_fork(deps: StelloRuntime, state: ForkState) -> ForkState:
    """Async twin of `run_fork`."""
    req = await afork_request(deps, *_spec(state))
    return _forked(deps, req, await afork_session(deps.storage, req))


def make_fork_node(deps: StelloRuntime) -> StelloNode:
    """Node `fork`: create a child session and its TopologyNode atomically."""

    return StelloNode("fork", partial(run_fork, deps), partial(arun_fork, deps))


# -- consolidate ----------------------------------------------------------------------------
def _consolidated(state: ConsolidateState) -> str:
    if not state.get("session_id"):
        raise InvalidInputError('"op": "consolidate" needs the "session_id" to consolidate.')
    return check_id(state.get("session_id"))


def make_consolidate_node(deps: StelloRuntime) -> StelloNode:
    """Node `consolidate`: L3 -> L2 for `state["session_id"]` (`consolidate_now`)."""

    def consolidate(state: ConsolidateState) -> ConsolidateState:
        return {"l2": consolidate_now(deps, _consolidated(state))}

    async def aconsolidate(state: ConsolidateState) -> ConsolidateState:
        return {"l2": await aconsolidate_now(deps, _consolidated(state))}

    return StelloNode("consolidate", consolidate, aconsolidate)


# -- integrate ------------------------------------------------------------------------------
def run_integrate(deps: StelloRuntime) -> IntegrateState:
    """The flat `integrate` operation: every active child's L2 -> synthesis + insights."""
    return run(_integrate(deps), deps.storage)


async def arun_integrate(deps: StelloRuntime) -> IntegrateState:
    """Async twin of `run_integrate`."""
    return await arun(_integrate(deps), deps.storage)


def _integrate(deps: StelloRuntime) -> Flow[IntegrateState]:
    meta = yield Storage(MainStorage.get_main_session)
    if meta is None:
        raise MainSessionNotFoundError(deps.storage.tree_id)
    main = yield Call(deps.session, deps.asession, (meta.id,))
    assert isinstance(main, MainSession)
    result: IntegrationResult = yield Call(integrate_flat, aintegrate_flat, (deps, main))
    return {
        "integration": {
            "mode": "flat",
            "synthesis": result.synthesis,
            "insights": dict(result.insights),
        }
    }


def make_integrate_node(deps: StelloRuntime) -> StelloNode:
    """Node `integrate`: every active child's L2 -> synthesis + insights (flat)."""

    def integrate(state: IntegrateState) -> IntegrateState:
        return run_integrate(deps)

    async def aintegrate(state: IntegrateState) -> IntegrateState:
        return await arun_integrate(deps)

    return StelloNode("integrate", integrate, aintegrate)
