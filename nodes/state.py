"""The typed state of each operation of the stello graph.

One graph routes by `op` at START (`route_start`), so its state (`StelloState`, in
`stello_graph.graph`) is the union of these; each node is typed with its operation's part:

* `TurnState`: a turn (`assemble -> model -> tools -> ... -> commit`).
* `ForkState`: `fork`.
* `ConsolidateState`: `consolidate`.
* `IntegrateState`: flat `integrate`; `TreeState` (and one `SubtreeTask` per `Send`): the
  tree mode, level by level.

The keys only a run's input sets (`op`, `input`, `fork`, `tool_choice`, `mode`) are
ephemeral: they hold for the run's first step and are then cleared, so on a checkpointed
thread (every LangGraph Server thread) one run's input never carries over into the next
run. Continuing a run (`Command(resume=...)`, or `None` after a crash) still sees them from
its checkpoint; what later steps need is copied into the turn's own keys by `assemble`.
`session_id` and the results (`content`, `forked`, `l2`, ...) last the whole run and are
cleared by the next run unless it sets them again (`RunValue` and `RunInput`,
`stello_graph.nodes._channels`).

What lasts from run to run is the thread's: `messages`, its conversation (`ThreadMessages`),
`thread_session`, the session its `messages` runs continue, and `asking` / `answered`, the
ids of the user message its latest `messages` turn was asked and of the one its last
committed turn answered (see `stello_graph.nodes.entry`).

`StelloContext` is the graph's `context_schema`: LangGraph v1's `context=` of a run.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from langchain_core.messages import AnyMessage, BaseMessage
from langgraph.channels import EphemeralValue
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

from stello_graph.nodes._channels import RunAggregate, RunInput, RunValue, ThreadMessages

__all__ = [
    "ConsolidateState",
    "ForkState",
    "IntegrateState",
    "Op",
    "OpState",
    "StelloContext",
    "SubtreeTask",
    "TreeState",
    "TurnState",
    "merge_results",
]

Op = Literal["turn", "fork", "consolidate", "integrate"]
"""The operations of the graph."""


def merge_results(left: dict[str, Any] | None, right: dict[str, Any] | None) -> dict[str, Any]:
    """Reducer of `tree_results`: merge each node's result; `None` starts over."""
    return {} if right is None else {**(left or {}), **right}


class StelloContext(TypedDict, total=False):
    """The run context of the stello graph (LangGraph v1: `graph.invoke(input, context=...)`,
    or `context` of a LangGraph Server run). The same keys in `configurable` work too.
    """

    tree_id: str
    """The tree (one per user) on LangGraph Server (`stello_graph.server`)."""
    session_id: str
    """The session of a `{"messages": [...]}` run, which the thread then continues."""


class OpState(TypedDict, total=False):
    """What every operation's state has: the operation and the session it runs on."""

    op: Annotated[Op, EphemeralValue]
    """The operation; a turn when left out."""
    session_id: Annotated[str, RunInput]
    """The session the turn (or fork / consolidation) runs on."""


class TurnState(OpState, total=False):
    """A turn in flight, from its input to its committed records."""

    input: Annotated[str, EphemeralValue]
    """The user message."""
    turn_id: Annotated[str, EphemeralValue]
    """An id for the turn from the caller (`StelloAgent`'s, `as_tool`'s tool call's); see
    `_turn_of`."""
    tool_choice: Annotated[str | dict[str, Any] | bool | None, EphemeralValue]
    """Force the first model call to use tools (`"required"`, a tool's name, ...)."""
    turn_tool_choice: str | dict[str, Any] | bool | None
    """`tool_choice`, kept by `assemble` for the turn's first model call."""
    insight: str | None
    """The insight the turn shows (cleared once the turn is committed)."""
    lease: dict[str, Any] | None
    """The owner and token of the session lease the turn holds (`stello_graph.lease`)."""
    pending: Annotated[list[BaseMessage], RunAggregate(list, add_messages)]
    """The turn's records, committed to L3 at its end."""
    content: Annotated[str, RunValue]
    """The final reply."""
    tool_rounds: Annotated[int, RunValue]
    tool_calls: Annotated[list[dict[str, Any]], RunValue]
    """The tool calls run during the turn."""
    turn_count: Annotated[int, RunValue]
    """User turns of the session after this one."""
    messages: Annotated[list[AnyMessage], ThreadMessages]
    """The thread's conversation. In: the run's messages, added to it (`MessagesState`
    style), the newest user message the turn's input. Out: the conversation with the turn's
    records merged in (a `{"session_id", "input"}` turn: its records alone)."""
    thread_session: str
    """The session the thread's `messages` runs continue, bound by its first one."""
    asking: str
    """The id of the user message a `messages` turn answers (set by `enter`)."""
    answered: str
    """The id of the user message the thread's last `messages` turn answered."""


class ForkState(OpState, total=False):
    """A fork: its options in, the child's node out."""

    fork: Annotated[dict[str, Any], EphemeralValue]
    """`label` and the fork options (`context`, `at_turn`, `system_prompt`, `prompt`, ...)."""
    forked: Annotated[dict[str, str], RunValue]
    """The child: `session_id`, `label`, `parent_id`."""


class ConsolidateState(OpState, total=False):
    """A consolidation of `session_id`."""

    l2: Annotated[str | None, RunValue]
    """The new L2."""


class IntegrateState(OpState, total=False):
    """An integration, flat or by tree levels."""

    mode: Annotated[Literal["flat", "tree"], EphemeralValue]
    """Every L2 into the main session (`"flat"`, default) or level by level (`"tree"`)."""
    integration: Annotated[dict[str, Any], RunValue]
    """The result (`IntegrationResult` or `TreeIntegration`, dumped)."""


class TreeState(IntegrateState, total=False):
    """A tree integration in flight: the plan, the level reached, the results so far."""

    tree_plan: dict[str, Any]
    tree_step: int
    tree_results: Annotated[dict[str, Any] | None, merge_results]
    """Each node's result so far; `None` (from `plan_tree`) starts over."""


class SubtreeTask(TypedDict, total=False):
    """What `route_level` sends each `integrate_subtree` task: one node of the level."""

    node_id: str
    tree_plan: dict[str, Any]
    made: dict[str, str]
    """The subtree syntheses the levels below made in this run."""
