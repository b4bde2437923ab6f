"""The turn: model -> (tools -> model)* as LangGraph nodes.

The `model` round that runs straight after the input opens the turn; the round whose reply
asks for no tools commits it: the turn's records live in the graph state (`pending`) until
then, and are written to L3 in one transaction, in the same step as the last model call. A
turn without tools is thus one checkpointed step (a plain LangGraph agent's is too), and one
with tools adds a step per tool round. A turn that fails, hits the tool-round limit or is
abandoned leaves nothing in L3; an interrupted one (a tool called `interrupt()`) waits in the
checkpoint and is resumed with `Command(resume=...)`. A step run again after it had
committed (a crash before its checkpoint, a replay) finds its turn in L3 by id and never
stores it twice.

`assemble` (open the turn in a step of its own) and `commit` (commit a turn whose records
are in the state) are the same work as separate nodes, for graphs of your own.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from functools import partial
from typing import Any, Literal

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    ToolMessage,
    convert_to_messages,
)
from langchain_core.runnables import RunnableConfig
from langgraph.errors import ParentCommand
from langgraph.types import Command, Overwrite

from stello_graph._base import SessionBase, TurnContext
from stello_graph._context import message_text
from stello_graph._flow import Call, Flow, Storage, arun, run
from stello_graph._text import storable_message
from stello_graph._validate import check_id, check_text
from stello_graph.errors import StelloUsageError, ToolRoundLimitError
from stello_graph.events import emit
from stello_graph.nodes._commit import _commit_steps, _done, _turn_id, make_commit_node
from stello_graph.nodes._lease import TurnLease, apark, aturn_lease, park, turn_lease
from stello_graph.nodes._model_call import ainvoke_model, invoke_model, run_cancel
from stello_graph.nodes._runnable import StelloNode
from stello_graph.nodes.deps import StelloDeps
from stello_graph.nodes.entry import _records, turn_output, under_parent
from stello_graph.nodes.scheduling import TREE_TURNS_KEY
from stello_graph.nodes.state import TurnState
from stello_graph.storage import MainStorage, SessionSnapshot

__all__ = [
    "TREE_TURNS_KEY",
    "make_assemble_node",
    "make_commit_node",
    "make_model_node",
    "make_tools_node",
    "route_after_model",
]

State = TurnState


# -- assemble -------------------------------------------------------------------------------
def _human_id(config: RunnableConfig) -> str:
    """The id of the turn's user message, the same each time this step runs again.

    It is derived from the step's task (LangGraph derives that from the checkpoint the step
    starts from): a turn resumed from a checkpoint written before its commit was (a crash
    with asynchronous checkpointing) makes the same message, so the commit finds the records
    it already stored instead of storing the turn twice. A crash that lost the writes of the
    START step before it makes a new one (LangGraph runs that step again, under new
    checkpoint ids), which is why `StelloAgent` names its turns in their input (`turn_id`).
    """
    configurable = config.get("configurable") or {}
    task, thread = configurable.get("checkpoint_ns"), configurable.get("thread_id")
    if not task:
        return str(uuid.uuid4())
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"stello-turn/{thread}/{task}"))


def _fresh(state: State, insight: str | None) -> State:
    """The turn's keys as a new turn starts them."""
    return {
        "insight": insight,
        "tool_rounds": 0,
        "tool_calls": [],
        "content": "",
        # the input's tool_choice (cleared after this step) holds for the first model call
        "turn_tool_choice": state.get("tool_choice"),
    }


def _checked(state: State) -> str:
    """The session of a turn's input, the input checked."""
    check_text(state.get("input"), "input")
    return check_id(state.get("session_id"))


def _assemble_flow(
    deps: StelloDeps, state: State, config: RunnableConfig, held: TurnLease
) -> Flow[State]:
    # the stored settings, read under the lease
    session = yield Call(deps.turn_session, deps.aturn_session, (held.lease.session_id,))
    insight = yield Call(session.open_turn, session.aopen_turn)
    emit(deps.bus, "turn_started", session.id)
    human = HumanMessage(content=state["input"], id=_human_id(config))
    # `Overwrite`: not a stream token
    opened: State = {"pending": Overwrite([human]), **_fresh(state, insight)}  # type: ignore[typeddict-item]
    return {**opened, **held.update()}


