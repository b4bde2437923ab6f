"""LangGraph nodes and routers of stello-graph (import as `stello_graph.nodes`).

Each `make_*_node(deps)` returns a `StelloNode` (a runnable with sync and async paths) bound to
a `StelloRuntime` (earlier name: `StelloDeps`); routers are plain functions of the state.
`stello_graph.graph.build_graph` wires them; they can be wired into a graph of your own too.
"""

from stello_graph.nodes._runnable import StelloNode
from stello_graph.nodes.builtin_tools import BuiltinTools
from stello_graph.nodes.deps import BUILTIN_TOOLS, StelloDeps, StelloRuntime, tool_error_message
from stello_graph.nodes.forking import afork_request, fork_request
from stello_graph.nodes.ops import (
    make_consolidate_node,
    make_fork_node,
    make_integrate_node,
    route_start,
)
from stello_graph.nodes.tree import (
    make_finish_tree_node,
    make_integrate_subtree_node,
    make_next_level_node,
    make_plan_tree_node,
    route_level,
)
from stello_graph.nodes.turn import (
    make_assemble_node,
    make_commit_node,
    make_model_node,
    make_tools_node,
    route_after_model,
)

__all__ = [
    # dependencies
    "BUILTIN_TOOLS",
    "StelloRuntime",
    "StelloDeps",
    "BuiltinTools",
    "tool_error_message",
    "StelloNode",
    # the turn
    "make_assemble_node",
    "make_model_node",
    "make_tools_node",
    "make_commit_node",
    "route_after_model",
    # the topology edges
    "route_start",
    "fork_request",
    "afork_request",
    "make_fork_node",
    "make_consolidate_node",
    "make_integrate_node",
    # tree-mode integration
    "make_plan_tree_node",
    "route_level",
    "make_integrate_subtree_node",
    "make_next_level_node",
    "make_finish_tree_node",
]
