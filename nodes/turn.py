"""The turn: assemble -> model -> (tools -> model)* -> commit, as LangGraph nodes.

The records of a turn live in the graph state (`pending`) until `commit` writes them to L3 in
one transaction. A turn that fails, hits the tool-round limit or is abandoned therefore leaves
nothing in L3; an interrupted one (a tool called `interrupt()`) waits in the checkpoint and is
resumed with `Command(resume=...)`. `commit` is idempotent, so a turn resumed after a crash
that happened just after its commit never duplicates records.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, Literal

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    RemoveMessage,
    ToolMessage,
)
from langchain_core.runnables import RunnableConfig
from langgraph.types import Overwrite

from stello_graph._base import SessionBase
from stello_graph._context import message_text
from stello_graph._text import storable_message
from stello_graph._validate import check_id, check_text
from stello_graph.errors import StelloUsageError, ToolRoundLimitError
from stello_graph.events import emit
from stello_graph.nodes._lease import aturn_lease, turn_lease
from stello_graph.nodes._model_call import ainvoke_model, invoke_model, run_cancel
from stello_graph.nodes._runnable import StelloNode
from stello_graph.nodes.deps import StelloDeps
from stello_graph.nodes.entry import turn_output
from stello_graph.nodes.scheduling import TREE_TURNS_KEY, after_turn, forget_insight
from stello_graph.nodes.state import TurnState
from stello_graph.storage import MainStorage

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
    it already stored instead of storing the turn twice.
    """
    configurable = config.get("configurable") or {}
    task, thread = configurable.get("checkpoint_ns"), configurable.get("thread_id")
    if not task:
        return str(uuid.uuid4())
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"stello-turn/{thread}/{task}"))


def _start(session: SessionBase, state: State, insight: str | None, human_id: str) -> State:
    human = HumanMessage(content=state["input"], id=human_id)
    return {
        "pending": Overwrite([human]),  # type: ignore[typeddict-item]  # not a stream token
        "insight": insight,
        "tool_rounds": 0,
        "tool_calls": [],
        "content": "",
        # the input's tool_choice (cleared after this step) holds for the first model call
        "turn_tool_choice": state.get("tool_choice"),
    }


def make_assemble_node(deps: StelloDeps) -> StelloNode:
    """Node `assemble`: check the input and the session, open the turn's records."""

    def assemble(state: State, config: RunnableConfig) -> State:
        check_text(state.get("input"), "input")
        sid = check_id(state.get("session_id"))
        with turn_lease(deps.leases, sid, state, fresh=True) as held:
            session = deps.turn_session(sid)  # the stored settings, read under the lease
            insight = session.open_turn()
        emit(deps.bus, "turn_started", session.id)
        return {**_start(session, state, insight, _human_id(config)), **held.update()}

    async def aassemble(state: State, config: RunnableConfig) -> State:
        check_text(state.get("input"), "input")
        sid = check_id(state.get("session_id"))
        async with aturn_lease(deps.leases, sid, state, fresh=True) as held:
            session = await deps.aturn_session(sid)
            insight = await session.aopen_turn()
        emit(deps.bus, "turn_started", session.id)
        return {**_start(session, state, insight, _human_id(config)), **held.update()}

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


def _check_rounds(deps: StelloDeps, state: State, reply: AIMessage) -> State:
    if _asks_for_tools(reply) and state.get("tool_rounds", 0) >= deps.max_tool_rounds:
        raise ToolRoundLimitError(state["session_id"], deps.max_tool_rounds)
    return {"pending": [_own_id(reply, state["pending"])]}


def _tool_choice(state: State) -> Any:
    """The turn's forced tool choice, for its first model call only (later rounds are free)."""
    return state.get("turn_tool_choice") if state.get("tool_rounds", 0) == 0 else None


def make_model_node(deps: StelloDeps) -> StelloNode:
    """Node `model`: one call of the session's model on its context plus the turn so far."""

    def model(state: State, config: RunnableConfig) -> State:
        session = deps.session(state["session_id"])
        with turn_lease(deps.leases, session.id, state) as held:
            turn = _turn_id(_records(state))
            ctx = session.turn_context(insight=state.get("insight"), turn_id=turn)
            prompt, choice = ctx.prompt(state["pending"]), _tool_choice(state)
            reply = invoke_model(session, prompt, deps.model_timeout, choice, run_cancel(config))
            return {**_check_rounds(deps, state, reply), **held.update()}

    async def amodel(state: State) -> State:
        session = await deps.asession(state["session_id"])
        async with aturn_lease(deps.leases, session.id, state) as held:
            turn = _turn_id(_records(state))
            ctx = await session.aturn_context(insight=state.get("insight"), turn_id=turn)
            prompt, choice = ctx.prompt(state["pending"]), _tool_choice(state)
            reply = await ainvoke_model(session, prompt, deps.model_timeout, choice)
            return {**_check_rounds(deps, state, reply), **held.update()}

    return StelloNode("model", model, amodel)


def route_after_model(state: State) -> Literal["tools", "commit"]:
    """Router after `model`: run the tools the reply asked for, or commit the turn."""
    return "tools" if _asks_for_tools(state["pending"][-1]) else "commit"


