"""The topology edges as nodes: fork, consolidate, integrate, and the router at START.

A graph built by `build_stello_graph` runs a turn for `{"session_id", "input"}` and one of
these operations for `{"op": "fork" | "consolidate" | "integrate", ...}`:

* `fork`: `{"op": "fork", "session_id": source, "fork": {"label": ..., ...}}` writes the
  child session and its TopologyNode in one transaction -> `{"forked": {...}}`.
* `consolidate`: `{"op": "consolidate", "session_id": ...}` -> `{"l2": ...}`.
* `integrate`: `{"op": "integrate"}` reads the children's L2, writes the synthesis and the
  insights -> `{"integration": {"synthesis": ..., "insights": {...}}}`.
"""

from __future__ import annotations

from typing import Any, Literal

from stello_graph._fork import ForkRequest, afork_session, fork_session
from stello_graph._validate import check_id
from stello_graph.errors import InvalidInputError, MainSessionNotFoundError
from stello_graph.events import emit
from stello_graph.main_session import MainSession
from stello_graph.models import IntegrationResult, SessionMeta
from stello_graph.nodes._runnable import StelloNode
from stello_graph.nodes.deps import StelloDeps
from stello_graph.nodes.forking import afork_request, fork_request
from stello_graph.nodes.scheduling import (
    aconsolidate_now,
    aintegrate_flat,
    consolidate_now,
    integrate_flat,
)

__all__ = [
    "OPS",
    "make_consolidate_node",
    "make_fork_node",
    "make_integrate_node",
    "route_start",
]

State = dict[str, Any]
OPS = ("turn", "fork", "consolidate", "integrate")


def route_start(
    state: State,
) -> Literal["assemble", "fork", "consolidate", "integrate", "plan_tree"]:
    """Router at START: a turn unless the input names another operation in `op`.

    `{"op": "integrate", "mode": "tree"}` integrates level by level (`stello_graph.nodes.tree`).
    """
    op = state.get("op") or "turn"
    if op == "turn":
        return "assemble"
    if op == "integrate":
        mode = state.get("mode") or "flat"
        if mode not in ("flat", "tree"):
            raise InvalidInputError(f"Unknown integration mode {mode!r}; use 'flat' or 'tree'.")
        return "plan_tree" if mode == "tree" else "integrate"
    if op in ("fork", "consolidate"):
        return op  # type: ignore[return-value]
    raise InvalidInputError(f"Unknown op {op!r}; use one of {list(OPS)}.")


# -- fork -----------------------------------------------------------------------------------
def _spec(state: State) -> tuple[str, dict[str, Any]]:
    spec = state.get("fork")
    if not isinstance(spec, dict) or "label" not in spec:
        raise InvalidInputError('A fork needs "fork": {"label": ..., ...} in the input.')
    return check_id(state.get("session_id")), spec


def _forked(deps: StelloDeps, req: ForkRequest, meta: SessionMeta) -> State:
    emit(deps.bus, "session_forked", meta.id, parent_id=req.source_id, label=meta.label, by="user")
    return {"forked": {"session_id": meta.id, "label": meta.label, "parent_id": req.source_id}}


def make_fork_node(deps: StelloDeps) -> StelloNode:
    """Node `fork`: create a child session and its TopologyNode atomically."""

    def fork(state: State) -> State:
        req = fork_request(deps, *_spec(state))
        return _forked(deps, req, fork_session(deps.storage, req))

    async def afork(state: State) -> State:
        req = await afork_request(deps, *_spec(state))
        return _forked(deps, req, await afork_session(deps.storage, req))

    return StelloNode("fork", fork, afork)


# -- consolidate ----------------------------------------------------------------------------
def make_consolidate_node(deps: StelloDeps) -> StelloNode:
    """Node `consolidate`: L3 -> L2 for `state["session_id"]`."""

    def consolidate(state: State) -> State:
        return {"l2": consolidate_now(deps, state["session_id"])}

    async def aconsolidate(state: State) -> State:
        return {"l2": await aconsolidate_now(deps, state["session_id"])}

    return StelloNode("consolidate", consolidate, aconsolidate)


# -- integrate ------------------------------------------------------------------------------
def _integrated(result: IntegrationResult) -> State:
    return {
        "integration": {
            "mode": "flat",
            "synthesis": result.synthesis,
            "insights": dict(result.insights),
        }
    }


def make_integrate_node(deps: StelloDeps) -> StelloNode:
    """Node `integrate`: every active child's L2 -> synthesis + insights (flat)."""

    def integrate(state: State) -> State:
        meta = deps.storage.get_main_session()
        if meta is None:
            raise MainSessionNotFoundError(deps.storage.tree_id)
        main = deps.session(meta.id)
        assert isinstance(main, MainSession)
        return _integrated(integrate_flat(deps, main))

    async def aintegrate(state: State) -> State:
        meta = await deps.storage.aget_main_session()
        if meta is None:
            raise MainSessionNotFoundError(deps.storage.tree_id)
        main = await deps.asession(meta.id)
        assert isinstance(main, MainSession)
        return _integrated(await aintegrate_flat(deps, main))

    return StelloNode("integrate", integrate, aintegrate)
