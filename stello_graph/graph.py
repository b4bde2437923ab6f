"""`build_stello_graph`: the stello orchestration as a LangGraph `StateGraph`.

The graph runs a turn on one session for `{"session_id": ..., "input": ...}`:

    START -> model -> tools -> model -> ... -> END

(the first model round opens the turn, the last one commits it: see `stello_graph.nodes.turn`)

or for `{"messages": [...]}` (the newest user message is the input; the session is the one
the run names, in its context (`StelloContext`) or `configurable`, else the thread's: a
thread's first `messages` run starts a new child of the main session), through `enter`
first (`stello_graph.nodes.entry`). A turn's output carries `content` and `messages` (the
thread's conversation for a `messages` turn, the turn's records for the other form).

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

from typing import Any, Literal, TypeAlias

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AnyMessage
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict, Unpack

from stello_graph._compiled import StelloCompiledGraph
from stello_graph.config import StelloConfig, StelloSettings
from stello_graph.nodes._model_call import model_retry_policy
from stello_graph.nodes.deps import StelloRuntime
from stello_graph.nodes.entry import make_enter_node
from stello_graph.nodes.ops import (
    make_consolidate_node,
    make_fork_node,
    make_integrate_node,
    route_start,
)
from stello_graph.nodes.state import (
    ConsolidateState,
    ForkState,
    StelloContext,
    TreeState,
    TurnState,
)
from stello_graph.nodes.tree import (
    make_finish_tree_node,
    make_integrate_subtree_node,
    make_next_level_node,
    make_plan_tree_node,
    route_level,
)
from stello_graph.nodes.turn import (
    make_model_node,
    make_tools_node,
    route_after_model,
)
from stello_graph.storage import MainStorage

__all__ = [
    "StelloContext",
    "StelloInput",
    "StelloOutput",
    "StelloState",
    "StelloStateGraph",
    "TurnInput",
    "TurnOutput",
    "build_graph",
    "build_stello_graph",
    "build_turn_graph",
]


class StelloInput(TypedDict, total=False):
    """What a run of the graph takes."""

    op: Literal["turn", "fork", "consolidate", "integrate"]
    """The operation; a turn when left out."""
    session_id: str
    """The session the turn (or fork / consolidation) runs on."""
    input: str
    """The user message of a turn."""
    messages: list[AnyMessage]
    """A turn asked as a conversation: its messages are added to the thread's, the newest
    user message is the input; the session is `session_id`, else the context's or
    `configurable`'s `session_id`, else the thread's (a new one on its first run)."""
    fork: dict[str, Any]
    """Options of a fork: `label` and optionally `context`, `at_turn`, `system_prompt`,
    `prompt`, `tags`, `metadata`, `id`."""
    tool_choice: str | dict[str, Any] | bool | None
    """Force the turn's first model call to use tools (`"required"`, a tool's name, ...)."""
    turn_id: str
    """An id for the turn from the caller (`as_tool` gives its tool call's): asked again
    under it with the same input (a parent graph replaying), the turn answers from L3."""
    mode: Literal["flat", "tree"]
    """How `integrate` runs: every L2 into the main session (flat, default) or level by level."""


class TurnOutput(TypedDict, total=False):
    """What a run of the turn graph returns (and of the graph, a turn)."""

    session_id: str
    content: str
    """The final reply of a turn."""
    messages: list[AnyMessage]
    """A `messages` turn: the thread's whole conversation, the turn's records merged in (the
    user record keeps the id of the input message). A `{"session_id", "input"}` turn: its
    records, the reply last."""
    pending: list[AnyMessage]
    """The records of the turn, as committed to L3."""
    tool_rounds: int
    tool_calls: list[dict[str, Any]]
    """The tool calls run during the turn."""
    turn_count: int
    """User turns of the session after this one."""


class StelloOutput(TurnOutput, total=False):
    """What a run of the graph returns."""

    forked: dict[str, str]
    l2: str | None
    integration: dict[str, Any]


class StelloState(TurnState, ForkState, ConsolidateState, TreeState, total=False):
    """The graph's state: the union of its operations' states (`stello_graph.nodes.state`).

    One graph runs every operation, routed by `op` at START; each node reads and writes
    only its operation's part. The input keys are ephemeral (see `stello_graph.nodes.state`).
    """


def _stello(compiled: object) -> StelloCompiledGraph:
    compiled.__class__ = StelloCompiledGraph  # the same object, with the refusals
    assert isinstance(compiled, StelloCompiledGraph)
    return compiled


class StelloStateGraph(StateGraph[StelloState, StelloContext, StelloInput, StelloOutput]):
    """The stello `StateGraph`; compiled, its time travel branches (`StelloCompiledGraph`:
    a run from an earlier checkpoint goes on from a fork of the session)."""

    runtime: StelloRuntime | None = None
    """The runtime its nodes share (set by `build_graph`); its compiled graph counts each
    run there while it runs (`StelloRuntime.running`)."""

    def compile(self, *args: Any, **kwargs: Any) -> StelloCompiledGraph:
        return _stello(super().compile(*args, **kwargs))


StelloGraph: TypeAlias = StelloStateGraph
"""The type of the graph `build_stello_graph` returns: its state, input and output schemas."""


def build_graph(deps: StelloRuntime) -> StelloGraph:
    """The stello `StateGraph` over an existing `StelloRuntime`."""
    graph = StelloStateGraph(
        StelloState,
        context_schema=StelloContext,
        input_schema=StelloInput,
        output_schema=StelloOutput,
    )
    graph.runtime = deps
    graph.add_node("enter", make_enter_node(deps))
    _add_turn(graph, deps, replays=True)
    graph.add_node("fork", make_fork_node(deps))
    graph.add_node("consolidate", make_consolidate_node(deps))
    graph.add_node("integrate", make_integrate_node(deps))
    graph.add_node("plan_tree", make_plan_tree_node(deps))
    graph.add_node("integrate_subtree", make_integrate_subtree_node(deps))
    graph.add_node("next_level", make_next_level_node())
    graph.add_node("finish_tree", make_finish_tree_node(deps))
    starts = ["enter", "model", "fork", "consolidate", "integrate", "plan_tree"]
    graph.add_conditional_edges(START, route_start, starts)
    graph.add_edge("enter", "model")
    graph.add_conditional_edges("plan_tree", route_level, ["integrate_subtree", "finish_tree"])
    graph.add_edge("integrate_subtree", "next_level")
    graph.add_conditional_edges("next_level", route_level, ["integrate_subtree", "finish_tree"])
    for last in ("fork", "consolidate", "integrate", "finish_tree"):
        graph.add_edge(last, END)
    return graph


class TurnInput(TypedDict, total=False):
    """What a run of the turn graph (`build_turn_graph`) takes."""

    session_id: str
    input: str
    turn_id: str
    tool_choice: str | dict[str, Any] | bool | None


class TurnGraph(StateGraph[TurnState, None, TurnInput, TurnOutput]):
    """The graph `build_turn_graph` returns; compiled, it is a `StelloCompiledGraph` (runs
    start fresh, time travel branches)."""

    def compile(self, *args: Any, **kwargs: Any) -> StelloCompiledGraph:
        return _stello(super().compile(*args, **kwargs))


def build_turn_graph(deps: StelloRuntime, *, first_round: bool = False) -> TurnGraph:
    """The turns alone, `START -> model -> (tools -> model)* -> END`, over `deps`.

    The same nodes as the turns of `build_graph`, without the topology operations: a state
    of the turn's keys only (each superstep of LangGraph handles every channel of its
    graph, and the whole graph has more than twice as many). `StelloAgent` runs its turns
    on it; its checkpoints are the whole graph's, so either graph continues a thread the
    other began.

    `first_round`: the turn's first model round alone, `START -> model -> END`, which the
    agent runs without a checkpointer (a reply that asks for tools goes on on the whole
    graph: `nodes.turn.HANDOFF_KEY`).
    """
    graph = TurnGraph(TurnState, input_schema=TurnInput, output_schema=TurnOutput)
    # the agent names each turn afresh (`turn_id`): no input asks one again
    _add_turn(graph, deps, replays=False, tools=not first_round)
    graph.add_edge(START, "model")
    return graph


def _add_turn(
    graph: StateGraph[Any, Any, Any, Any], deps: StelloRuntime, *, replays: bool, tools: bool = True
) -> None:
    """A turn's nodes and edges, `model -> (tools -> model)* -> END` (`model -> END`
    without `tools`)."""
    retry = model_retry_policy(deps.model_retry)
    graph.add_node("model", make_model_node(deps, replays=replays), retry_policy=retry)
    if not tools:
        graph.add_edge("model", END)
        return
    graph.add_node("tools", make_tools_node(deps))
    graph.add_conditional_edges("model", route_after_model, ["tools", END])
    graph.add_edge("tools", "model")


def build_stello_graph(
    model: BaseChatModel | str | None,
    storage: MainStorage,
    /,
    *,
    config: StelloConfig | None = None,
    **settings: Unpack[StelloSettings],
) -> StelloGraph:
    """The stello orchestration as an uncompiled LangGraph `StateGraph`.

    Args:
        model: the chat model of every session, or its name as LangChain's
            `init_chat_model` takes it (`"openai:gpt-4o-mini"`; `None`: the config's).
        storage: the tree's `MainStorage`.
        config: the settings (`StelloConfig`, each field documented there); its
            agent-only fields (`checkpointer`, `durability`, ...) are not used here: compile
            the graph with the checkpointer you want.
        **settings: fields of `StelloConfig` as keywords (`tools=`, `schedule=`, ...),
            overriding `config`'s.
    """
    if model is not None:
        settings["model"] = model
    return build_graph(StelloRuntime(storage, config, **settings))