# -- tools ----------------------------------------------------------------------------------
_NONE: State = {"pending": []}
"""The tool node's output for a reply whose every call was unreadable."""


def _last_reply(state: State) -> AIMessage:
    last = state["pending"][-1]
    assert isinstance(last, AIMessage), "the tools node runs after a reply"
    return last


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


def _tool_update(deps: StelloDeps, state: State, calls: list[Any], out: Any) -> State:
    if not isinstance(out, dict) or "pending" not in out:
        raise StelloUsageError(
            "A tool returned a Command; stello turns accept tools that return content only."
        )
    # a tool's output is not the user's text: a lone surrogate in it is mended, not refused
    results = [storable_message(m) for m in [*out["pending"], *_unreadable_calls(state)]]
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
            out = deps.tool_node(sid).invoke(state, config) if calls else _NONE
            return {**_tool_update(deps, state, calls, out), **held.update()}

    async def atools(state: State, config: RunnableConfig) -> State:
        sid = state["session_id"]
        async with aturn_lease(deps.leases, sid, state) as held:
            with deps.leases.busy(held.lease):
                calls = _announce(deps, state)
                node = deps.tool_node(sid)
                out = await node.ainvoke(state, config) if calls else _NONE
                return {**_tool_update(deps, state, calls, out), **held.update()}

    return StelloNode("tools", tools, atools)


# -- commit ---------------------------------------------------------------------------------
def _turn_id(records: Sequence[BaseMessage]) -> str | None:
    """A graph turn's id: its user message's, the same when the step runs again (`_human_id`)."""
    return records[0].id if records else None


def _committed(storage: MainStorage, session_id: str, records: Sequence[BaseMessage]) -> bool:
    """Whether this turn's records are already in L3 (a resumed turn that had committed): an
    index lookup of its turn id (its user message's id; records stored before turn ids were
    kept got the same at migration), wherever another writer appended since."""
    turn_id = _turn_id(records)
    return turn_id is not None and storage.has_turn(session_id, turn_id)


async def _acommitted(
    storage: MainStorage, session_id: str, records: Sequence[BaseMessage]
) -> bool:
    turn_id = _turn_id(records)
    return turn_id is not None and await storage.ahas_turn(session_id, turn_id)


def _records(state: State) -> list[BaseMessage]:
    return [m for m in state["pending"] if not isinstance(m, RemoveMessage)]


def _finish(deps: StelloDeps, session: SessionBase, state: State, turns: int, tree: int) -> State:
    insight = state.get("insight")
    if insight:
        emit(deps.bus, "insight_delivered", session.id, insight=insight)
        forget_insight(deps, session.id, insight)
    final = state["pending"][-1]
    emit(deps.bus, "turn_committed", session.id, turn_count=turns)
    after_turn(deps, session.id, session.role, turns, tree)
    return {"content": message_text(final.content), "turn_count": turns, **turn_output(state)}


def _counts_tree(deps: StelloDeps) -> bool:
    return deps.schedule is not None and deps.schedule.integrate_every_n_turns is not None


def make_commit_node(deps: StelloDeps) -> StelloNode:
    """Node `commit`: write the turn's records in one transaction, consume the insight."""

    def commit(state: State) -> State:
        session, s = deps.session(state["session_id"]), deps.storage
        records, tree = _records(state), 0
        with turn_lease(deps.leases, session.id, state, park=False) as held:
            with s.transaction():
                s.check_lease(held.lease)  # a turn that lost its lease commits nothing
                if not _committed(s, session.id, records):
                    turn = _turn_id(records)
                    session.commit_turn(records, insight=state.get("insight"), turn_id=turn)
                    if _counts_tree(deps):
                        tree = int(s.get_global(TREE_TURNS_KEY) or 0) + 1
                        s.put_global(TREE_TURNS_KEY, tree)
                turns = s.get_turn_count(session.id)
                if held.owned:
                    s.release_lease(held.lease)
            if held.owned:
                deps.leases.forget(held.lease)
        return {**_finish(deps, session, state, turns, tree), "lease": None}

    async def acommit(state: State) -> State:
        session, s = await deps.asession(state["session_id"]), deps.storage
        records, tree = _records(state), 0
        async with aturn_lease(deps.leases, session.id, state, park=False) as held:
            async with s.atransaction():
                await s.acheck_lease(held.lease)
                if not await _acommitted(s, session.id, records):
                    turn = _turn_id(records)
                    await session.acommit_turn(records, insight=state.get("insight"), turn_id=turn)
                    if _counts_tree(deps):
                        tree = int(await s.aget_global(TREE_TURNS_KEY) or 0) + 1
                        await s.aput_global(TREE_TURNS_KEY, tree)
                turns = await s.aget_turn_count(session.id)
                if held.owned:
                    await s.arelease_lease(held.lease)
            if held.owned:
                deps.leases.forget(held.lease)
        return {**_finish(deps, session, state, turns, tree), "lease": None}

    return StelloNode("commit", commit, acommit)