def make_assemble_node(deps: StelloDeps) -> StelloNode:
    """Node `assemble`: check the input and the session, open the turn's records."""

    def assemble(state: State, config: RunnableConfig) -> State:
        with turn_lease(deps.leases, _checked(state), state, fresh=True) as held:
            return run(_assemble_flow(deps, state, config, held), deps.storage)

    async def aassemble(state: State, config: RunnableConfig) -> State:
        async with aturn_lease(deps.leases, _checked(state), state, fresh=True) as held:
            return await arun(_assemble_flow(deps, state, config, held), deps.storage)

    return StelloNode("assemble", assemble, aassemble)


# -- model ----------------------------------------------------------------------------------
def _own_id(reply: AIMessage, pending: Sequence[BaseMessage]) -> AIMessage:
    """`pending` merges messages by id: a reply whose id is already among the turn's records
    (a provider or cache that reuses response ids) gets a fresh one instead of overwriting an
    earlier reply of the same turn."""
    if reply.id is not None and any(m.id == reply.id for m in pending):
        return reply.model_copy(update={"id": str(uuid.uuid4())})
    return reply


def _asks_for_tools(message: object) -> bool:
    """Whether a reply calls tools, counting calls whose arguments could not be parsed."""
    return isinstance(message, AIMessage) and bool(message.tool_calls or message.invalid_tool_calls)


def _tool_choice(state: State) -> Any:
    """The turn's forced tool choice, for its first model call only (later rounds are free)."""
    return state.get("turn_tool_choice") if state.get("tool_rounds", 0) == 0 else None


def _begin(state: State) -> tuple[bool, str]:
    """Whether this model step opens the turn, and the turn's session.

    It opens the turn when it runs straight after the run's input (the input keys are
    ephemeral, so a later round, after `tools` or `assemble`, sees none). A run with no
    input whose turn is not in flight either (nothing after a final reply) is refused."""
    opens = state.get("input") is not None
    records = _records(state)
    if (
        opens
        or not records
        or (isinstance(records[-1], AIMessage) and not _asks_for_tools(records[-1]))
    ):
        return True, _checked(state)
    return False, state["session_id"]


def _shown(state: State, opens: bool) -> dict[str, Any]:
    """`turn_context`'s `insight`: read it when the round opens the turn, else the one the
    turn shows since."""
    return {} if opens else {"insight": state.get("insight")}


def _turn_of(state: State, opens: bool, config: RunnableConfig) -> str | None:
    """The turn's id: the caller's (`turn_id`: `StelloAgent` names each turn, `as_tool` by
    its tool call, the same when a parent graph replays the call), else derived from the
    step (`_human_id`)."""
    if not opens:
        return _turn_id(_records(state))
    return state.get("turn_id") or _human_id(config)


RESUMING_KEY = "stello_resuming"
"""The `configurable` key with which `StelloAgent.resume` says its run continues a turn."""

HANDOFF_KEY = "stello_handoff"
"""The `configurable` key of a list in which a turn's first round, run without a
checkpointer (`StelloAgent`'s turns), leaves its state update when its reply asks for tools:
the agent writes it to the session's thread and the turn goes on there."""


def _rerun(state: State, config: RunnableConfig, opens: bool, replays: bool) -> bool:
    """Whether the step may be running again after it committed. A later round always may:
    its turn id is the turn's, whichever run it is in. The round that opens a turn
    `StelloAgent` named (`turn_id`) may only in a run its `resume` continues
    (`RESUMING_KEY`): a new input's turn id is new, and L3 cannot hold it yet; unless a
    caller may send the input of a turn it named again (`replays`: `as_tool` in a parent
    graph that replays the call). An unnamed turn's id is derived from its checkpoint, so
    a run its caller continues (after a crash, an interrupt, a replay) finds it again: its
    opening round always may."""
    if opens and state.get("turn_id") and not replays:
        return bool((config.get("configurable") or {}).get(RESUMING_KEY, False))
    return True


def _answered(state: State, opens: bool, stored: list[BaseMessage]) -> bool:
    """Whether the turn found in L3 under the turn's id is this one: a turn the caller named
    is, when it was asked the same input (a caller reusing an id for a new question asks
    a new turn)."""
    if not (opens and state.get("turn_id")):
        return True
    return bool(stored) and stored[0].content == state.get("input")


