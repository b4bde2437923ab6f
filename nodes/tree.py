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

import asyncio
import contextvars
import dataclasses
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, ParamSpec, TypeVar

from langgraph.types import Send

from stello_graph._flow import Atomic, Call, Flow, arun, run
from stello_graph._tree import TreePlan, node_flow, plan_flow, tree_writes
from stello_graph.models import IntegrationResult
from stello_graph.nodes._runnable import StelloNode
from stello_graph.nodes._store import StoreWrite, awrite_store, write_store
from stello_graph.nodes.deps import StelloRuntime
from stello_graph.nodes.scheduling import announce_integration
from stello_graph.nodes.state import IntegrateState, SubtreeTask, TreeState, merge_results

__all__ = [
    "make_finish_tree_node",
    "make_integrate_subtree_node",
    "make_next_level_node",
    "make_plan_tree_node",
    "merge_results",
    "route_level",
    "run_tree",
    "arun_tree",
]


def _plan_state(plan: TreePlan) -> TreeState:
    return {"tree_plan": dataclasses.asdict(plan), "tree_step": 0, "tree_results": None}


def make_plan_tree_node(deps: StelloRuntime) -> StelloNode:
    """Node `plan_tree`: read the active tree and group its internal nodes by level."""

    def plan(state: TreeState) -> TreeState:
        return _plan_state(run(plan_flow(deps.storage.tree_id), deps.storage))

    async def aplan(state: TreeState) -> TreeState:
        return _plan_state(await arun(plan_flow(deps.storage.tree_id), deps.storage))

    return StelloNode("plan_tree", plan, aplan)


def make_next_level_node() -> StelloNode:
    """Node `next_level`: move one level up the tree."""

    def step(state: TreeState) -> TreeState:
        return {"tree_step": state["tree_step"] + 1}

    async def astep(state: TreeState) -> TreeState:
        return step(state)

    return StelloNode("next_level", step, astep)


def route_level(state: TreeState) -> list[Send] | Literal["finish_tree"]:
    """Router: one `Send` per internal node of the current level, or finish.

    Each carries the subtree syntheses the levels below made in this run (`made`).
    """
    plan, step = state["tree_plan"], state["tree_step"]
    if step >= len(plan["levels"]):
        return "finish_tree"
    results = state.get("tree_results") or {}
    made = {node_id: result["synthesis"] for node_id, result in results.items()}
    return [
        Send("integrate_subtree", SubtreeTask(node_id=n, tree_plan=plan, made=made))
        for n in plan["levels"][step]
    ]


def _result(node_id: str, result: IntegrationResult | None) -> TreeState:
    return {} if result is None else {"tree_results": {node_id: result.model_dump()}}


def _as_plan(raw: dict[str, Any]) -> TreePlan:
    return TreePlan(**raw)  # a plan checkpointed before `version` and `archived` gets defaults


def make_integrate_subtree_node(deps: StelloRuntime) -> StelloNode:
    """Node `integrate_subtree` (one per `Send`): integrate one node's direct children.

    Writes nothing; its result joins `tree_results`, which `finish_tree` writes.
    """

    def flow(task: SubtreeTask) -> Flow[TreeState]:
        plan, node_id = _as_plan(task["tree_plan"]), task["node_id"]
        fn, made = deps.integrate_function(), task.get("made") or {}
        return _result(node_id, (yield from node_flow(plan, node_id, fn, made)))

    def integrate(task: SubtreeTask) -> TreeState:
        return run(flow(task), deps.storage)

    async def aintegrate(task: SubtreeTask) -> TreeState:
        return await arun(flow(task), deps.storage)

    return StelloNode("integrate_subtree", integrate, aintegrate)


def _results(state: TreeState) -> dict[str, IntegrationResult]:
    raw = state.get("tree_results") or {}
    return {node_id: IntegrationResult.model_validate(r) for node_id, r in raw.items()}


