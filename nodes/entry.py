"""The graph's edge in `messages`: a turn asked as a conversation, a thread as one session.

Besides `{"session_id", "input"}`, a turn can be asked the way LangGraph's own graphs are
(`MessagesState`, Studio's chat, Agent Chat UI, a `langgraph_supervisor` worker, a node of a
parent graph): `{"messages": [...]}`. Its input is the newest user message of the list (the
session has its own history, L3: the rest of the conversation is not replayed to the model).

Its session is the one the run names: the input's `session_id`, else `session_id` of the
run's context (`StelloContext`, LangGraph v1's `context=`), else `configurable.session_id`.
A run that names none continues its thread's session: on a checkpointed thread (a
`thread_id`, at the top of the run, not a subgraph's) the first `messages` run binds the
thread to a session (`thread_session`), a new child of the main session labelled from its
first message unless the run names one, and every later `messages` run continues it, so a
new thread never sees another thread's conversation and the threads of a tree are its
branches. A run naming a session binds the thread to it. Without a thread (no
`thread_id`, or a subgraph of a parent's run) the session is the tree's main session. A turn
given `input` without a `session_id` runs on the named session, else the thread's, else the
main session (it binds nothing).

The node `enter` resolves both before `assemble` (only for these forms: a turn given
`session_id` and `input` starts at `assemble`). The thread's `messages` is its
conversation (`ThreadMessages`): a `messages` turn's output is the whole conversation, its
records merged in, the user record keeping the id of the input message, so a parent's
`add_messages` merges it with the messages it already has instead of adding them twice. A
`{"session_id", "input"}` turn's `messages` are its own records, as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import HumanMessage, RemoveMessage, convert_to_messages
from langchain_core.runnables import RunnableConfig
from langgraph.graph.message import add_messages
from langgraph.runtime import get_runtime
from langgraph.types import Overwrite

from stello_graph._context import message_text
from stello_graph._fork import ForkRequest, afork_session, fork_session
from stello_graph._validate import check_id
from stello_graph.errors import InvalidInputError, MainSessionNotFoundError
from stello_graph.events import emit
from stello_graph.models import SessionMeta
from stello_graph.nodes._runnable import StelloNode
from stello_graph.nodes.deps import StelloRuntime
from stello_graph.nodes.state import TurnState

__all__ = ["SESSION_KEY", "make_enter_node", "needs_entry", "thread_label", "turn_output"]

SESSION_KEY = "session_id"
"""The key of `configurable` and of the run's context naming the session of a turn."""
LABEL_CHARS = 48
"""How much of a thread's first message labels the session it starts."""
_NS_SEP = "|"  # between the namespaces of a subgraph's checkpoint_ns (LangGraph's NS_SEP)


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


def _run_context() -> Mapping[str, Any]:
    """The run's context (`StelloContext`); empty outside a graph run or when none."""
    try:
        context = get_runtime().context
    except RuntimeError:  # the node called on its own, outside a graph
        return {}
    return context if isinstance(context, Mapping) else {}


def _named_session(state: TurnState, config: RunnableConfig) -> str | None:
    """The session the run names: input, then context, then `configurable`."""
    if state.get("session_id"):
        return state["session_id"]
    found = _run_context().get(SESSION_KEY)
    if found is None:
        found = (config.get("configurable") or {}).get(SESSION_KEY)
    return None if found is None else check_id(found)


def under_parent(config: RunnableConfig) -> bool:
    """Whether the run is a subgraph's: its `checkpoint_ns` has two parts or more."""
    return _NS_SEP in str((config.get("configurable") or {}).get("checkpoint_ns", ""))


def _on_a_thread(config: RunnableConfig) -> bool:
    """Whether the run is a thread's own: a `thread_id`, and not a subgraph's run."""
    conf = config.get("configurable") or {}
    return conf.get("thread_id") is not None and not under_parent(config)


def thread_label(message: HumanMessage) -> str:
    """The label of the session a thread's first message starts: its text, on one line,
    cut to `LABEL_CHARS`."""
    text = " ".join(message_text(message.content).split()) or "Conversation"
    return text if len(text) <= LABEL_CHARS else f"{text[: LABEL_CHARS - 3].rstrip()}..."