def _stored_turn(records: list[BaseMessage], turn_id: str) -> list[BaseMessage]:
    """The records of the committed turn `turn_id` among the session's `records`, read back
    from L3 (a step run again after it had committed: a crash before its checkpoint, a
    replay)."""
    return [m for m in records if m.response_metadata.get("stello_turn_id") == turn_id]


_UNSET: dict[str, Any] = {"tool_rounds": 0, "tool_calls": []}
"""What a turn's key reads as before any turn wrote it (`None` for the others): a key that
would be written with its present value is not written at all (a checkpoint write fewer)."""


def _handed(state: State, held: TurnLease) -> State:
    """`held.update()`, left out when the state already holds it."""
    update = held.update()
    return {} if state.get("lease") == update["lease"] else {"lease": update["lease"]}


def _round(
    deps: StelloDeps, state: State, opens: bool, turn: str | None, ctx: TurnContext
) -> tuple[State, State, list[BaseMessage]]:
    """The state as this round sees it, what it writes before its model call, and the records
    the prompt ends with.

    The round that opens the turn starts its records with the user message (whose id is the
    turn's id) and keeps the insight it shows for the turn's later rounds; of the turn's
    other keys it writes only those that change (each is a checkpoint write)."""
    if not opens:
        return state, {}, _records(state)
    assert turn is not None
    human = HumanMessage(content=state["input"], id=turn)
    emit(deps.bus, "turn_started", ctx.session_id)
    opened: State = {"pending": [human]}
    fresh = _fresh(state, ctx.insight)
    for key, value in fresh.items():
        if state.get(key, _UNSET.get(key)) != value:
            opened[key] = value  # type: ignore[literal-required]
    return {**state, **fresh}, opened, [human]


def _replied(
    deps: StelloDeps, view: State, opened: State, records: list[BaseMessage], reply: AIMessage
) -> tuple[State, list[BaseMessage]]:
    """The state update of a round whose model answered `reply`, and the turn's records."""
    if _asks_for_tools(reply) and view.get("tool_rounds", 0) >= deps.max_tool_rounds:
        raise ToolRoundLimitError(view["session_id"], deps.max_tool_rounds)
    reply = _own_id(reply, records)
    if not opened:
        return {"pending": [reply]}, [*records, reply]
    # the round that opens the turn replaces whatever an earlier turn left in `pending`
    opening: list[BaseMessage] = [*opened["pending"], reply]
    return {**opened, "pending": Overwrite(opening)}, [*records, reply]  # type: ignore[typeddict-item]


def _model_flow(
    deps: StelloDeps,
    state: State,
    config: RunnableConfig,
    held: TurnLease,
    round_of: tuple[bool, str, bool],
) -> Flow[State]:
    """`model`'s round under the turn's lease, written once for both drivers; `round_of`:
    whether it opens the turn and the session (`_begin`), and `replays`."""
    opens, sid, replays = round_of
    snap: SessionSnapshot | None = None
    if opens:
        snap = held.prefetched() or (yield Storage(MainStorage.read_session, sid))
    read = Call(deps.turn_session, deps.aturn_session, (sid, snap))
    session: SessionBase = yield read if opens else Call(deps.session, deps.asession, (sid,))
    turn = _turn_of(state, opens, config)
    if (
        turn is not None
        and _rerun(state, config, opens, replays)
        and (yield Storage(MainStorage.has_turn, sid, turn))
    ):
        stored = _stored_turn((yield Call(session.messages, session.amessages)), turn)
        if _answered(state, opens, stored):
            counts = yield from _commit_steps(deps, session, held, None, False)
            return (yield from _done(deps, session, held, state, stored, counts, True))
        turn = _human_id(config)
    shown = {"turn_id": turn, "snapshot": snap, **_shown(state, opens)}
    ctx: TurnContext = yield Call(
        partial(session.turn_context, **shown), partial(session.aturn_context, **shown)
    )
    view, opened, records = _round(deps, state, opens, turn, ctx)
    asked = (session, ctx.prompt(records), deps.model_timeout, _tool_choice(view))
    call = partial(invoke_model, cancel=run_cancel(config))
    reply: AIMessage = yield Call(call, ainvoke_model, asked)
    update, records = _replied(deps, view, opened, records, reply)
    if _asks_for_tools(reply):
        yield Call(park, apark, (deps.leases, held))
        handed: State = {**update, **_handed(state, held)}
        handoff = (config.get("configurable") or {}).get(HANDOFF_KEY)
        if handoff is not None:
            handoff.append(handed)
        return handed
    commit = (records, view.get("insight"), turn)
    counts = yield from _commit_steps(deps, session, held, commit, opens)
    done = yield from _done(deps, session, held, view, records, counts)
    return {**update, **done}