def _announced(
    deps: StelloRuntime, plan: TreePlan, results: dict[str, IntegrationResult]
) -> list[StoreWrite]:
    """Every node's events, bottom-up as the results were made; their store writes."""
    writes: list[StoreWrite] = []
    for level in plan.levels:
        for node_id in level:
            if node_id in results:
                kind = "synthesis" if node_id == plan.root_id else "subtree"
                writes += announce_integration(deps, node_id, results[node_id], kind, tree=True)
    return writes


def _integration(plan: TreePlan, results: dict[str, IntegrationResult]) -> IntegrateState:
    levels = sum(1 for level in plan.levels if any(n in results for n in level))
    return {
        "integration": {
            "mode": "tree",
            "root_id": plan.root_id,
            "levels": levels,
            "results": {node_id: r.model_dump() for node_id, r in results.items()},
        }
    }


def _finish(
    deps: StelloRuntime, plan: TreePlan, results: dict[str, IntegrationResult]
) -> Flow[IntegrateState]:
    """Write every node's result in one transaction, announce them, mirror them to the store
    (driven async, no store call runs on the event loop)."""
    yield Atomic(tree_writes(plan, results))
    for write in _announced(deps, plan, results):  # a failure is reported for its session
        yield Call(write_store, awrite_store, (deps, [write], write[1]))
    return _integration(plan, results)


def make_finish_tree_node(deps: StelloRuntime) -> StelloNode:
    """Node `finish_tree`: write every node's result in one transaction, announce them, and
    return `integration` with every node's result."""

    def finish(state: TreeState) -> IntegrateState:
        results, plan = _results(state), _as_plan(state["tree_plan"])
        return run(_finish(deps, plan, results), deps.storage)

    async def afinish(state: TreeState) -> IntegrateState:
        results, plan = _results(state), _as_plan(state["tree_plan"])
        return await arun(_finish(deps, plan, results), deps.storage)

    return StelloNode("finish_tree", finish, afinish)


# -- the same operation without a graph run -------------------------------------------------
# `StelloAgent.integrate(mode="tree")` runs it so: the same plan, per-node integration and
# final write as the nodes above, each level's nodes in parallel (threads, or tasks).
_PARALLEL = 32
P = ParamSpec("P")
R = TypeVar("R")


def _made(results: dict[str, IntegrationResult]) -> dict[str, str]:
    return {node_id: r.synthesis for node_id, r in results.items()}


def _in_context(func: Callable[P, R]) -> Callable[P, R]:
    """`func`, to run in a worker thread in a copy of the caller's context (as a graph's
    tasks do: the caller's tracing callbacks reach its model calls)."""
    context = contextvars.copy_context()

    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        return context.run(func, *args, **kwargs)

    return run


def run_tree(deps: StelloRuntime) -> IntegrateState:
    """The tree `integrate` operation: level by level, bottom-up; written once at the end."""
    plan, fn = run(plan_flow(deps.storage.tree_id), deps.storage), deps.integrate_function()
    results: dict[str, IntegrationResult] = {}
    with ThreadPoolExecutor(_PARALLEL, thread_name_prefix="stello-tree") as pool:
        for level in plan.levels:
            made = _made(results)
            futures = [(n, pool.submit(_in_context(run), node_flow(plan, n, fn, made),
                                       deps.storage)) for n in level]  # fmt: skip
            for node_id, future in futures:
                found = future.result()
                if found is not None:
                    results[node_id] = found
    return run(_finish(deps, plan, results), deps.storage)


async def arun_tree(deps: StelloRuntime) -> IntegrateState:
    """Async twin of `run_tree`."""
    plan, fn = await arun(plan_flow(deps.storage.tree_id), deps.storage), deps.integrate_function()
    results: dict[str, IntegrationResult] = {}
    gate = asyncio.Semaphore(_PARALLEL)

    async def one(node_id: str, made: dict[str, str]) -> IntegrationResult | None:
        async with gate:
            return await arun(node_flow(plan, node_id, fn, made), deps.storage)

    for level in plan.levels:
        made = _made(results)
        found = await asyncio.gather(*(one(n, made) for n in level))
        results.update({n: r for n, r in zip(level, found, strict=True) if r is not None})
    return await arun(_finish(deps, plan, results), deps.storage)
