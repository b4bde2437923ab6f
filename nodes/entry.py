"""The graph's edge in `messages`: a turn asked as a conversation, answered with records.

Besides `{"session_id", "input"}`, a turn can be asked the way LangGraph's own graphs are
(`MessagesState`, Studio's chat, a `langgraph_supervisor` worker, a node of a parent
graph): `{"messages": [...]}`. Its input is the newest user message of the list (the
session has its own history: the rest of the list is the caller's, not replayed), and its
session is `configurable.session_id`, else the input's `session_id`, else the tree's main
session. A turn given `input` without a `session_id` runs on that session too.

The node `enter` resolves both before `assemble` (only for these forms: a turn given
`session_id` and `input` starts at `assemble`). Every turn's output carries `messages`: its
records, the reply last, the user record keeping the id of the input message, so a parent's
`add_messages` merges it with the message it already has instead of adding it twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import HumanMessage, RemoveMessage, convert_to_messages
from langchain_core.runnables import RunnableConfig
from langgraph.types import Overwrite

from stello_graph._context import message_text
from stello_graph._validate import check_id
from stello_graph.errors import InvalidInputError, MainSessionNotFoundError
from stello_graph.nodes._runnable import StelloNode
from stello_graph.nodes.deps import StelloRuntime
from stello_graph.nodes.state import TurnState

__all__ = ["SESSION_KEY", "make_enter_node", "needs_entry", "turn_output"]

SESSION_KEY = "session_id"
"""The `configurable` key naming the session of a `messages` turn."""


def needs_entry(state: Mapping[str, Any]) -> bool:
    """Whether a turn's input needs `enter`: a `messages` input, or no `session_id`."""
    return state.get("input") is None or not state.get("session_id")


def _user_message(messages: object) -> HumanMessage:
    if not isinstance(messages, Sequence) or isinstance(messages, str | bytes):
        raise InvalidInputError(
            f'"messages" must be a list of messages, got {type(messages).__name__}.'
        )
    try:
        converted = convert_to_messages(messages)  # dicts and tuples as the SDK sends them
    except (ValueError, TypeError, NotImplementedError) as exc:
        raise InvalidInputError(f'"messages" holds something that is not a message: {exc}') from exc
    for message in reversed(converted):
        if isinstance(message, HumanMessage):
            return message
    raise InvalidInputError(
        'A turn given "messages" needs a user message among them; the newest one is its input.'
    )


def _configured_session(config: RunnableConfig) -> str | None:
    found = (config.get("configurable") or {}).get(SESSION_KEY)
    return None if found is None else check_id(found)


def _entered(state: TurnState, sid: str, message: HumanMessage | None) -> TurnState:
    out: TurnState = {"session_id": sid}
    out["input"] = state["input"] if message is None else message_text(message.content)
    if state.get("tool_choice") is not None:  # ephemeral: `assemble` reads it next step
        out["tool_choice"] = state["tool_choice"]
    return out


def _input_message(state: TurnState) -> HumanMessage | None:
    if state.get("input") is not None:
        return None
    if state.get("messages") is None:
        raise InvalidInputError(
            'A turn needs "input" (with "session_id") or "messages"; the input has neither.'
        )
    return _user_message(state["messages"])


def make_enter_node(deps: StelloRuntime) -> StelloNode:
    """Node `enter`: a turn's input and session from `messages` and the config."""

    def enter(state: TurnState, config: RunnableConfig) -> TurnState:
        message = _input_message(state)
        sid = state.get("session_id") or _configured_session(config)
        if not sid:
            main = deps.storage.get_main_session()
            if main is None:
                raise MainSessionNotFoundError(deps.storage.tree_id)
            sid = main.id
        return _entered(state, sid, message)

    async def aenter(state: TurnState, config: RunnableConfig) -> TurnState:
        message = _input_message(state)
        sid = state.get("session_id") or _configured_session(config)
        if not sid:
            main = await deps.storage.aget_main_session()
            if main is None:
                raise MainSessionNotFoundError(deps.storage.tree_id)
            sid = main.id
        return _entered(state, sid, message)

    return StelloNode("enter", enter, aenter)


def _input_id(state: TurnState) -> str | None:
    """The id of this run's input message, when the turn was asked as `messages`."""
    if state.get("messages") is None:
        return None
    try:
        return _user_message(state["messages"]).id
    except InvalidInputError:
        return None


def turn_output(state: TurnState) -> TurnState:
    """The `messages` output of a committed turn: its records, the reply last."""
    records = [m for m in state.get("pending", []) if not isinstance(m, RemoveMessage)]
    message_id = _input_id(state)
    if records and message_id and isinstance(records[0], HumanMessage):
        records[0] = records[0].model_copy(update={"id": message_id})
    return {"messages": Overwrite(records)}  # type: ignore[typeddict-item]
