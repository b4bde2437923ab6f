"""`build_stello_graph`: the stello orchestration as a LangGraph `StateGraph`.

The graph runs a turn on one session for `{"session_id": ..., "input": ...}`:

    START -> assemble -> model -> tools -> model -> ... -> commit -> END

and the topology operations for `{"op": "fork" | "consolidate" | "integrate", ...}` (see
`stello_graph.nodes.ops`). It is returned uncompiled: compile it with any checkpointer
(`InMemorySaver`, `SqliteSaver`, `AsyncSqliteSaver`, ...) or add it to a graph of your own.

Example:
    >>> from langgraph.checkpoint.memory import InMemorySaver
    >>> from stello_graph import MainSession
    >>> from stello_graph.checkpoints import InMemoryMainStorage
    >>> from stello_graph.testing import ScriptedChatModel
    >>> storage = InMemoryMainStorage()
    >>> main = MainSession.create(storage)
    >>> graph = build_stello_graph(ScriptedChatModel(["Hi!"]), storage).compile(
    ...     checkpointer=InMemorySaver()
    ... )
    >>> out = graph.invoke(
    ...     {"session_id": main.id, "input": "Hello"},
    ...     {"configurable": {"thread_id": main.id}},
    ... )
    >>> out["content"]
    'Hi!'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal, TypeAlias, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AnyMessage
from langgraph.channels import EphemeralValue
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.store.base import BaseStore
from langgraph.types import RetryPolicy

from stello_graph.compression import CompressionPolicy
from stello_graph.lease import DEFAULT_LEASE_TTL
from stello_graph.memory import ConsolidateFn, IntegrateFn
from stello_graph.nodes._model_call import model_retry_policy
from stello_graph.nodes.deps import StelloDeps
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
    merge_results,
    route_level,
)
from stello_graph.nodes.turn import (
    make_assemble_node,
    make_commit_node,
    make_model_node,
    make_tools_node,
    route_after_model,
)
from stello_graph.profiles import ForkProfile, SplitGuard
from stello_graph.schedule import Schedule
from stello_graph.skills import Skill
from stello_graph.storage import MainStorage

__all__ = ["StelloInput", "StelloOutput", "StelloState", "build_graph", "build_stello_graph"]


class StelloInput(TypedDict, total=False):
    """What a run of the graph takes."""

    op: Literal["turn", "fork", "consolidate", "integrate"]
    """The operation; a turn when left out."""
    session_id: str
    """The session the turn (or fork / consolidation) runs on."""
    input: str
    """The user message of a turn."""
    fork: dict[str, Any]
    """Options of a fork: `label` and optionally `context`, `system_prompt`, `prompt`,
    `tags`, `metadata`, `id`."""
    tool_choice: str | dict[str, Any] | bool | None
    """Force the turn's first model call to use tools (`"required"`, a tool's name, ...)."""
    mode: Literal["flat", "tree"]
    """How `integrate` runs: every L2 into the main session (flat, default) or level by level."""


class StelloOutput(TypedDict, total=False):
    """What a run of the graph returns."""

    session_id: str
    content: str
    """The final reply of a turn."""
    pending: list[AnyMessage]
    """The records of the turn, as committed to L3."""
    tool_rounds: int
    tool_calls: list[dict[str, Any]]
    """The tool calls run during the turn."""
    turn_count: int
    """User turns of the session after this one."""
    forked: dict[str, str]
    l2: str | None
    integration: dict[str, Any]


class StelloState(StelloInput, StelloOutput, total=False):
    """The graph's state: input, output, and the turn in flight.

    The keys only a run's input sets are ephemeral: they hold for the run's first step and
    are then cleared, so on a checkpointed thread (every LangGraph Server thread) one run's
    `op`, `input`, `fork`, `tool_choice` or `mode` never carries over into the next run.
    Continuing a run (`Command(resume=...)`, or `None` after a crash) still sees them from
    its checkpoint; what later steps need is copied into the turn's own keys by `assemble`.
    """

    op: Annotated[Literal["turn", "fork", "consolidate", "integrate"], EphemeralValue]
    input: Annotated[str, EphemeralValue]
    fork: Annotated[dict[str, Any], EphemeralValue]
    tool_choice: Annotated[str | dict[str, Any] | bool | None, EphemeralValue]
    mode: Annotated[Literal["flat", "tree"], EphemeralValue]
    pending: Annotated[list[AnyMessage], add_messages]
    insight: str | None
    turn_tool_choice: str | dict[str, Any] | bool | None
    lease: dict[str, Any] | None
    """The owner and token of the session lease the turn holds (`stello_graph.lease`)."""
    tree_plan: dict[str, Any]
    tree_step: int
    tree_results: Annotated[dict[str, Any], merge_results]


StelloGraph: TypeAlias = StateGraph[StelloState, None, StelloInput, StelloOutput]
"""The type of the graph `build_stello_graph` returns: its state, input and output schemas."""


def build_graph(deps: StelloDeps) -> StelloGraph:
    """The stello `StateGraph` over an existing `StelloDeps`."""
    graph: StelloGraph = StateGraph(
        StelloState, input_schema=StelloInput, output_schema=StelloOutput
    )
    graph.add_node("assemble", make_assemble_node(deps))
    graph.add_node(
        "model", make_model_node(deps), retry_policy=model_retry_policy(deps.model_retry)
    )
    graph.add_node("tools", make_tools_node(deps))
    graph.add_node("commit", make_commit_node(deps))
    graph.add_node("fork", make_fork_node(deps))
    graph.add_node("consolidate", make_consolidate_node(deps))
    graph.add_node("integrate", make_integrate_node(deps))
    graph.add_node("plan_tree", make_plan_tree_node(deps))
    graph.add_node("integrate_subtree", make_integrate_subtree_node(deps))
    graph.add_node("next_level", make_next_level_node())
    graph.add_node("finish_tree", make_finish_tree_node(deps))
    starts = ["assemble", "fork", "consolidate", "integrate", "plan_tree"]
    graph.add_conditional_edges(START, route_start, starts)
    graph.add_conditional_edges("plan_tree", route_level, ["integrate_subtree", "finish_tree"])
    graph.add_edge("integrate_subtree", "next_level")
    graph.add_conditional_edges("next_level", route_level, ["integrate_subtree", "finish_tree"])
    graph.add_edge("assemble", "model")
    graph.add_conditional_edges("model", route_after_model, ["tools", "commit"])
    graph.add_edge("tools", "model")
    for last in ("commit", "fork", "consolidate", "integrate", "finish_tree"):
        graph.add_edge(last, END)
    return graph


def build_stello_graph(
    model: BaseChatModel,
    storage: MainStorage,
    *,
    tools: Sequence[Any] = (),
    builtin_tools: Sequence[str] = ("create_session",),
    max_tool_rounds: int = 8,
    consolidate_fn: ConsolidateFn | None = None,
    integrate_fn: IntegrateFn | None = None,
    schedule: Schedule | None = None,
    store: BaseStore | None = None,
    profiles: Sequence[ForkProfile] = (),
    skills: Sequence[Skill] = (),
    split_guard: SplitGuard | None = None,
    compression: CompressionPolicy | None = None,
    model_timeout: float | None = None,
    model_retry: RetryPolicy | None = None,
    lease_ttl: float = DEFAULT_LEASE_TTL,
) -> StelloGraph:
    """The stello orchestration as an uncompiled LangGraph `StateGraph`.

    Args:
        model: the chat model of every session.
        storage: the tree's `MainStorage`.
        tools: tools every session's model is given (LangChain tools or functions).
        builtin_tools: built-in tools to add; `()` for none.
        max_tool_rounds: tool rounds a turn may take; one more fails with
            `ToolRoundLimitError` and stores nothing.
        consolidate_fn: used by the `consolidate` operation and the schedule
            (default: `llm_consolidator(model)`).
        integrate_fn: used by the `integrate` operation and the schedule
            (default: `llm_integrator(model)`).
        schedule: background consolidation / integration after turns.
        store: a LangGraph store that L2, synthesis and insights are also published to,
            under `("stello", tree_id, "l2" | "synthesis" | "subtree" | "insights")` (with
            `.` and `%` of the tree id percent-escaped: store labels cannot hold a `.`).
        profiles: fork profiles the caller and the model can name.
        skills: skills models can activate (`activate_skill`), per-session allow-lists.
        split_guard: limits on forks the model makes itself.
        compression: automatic context compression of every session.
        model_timeout: seconds each model call of a turn may take; a call that takes
            longer fails the turn with `ModelCallError` (or is retried, see `model_retry`).
        model_retry: a LangGraph `RetryPolicy` for a turn's failed model calls; its
            `retry_on` judges the provider's exception. Timed-out calls are retried.
        lease_ttl: seconds a turn's session lease lasts without renewal (a running turn
            renews it; a holder that died is taken over after this, or at once when it was a
            process of this machine). Turns on one session run one at a time through it,
            from threads, graphs, agents and processes alike (`stello_graph.lease`).
    """
    deps = StelloDeps(
        storage=storage,
        model=model,
        tools=tools,
        builtin_tools=builtin_tools,
        max_tool_rounds=max_tool_rounds,
        consolidate_fn=consolidate_fn,
        integrate_fn=integrate_fn,
        schedule=schedule,
        store=store,
        profiles=profiles,
        skills=skills,
        split_guard=split_guard,
        compression=compression,
        model_timeout=model_timeout,
        model_retry=model_retry,
        lease_ttl=lease_ttl,
    )
    return build_graph(deps)
