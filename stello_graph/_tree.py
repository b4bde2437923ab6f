"""Tree-mode integration, one node at a time (the graph runs the nodes of a level in parallel).

In a tree, integration runs bottom-up, level by level. Each internal node integrates only its
*direct* children's L2 into a summary of its subtree. What its parent then sees for that
branch (as the child's `l2`) is the child's own L2 followed by that summary, so neither the
child's own conversation nor what branches under it is lost; grandchildren reach the parent
only through the summary. Each internal node pushes insights one level down, to its direct
children only, so sibling subtrees never see each other except through their common
ancestor. The root's summary is the main session's synthesis.

Archived sessions, and everything under them, take no part, except the final L2 of branches
archived since the last integration (`FINAL_L2S_KEY`), which the root reads as flat integration
does. Of overlapping integrations only one is stored (`integration_stored`).

A run is all or nothing, like flat integration: `node_flow` only reads and calls the
integrate function (the subtree syntheses made lower down in the same run are handed to it in
memory), and `tree_writes` stores every node's result, run in one transaction (`Atomic`) at
the end. A failure at any level therefore leaves the stored syntheses and insights as they were.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from stello_graph._calls import call_async, call_sync, failing_as
from stello_graph._flow import Call, Flow, Storage
from stello_graph.errors import IntegrationError, MainSessionNotFoundError
from stello_graph.main_session import (
    archived_l2s,
    check_integration,
    integration_read,
    integration_stored,
)
from stello_graph.memory import IntegrateFn
from stello_graph.models import ChildL2, IntegrationResult, SessionMeta, TopologyNode
from stello_graph.storage import MainStorage

__all__ = ["TreePlan", "node_flow", "plan_flow", "tree_writes"]

Summaries = Mapping[str, str]
"""The subtree syntheses a run has made so far, by node: they stand in for the stored ones."""


@dataclass(frozen=True)
class TreePlan:
    """The active tree, as integration walks it.

    Attributes:
        root_id: the main session.
        levels: internal nodes (those with active children) by depth, deepest first.
        children: active children of each internal node, in creation order.
        labels: the label of every active node.
        version: the count of stored integrations as the run began (`integration_read`).
        archived: archived sessions whose final L2 the root brings (`FINAL_L2S_KEY`).
    """

    root_id: str
    levels: list[list[str]] = field(default_factory=list)
    children: dict[str, list[str]] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    version: int = 0
    archived: list[str] = field(default_factory=list)


def plan_flow(tree: str) -> Flow[TreePlan]:
    """Read the active tree (`tree`: its id) and group its internal nodes by level."""
    root = yield Storage(MainStorage.get_main_session)
    if root is None:
        raise MainSessionNotFoundError(tree)
    version, archived = yield from integration_read()
    nodes: list[TopologyNode] = yield Storage(MainStorage.get_tree)
    metas: list[SessionMeta] = yield Storage(MainStorage.list_sessions)
    active = {m.id for m in metas if m.status == "active"}
    kids: dict[str, list[str]] = defaultdict(list)
    for node in nodes:  # pre-order: parents come before their children
        if node.parent_id is not None and node.id in active and node.parent_id in active:
            kids[node.parent_id].append(node.id)
    levels, frontier = [], [root.id]  # levels from the root down, then turned deepest first
    while internal := [n for n in frontier if kids.get(n)]:
        levels.append(internal)
        frontier = [c for n in internal for c in kids[n]]
    levels.reverse()
    labels = {node.id: node.label for node in nodes if node.id in active}
    children = {n: kids[n] for level in levels for n in level}
    return TreePlan(root.id, levels, children, labels, version, archived)


def branch_l2(own: str | None, summary: str | None) -> str | None:
    """What a parent sees for a child: its own L2, and the summary of its subtree if any."""
    if own and summary:
        return f"{own}\n\nWhat the sessions under it found: {summary}"
    return own or summary


def _child_l2_flow(plan: TreePlan, child: str, made: Summaries) -> Flow[str | None]:
    summary = made.get(child)
    if summary is None and plan.children.get(child):
        summary = yield Storage(MainStorage.get_subtree_synthesis, child)
    return branch_l2((yield Storage(MainStorage.get_memory, child)), summary)


def node_flow(
    plan: TreePlan, node_id: str, fn: IntegrateFn, made: Summaries
) -> Flow[IntegrationResult | None]:
    """Integrate the direct children of one node; `None` (no call) if none has an L2 yet.

    Writes nothing: a child's subtree synthesis is taken from `made` (what this run made of
    it) before storage, and `tree_writes` stores the results of the whole run.
    """
    children = []
    for child in plan.children.get(node_id, []):
        if l2 := (yield from _child_l2_flow(plan, child, made)):
            children.append(ChildL2(session_id=child, label=plan.labels.get(child, ""), l2=l2))
    archived = yield from archived_l2s(plan.archived if node_id == plan.root_id else [])
    inputs = [*children, *archived]
    if not inputs:
        return None
    own = MainStorage.get_memory if node_id == plan.root_id else MainStorage.get_subtree_synthesis
    current = yield Storage(own, node_id)
    with failing_as(
        lambda exc: IntegrationError(
            f"Integrating the subtree of {node_id!r} failed: {type(exc).__name__}: {exc}",
            session_id=node_id,
        )
    ):
        raw = yield Call(call_sync, call_async, (fn, inputs, current))
    return check_integration(raw, children, node_id)  # no insight to an archived session


def tree_writes(plan: TreePlan, results: Mapping[str, IntegrationResult]) -> Flow[None]:
    """Store a run's results (to run in one transaction, `Atomic`): each node's subtree
    synthesis (the main session's synthesis, for the root) and the insights to its children."""
    if results:  # the root brought the pending final L2s if it ran
        brought = plan.archived if plan.root_id in results else []
        yield from integration_stored(plan.root_id, plan.version, brought)
    for node_id, result in results.items():
        own = (
            MainStorage.put_memory if node_id == plan.root_id else MainStorage.put_subtree_synthesis
        )
        yield Storage(own, node_id, result.synthesis)
        for session_id, insight in result.insights.items():
            yield Storage(MainStorage.put_insight, session_id, insight)