def _entered(state: TurnState, sid: str, message: HumanMessage | None, bind: bool) -> TurnState:
    out: TurnState = {"session_id": sid}
    if message is None:
        out["input"] = state["input"]
    else:
        out["input"] = message_text(message.content)
        out["asking"] = message.id or ""
        if bind:
            out["thread_session"] = sid
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
    message = _user_message(state["messages"])
    if message.id is not None and message.id == state.get("answered"):
        raise InvalidInputError(
            'This run\'s "messages" add no new user message to the thread: its newest one '
            f"(id {message.id!r}) was answered already. Send the next user message."
        )
    return message


class _Entry:
    """What `enter` decided before the session is found: the input message and the
    session, if the run names it or its thread has one; `new` when a new session is due."""

    def __init__(self, state: TurnState, config: RunnableConfig) -> None:
        self.message = _input_message(state)
        self.thread = self.message is not None and _on_a_thread(config)
        self.sid = _named_session(state, config)
        if self.sid is None:
            self.sid = state.get("thread_session") or None
        self.new = self.sid is None and self.thread

    def request(self, main_id: str) -> ForkRequest:
        assert self.message is not None
        return ForkRequest.build(main_id, thread_label(self.message))

    def done(self, deps: StelloRuntime, state: TurnState, main_id: str | None) -> TurnState:
        sid = self.sid
        if sid is None:
            if main_id is None:
                raise MainSessionNotFoundError(deps.storage.tree_id)
            sid = main_id
        return _entered(state, sid, self.message, self.thread)


def _started(deps: StelloRuntime, req: ForkRequest, meta: SessionMeta) -> str:
    emit(deps.bus, "session_forked", meta.id, parent_id=req.source_id, label=meta.label,
         by="thread")  # fmt: skip
    return meta.id


def make_enter_node(deps: StelloRuntime) -> StelloNode:
    """Node `enter`: a turn's input and session from `messages`, the context, the config
    and the thread (a new session for a thread's first `messages` run)."""

    def enter(state: TurnState, config: RunnableConfig) -> TurnState:
        entry = _Entry(state, config)
        main = None
        if entry.sid is None:
            found = deps.storage.get_main_session()
            main = None if found is None else found.id
            if entry.new and main is not None:
                req = entry.request(main)
                entry.sid = _started(deps, req, fork_session(deps.storage, req))
        return entry.done(deps, state, main)

    async def aenter(state: TurnState, config: RunnableConfig) -> TurnState:
        entry = _Entry(state, config)
        main = None
        if entry.sid is None:
            found = await deps.storage.aget_main_session()
            main = None if found is None else found.id
            if entry.new and main is not None:
                req = entry.request(main)
                entry.sid = _started(deps, req, await afork_session(deps.storage, req))
        return entry.done(deps, state, main)

    return StelloNode("enter", enter, aenter)


def turn_output(state: TurnState) -> TurnState:
    """The `messages` output of a committed turn: for a `messages` turn, the thread's
    conversation with the turn's records merged in (the user record keeping the input
    message's id); for a `{"session_id", "input"}` turn, its records, the reply last.

    Either way the user message it answered is marked answered (`asking` and `answered`
    both its id): a `messages` turn is one whose `asking`, set by `enter`, is not."""
    records = [m for m in state.get("pending", []) if not isinstance(m, RemoveMessage)]
    asking = state.get("asking")
    asked = bool(asking) and asking != state.get("answered")
    user = records[0] if records and isinstance(records[0], HumanMessage) else None
    if asked and user is not None:
        user = records[0] = user.model_copy(update={"id": asking})
    out: TurnState = {}
    if asked:
        conversation = add_messages(list[Any](state.get("messages") or []), list[Any](records))
        out["messages"] = Overwrite(conversation)  # type: ignore[typeddict-item]
    else:
        out["messages"] = Overwrite(records)  # type: ignore[typeddict-item]
    if user is not None and user.id:
        out["asking"] = out["answered"] = user.id
    return out
