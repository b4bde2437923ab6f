"""Tree-mode integration as LangGraph nodes: one level at a time, siblings in parallel.

    plan_tree -> [Send integrate_subtree per internal node of the deepest level]
              -> next_level -> [Send ... next level up] -> ... -> finish_tree

The nodes of one level run in parallel (LangGraph `Send` fan-out, one superstep); levels run in
sequence, bottom-up, so a parent always sees the summaries its children just made. Those are
passed up in the state (`tree_results`), not through storage: `finish_tree` writes every
node's result in one transaction, so a run that fails at any level writes nothing, and the
`integrated` / `insight_pushed` events are emitted only once it is written.
"""

from __future__ import annotations

from typing import Any, Literal

from langgraph.types import Send

from stello_graph._tree import (
    TreePlan,
    aintegrate_node,
    aplan_tree,
    awrite_tree,
    integrate_node,
    plan_tree,
    write_tree,
)
from stello_graph.events import emit
from stello_graph.models import IntegrationResult
from stello_graph.nodes._runnable import StelloNode
from stello_graph.nodes.deps import StelloDeps
from stello_graph.nodes.scheduling import publish

__all__ = [
    "make_finish_tree_node",
    "make_integrate_subtree_node",
    "make_next_level_node",
    "make_plan_tree_node",
    "merge_results",
    "route_level",
]

State = dict[str, Any]


def merge_results(left: dict[str, Any] | None, right: dict[str, Any] | None) -> dict[str, Any]:
    """Reducer of `tree_results`: merge each node's result; `None` starts over."""
    if right is None:
        return {}
    return {**(left or {}), **right}


def _plan_state(plan: TreePlan) -> State:
    return {
        "tree_plan": {
            "root_id": plan.root_id,
            "levels": plan.levels,
            "children": plan.children,
            "labels": plan.labels,
        },
        "tree_step": 0,
        "tree_results": None,
    }


def make_plan_tree_node(deps: StelloDeps) -> StelloNode:
    """Node `plan_tree`: read the active tree and group its internal nodes by level."""

    def plan(state: State) -> State:
        return _plan_state(plan_tree(deps.storage))

    async def aplan(state: State) -> State:
        return _plan_state(await aplan_tree(deps.storage))

    return StelloNode("plan_tree", plan, aplan)


def make_next_level_node() -> StelloNode:
    """Node `next_level`: move one level up the tree."""

    def step(state: State) -> State:
        return {"tree_step": state["tree_step"] + 1}

    async def astep(state: State) -> State:
        return step(state)

    return StelloNode("next_level", step, astep)


def route_level(state: State) -> list[Send] | Literal["finish_tree"]:
    """Router: one `Send` per internal node of the current level, or finish.

    Each carries the subtree syntheses the levels below made in this run (`made`).
    """
    plan, step = state["tree_plan"], state["tree_step"]
    if step >= len(plan["levels"]):
        return "finish_tree"
    results = state.get("tree_results") or {}
    made = {node_id: result["synthesis"] for node_id, result in results.items()}
    return [
        Send("integrate_subtree", {"node_id": n, "tree_plan": plan, "made": made})
        for n in plan["levels"][step]
    ]


def _announce(deps: StelloDeps, plan: TreePlan, node_id: str, result: IntegrationResult) -> None:
    root = node_id == plan.root_id
    emit(deps.bus, "integrated", node_id, synthesis=result.synthesis,
         insights=len(result.insights), mode="tree")  # fmt: skip
    if root:
        publish(deps, ("synthesis",), node_id, {"synthesis": result.synthesis})
    else:
        publish(deps, ("subtree",), node_id, {"synthesis": result.synthesis})
    for session_id, insight in result.insights.items():
        emit(deps.bus, "insight_pushed", session_id, insight=insight, by=node_id)
        publish(deps, ("insights",), session_id, {"insight": insight})


def _result(node_id: str, result: IntegrationResult | None) -> State:
    return {} if result is None else {"tree_results": {node_id: result.model_dump()}}


def _as_plan(raw: dict[str, Any]) -> TreePlan:
    return TreePlan(
        root_id=raw["root_id"], levels=raw["levels"], children=raw["children"], labels=raw["labels"]
    )


def make_integrate_subtree_node(deps: StelloDeps) -> StelloNode:
    """Node `integrate_subtree` (one per `Send`): integrate one node's direct children.

    Writes nothing; its result joins `tree_results`, which `finish_tree` writes.
    """

    def integrate(task: State) -> State:
        plan, node_id = _as_plan(task["tree_plan"]), task["node_id"]
        fn = deps.integrate_function()
        return _result(node_id, integrate_node(deps.storage, plan, node_id, fn, task.get("made")))

    async def aintegrate(task: State) -> State:
        plan, node_id = _as_plan(task["tree_plan"]), task["node_id"]
        fn = deps.integrate_function()
        made = task.get("made")
        return _result(node_id, await aintegrate_node(deps.storage, plan, node_id, fn, made))

    return StelloNode("integrate_subtree", integrate, aintegrate)


def _results(state: State) -> dict[str, IntegrationResult]:
    raw = state.get("tree_results") or {}
    return {node_id: IntegrationResult.model_validate(r) for node_id, r in raw.items()}


def _finished(deps: StelloDeps, state: State, results: dict[str, IntegrationResult]) -> State:
    plan = _as_plan(state["tree_plan"])
    for level in plan.levels:  # announced bottom-up, as they were made
        for node_id in level:
            if node_id in results:
                _announce(deps, plan, node_id, results[node_id])
    levels = sum(1 for level in plan.levels if any(n in results for n in level))
    return {
        "integration": {
            "mode": "tree",
            "root_id": plan.root_id,
            "levels": levels,
            "results": {node_id: r.model_dump() for node_id, r in results.items()},
        }
    }


def make_finish_tree_node(deps: StelloDeps) -> StelloNode:
    """Node `finish_tree`: write every node's result in one transaction, announce them, and
    return `integration` with every node's result."""

    def finish(state: State) -> State:
        results = _results(state)
        write_tree(deps.storage, _as_plan(state["tree_plan"]), results)
        return _finished(deps, state, results)

    async def afinish(state: State) -> State:
        results = _results(state)
        await awrite_tree(deps.storage, _as_plan(state["tree_plan"]), results)
        return _finished(deps, state, results)

    return StelloNode("finish_tree", finish, afinish)
