"""Tree-mode integration as LangGraph nodes: one level at a time, siblings in parallel.

    plan_tree -> [Send integrate_subtree per internal node of the deepest level]
              -> next_level -> [Send ... next level up] -> ... -> finish_tree

The nodes of one level run in parallel (LangGraph `Send` fan-out, one superstep); levels run in
sequence, bottom-up, so a parent always sees the summaries its children just made.
"""

from __future__ import annotations

from typing import Any, Literal

from langgraph.types import Send

from stello_graph._tree import TreePlan, aintegrate_node, aplan_tree, integrate_node, plan_tree
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
    """Router: one `Send` per internal node of the current level, or finish."""
    plan, step = state["tree_plan"], state["tree_step"]
    if step >= len(plan["levels"]):
        return "finish_tree"
    return [
        Send("integrate_subtree", {"node_id": n, "tree_plan": plan}) for n in plan["levels"][step]
    ]


def _announce(deps: StelloDeps, plan: TreePlan, node_id: str, result: IntegrationResult) -> State:
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
    return {"tree_results": {node_id: result.model_dump()}}


def _as_plan(raw: dict[str, Any]) -> TreePlan:
    return TreePlan(
        root_id=raw["root_id"], levels=raw["levels"], children=raw["children"], labels=raw["labels"]
    )


def make_integrate_subtree_node(deps: StelloDeps) -> StelloNode:
    """Node `integrate_subtree` (one per `Send`): integrate one node's direct children."""

    def integrate(task: State) -> State:
        plan = _as_plan(task["tree_plan"])
        fn = deps.integrate_function()
        result = integrate_node(deps.storage, plan, task["node_id"], fn)
        return {} if result is None else _announce(deps, plan, task["node_id"], result)

    async def aintegrate(task: State) -> State:
        plan = _as_plan(task["tree_plan"])
        fn = deps.integrate_function()
        result = await aintegrate_node(deps.storage, plan, task["node_id"], fn)
        return {} if result is None else _announce(deps, plan, task["node_id"], result)

    return StelloNode("integrate_subtree", integrate, aintegrate)


def make_finish_tree_node() -> StelloNode:
    """Node `finish_tree`: the run's output, `integration` with every node's result."""

    def finish(state: State) -> State:
        plan, results = state["tree_plan"], state.get("tree_results") or {}
        levels = sum(1 for level in plan["levels"] if any(n in results for n in level))
        return {
            "integration": {
                "mode": "tree",
                "root_id": plan["root_id"],
                "levels": levels,
                "results": results,
            }
        }

    async def afinish(state: State) -> State:
        return finish(state)

    return StelloNode("finish_tree", finish, afinish)