def make_model_node(deps: StelloDeps, *, replays: bool = True) -> StelloNode:
    """Node `model`: one call of the session's model on its context plus the turn so far.

    The round that runs straight after the input opens the turn (checks the input and the
    session, starts the turn's records with the user message); a reply that asks for no
    tools ends the turn: its records are committed to L3 in the same step, in one
    transaction, and the insight it showed is consumed. So a turn without tools is one
    checkpointed step, as a plain LangGraph agent's is. A step run again after it had
    committed (a crash before its checkpoint was written, a replay) finds its turn in L3 and
    returns it without calling the model. `replays`: whether an input may ask again a turn
    its caller named (`_rerun`); `StelloAgent`'s own turn graph names each turn afresh.
    """

    def model(state: State, config: RunnableConfig) -> State:
        opens, sid = _begin(state)
        with turn_lease(deps.leases, sid, state, fresh=opens, park=False) as held:
            flow = _model_flow(deps, state, config, held, (opens, sid, replays))
            return run(flow, deps.storage)

    async def amodel(state: State, config: RunnableConfig) -> State:
        opens, sid = _begin(state)
        async with aturn_lease(deps.leases, sid, state, fresh=opens, park=False) as held:
            flow = _model_flow(deps, state, config, held, (opens, sid, replays))
            return await arun(flow, deps.storage)

    return StelloNode("model", model, amodel)


def route_after_model(state: State) -> Literal["tools", "__end__"]:
    """Router after `model`: run the tools the reply asked for, or end (the turn committed,
    or `update_state` of a thread between turns, as `model`: nothing pending)."""
    pending = state.get("pending") or []
    return "tools" if pending and _asks_for_tools(pending[-1]) else "__end__"


# -- tools ----------------------------------------------------------------------------------
_NONE: dict[str, Any] = {"messages": []}
"""The tool node's output for a reply whose every call was unreadable."""


def _last_reply(state: State) -> AIMessage:
    last = state["pending"][-1]
    assert isinstance(last, AIMessage), "the tools node runs after a reply"
    return last


def _tool_input(state: State) -> dict[str, Any]:
    """What the `ToolNode` is given: the state, with the turn so far as its `messages`, the
    key a LangGraph tool's `Command(update={"messages": [...]})` writes (the user message
    under the id a parent graph gave it, as `turn_output` shows it: a handoff that passes the
    turn on to the parent adds no second copy of it)."""
    records: Overwrite = turn_output(state)["messages"]  # type: ignore[assignment]
    return {**state, "messages": records.value}


def _announce(deps: StelloDeps, state: State) -> list[dict[str, Any]]:
    last = _last_reply(state)
    calls = [dict(call) for call in last.tool_calls]
    for call in calls:
        emit(deps.bus, "tool_call", state["session_id"], name=call["name"], args=call["args"],
             tool_call_id=call["id"])  # fmt: skip
    return calls


def _unreadable_calls(state: State) -> list[ToolMessage]:
    """An error result for each call whose arguments the provider could not parse, so the
    model sees what went wrong and the tool-call group is complete in L3 (a provider refuses
    a history with a tool call left unanswered)."""
    last = _last_reply(state)
    return [
        ToolMessage(
            content=f"Error: the arguments of this call of {call.get('name')!r} could not be "
            f"read ({call.get('error') or 'invalid JSON'}): {call.get('args')!r}. "
            "Call the tool again with valid JSON arguments.",
            tool_call_id=call.get("id") or "",
            name=call.get("name") or "",
            status="error",
        )
        for call in last.invalid_tool_calls
    ]


_COMMAND_FORMS = (
    'a stello turn takes from a tool its result or `Command(update={"messages": '
    "[ToolMessage(..., tool_call_id=...)]})`"
)


def _command_results(command: Command[Any]) -> list[BaseMessage]:
    """The ToolMessages of a tool's `Command`, which stand for its result; any other form is
    refused, since a stello turn has no other state for it to write to, and so is a handoff
    when there is no parent graph to take it (`_tool_results` passes it on when there is)."""
    if command.graph == Command.PARENT:
        raise StelloUsageError(
            f"A tool handed off to the parent graph (goto={command.goto!r}), but this stello "
            "graph runs with no parent graph (a turn of `StelloAgent`, a run of the graph "
            "itself): a handoff needs it run as an agent or node of a parent graph "
            "(`create_swarm`, `StateGraph.add_node`); "
            f"{_COMMAND_FORMS}."
        )
    update = command.update if isinstance(command.update, dict) else {}
    others = [
        *(sorted(k for k in update if k != "messages")),
        *(["goto"] if command.goto else []),
        *(["resume"] if command.resume is not None else []),
    ]
    if others or not isinstance(command.update, dict):
        raise StelloUsageError(
            f"A tool returned a Command with {others or [type(command.update).__name__]!r}; "
            f"{_COMMAND_FORMS} (no other state keys, no goto)."
        )
    messages = convert_to_messages(update.get("messages") or [])
    stray = [type(m).__name__ for m in messages if not isinstance(m, ToolMessage)]
    if stray:
        raise StelloUsageError(
            f"A tool returned a Command whose messages hold {stray!r}; {_COMMAND_FORMS}."
        )
    return messages


def _tool_results(out: Any, config: RunnableConfig) -> list[BaseMessage]:
    """The results in a `ToolNode`'s output: a dict of messages, or (when a tool returned a
    `Command`) a list of such dicts and Commands. A handoff to the parent graph
    (`langgraph-swarm`'s) goes there as it is when there is one, the turn left unstored: the
    lease is released on the way out (`turn_lease`)."""
    nested = under_parent(config)
    for item in out if isinstance(out, list) else []:
        if isinstance(item, Command) and item.graph == Command.PARENT and nested:
            raise ParentCommand(item)
    found: list[BaseMessage] = []
    for item in out if isinstance(out, list) else [out]:
        if isinstance(item, Command):
            found.extend(_command_results(item))
        else:
            found.extend(item["messages"])
    return found


def _tool_update(
    deps: StelloDeps, state: State, calls: list[Any], out: Any, config: RunnableConfig
) -> State:
    # a tool's output is not the user's text: a lone surrogate in it is mended, not refused
    found = [*_tool_results(out, config), *_unreadable_calls(state)]
    results = [storable_message(m) for m in found]
    for msg in results:
        emit(deps.bus, "tool_result", state["session_id"], name=getattr(msg, "name", None),
             tool_call_id=getattr(msg, "tool_call_id", None), content=message_text(msg.content),
             status=getattr(msg, "status", "success"))  # fmt: skip
    return {
        "pending": results,
        "tool_rounds": state.get("tool_rounds", 0) + 1,
        "tool_calls": [*state.get("tool_calls", []), *calls],
    }


def make_tools_node(deps: StelloDeps) -> StelloNode:
    """Node `tools`: run the reply's tool calls in parallel; a failing tool becomes an error
    result the model sees. A tool may call `interrupt()` to wait for a human."""

    def tools(state: State, config: RunnableConfig) -> State:
        sid = state["session_id"]
        with turn_lease(deps.leases, sid, state) as held, deps.leases.busy(held.lease):
            calls = _announce(deps, state)
            out = deps.tool_node(sid).invoke(_tool_input(state), config) if calls else _NONE
            return {**_tool_update(deps, state, calls, out, config), **held.update()}

    async def atools(state: State, config: RunnableConfig) -> State:
        sid = state["session_id"]
        async with aturn_lease(deps.leases, sid, state) as held:
            with deps.leases.busy(held.lease):
                calls = _announce(deps, state)
                node = await deps.atool_node(sid)
                out = await node.ainvoke(_tool_input(state), config) if calls else _NONE
                return {**_tool_update(deps, state, calls, out, config), **held.update()}

    return StelloNode("tools", tools, atools)
