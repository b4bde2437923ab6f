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
`thread_id`, or a subgraph of a parent's run) the session is the one the conversation shows
(its newest reply's `MARK`), else the tree's main session. A turn given `input` without a
`session_id` runs on the named session, else the thread's, else the main session (it binds
nothing).

Time travel branches, never duplicates: every reply of a turn's `messages` output is marked
with its session and that session's turn count after it (`MARK`, in `response_metadata`;
never in L3). A turn whose conversation stands at an earlier turn of its session than the
session does (a thread run from an earlier checkpoint or after an edit of its `messages`, a
parent graph replaying its history, a client sending the conversation again from an earlier
point) goes on from a fork of the session at that turn (`at_turn`, lineage kept), and the
thread (or the parent's conversation, through the marks) continues the fork. A run naming
its session forks only when it replays an earlier checkpoint (`TRAVEL_KEY`, set by
`StelloCompiledGraph`): two threads may share a session on purpose.

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

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    RemoveMessage,
)
from langchain_core.runnables import RunnableConfig
from langgraph.graph.message import add_messages
from langgraph.runtime import get_runtime
from langgraph.types import Overwrite

from stello_graph._context import message_text
from stello_graph._flow import Call, Flow, Storage, arun, run
from stello_graph._fork import ForkRequest, afork_session, fork_session
from stello_graph._validate import MAX_LABEL_CHARS, check_id, check_label
from stello_graph.errors import InvalidInputError, MainSessionNotFoundError
from stello_graph.events import emit
from stello_graph.models import SessionMeta
from stello_graph.nodes._channels import conversation
from stello_graph.nodes._runnable import StelloNode
from stello_graph.nodes.deps import StelloRuntime
from stello_graph.nodes.state import TurnState
from stello_graph.storage import MainStorage

__all__ = [
    "SESSION_KEY",
    "TRAVEL_KEY",
    "make_enter_node",
    "needs_entry",
    "thread_label",
    "turn_output",
]

SESSION_KEY = "session_id"
"""The key of `configurable` and of the run's context naming the session of a turn."""
TRAVEL_KEY = "stello_time_travel"
"""The `configurable` key the compiled graph sets on a run from an earlier checkpoint."""
MARK = "stello_session"
"""The key of a reply's `response_metadata`, in a turn's `messages` output only (never in
L3), naming the session and its turn count after the turn: where the conversation stands."""
LABEL_CHARS = 48
"""How much of a thread's first message labels the session it starts."""
_NS_SEP = "|"  # between the namespaces of a subgraph's checkpoint_ns (LangGraph's NS_SEP)


def needs_entry(state: Mapping[str, Any]) -> bool:
    """Whether a turn's input needs `enter`: a `messages` input, or no `session_id`."""
    return state.get("input") is None or not state.get("session_id")


def _user_message(messages: object) -> HumanMessage:
    for message in reversed(conversation(messages)):
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


def _mark(messages: object) -> tuple[str, int] | None:
    """The session and turn count of the newest stello reply of a conversation (`MARK`)."""
    if not isinstance(messages, Sequence):
        return None
    for message in reversed(messages):
        found = getattr(message, "response_metadata", None)
        mark = found.get(MARK) if isinstance(found, dict) else None
        if isinstance(mark, dict) and isinstance(mark.get("id"), str):
            turns = mark.get("turns")
            return mark["id"], turns if isinstance(turns, int) else 0
    return None


def marked(message: BaseMessage, session_id: str, turns: int) -> BaseMessage:
    """A copy of a turn's reply marked with where its conversation stands (`MARK`)."""
    meta = {**message.response_metadata, MARK: {"id": session_id, "turns": turns}}
    return message.model_copy(update={"response_metadata": meta})


def thread_label(message: HumanMessage) -> str:
    """The label of the session a thread's first message starts: its text, on one line,
    cut to `LABEL_CHARS`."""
    text = " ".join(message_text(message.content).split()) or "Conversation"
    return text if len(text) <= LABEL_CHARS else f"{text[: LABEL_CHARS - 3].rstrip()}..."


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
    session, if the run names it, its thread has one or its conversation shows one; `new`
    when a new session is due; `rewind`: the turn count of that session the conversation
    stands at, when the turn may have to go on from there (see `make_enter_node`)."""

    def __init__(self, state: TurnState, config: RunnableConfig) -> None:
        self.message = _input_message(state)
        on_a_thread = (config.get("configurable") or {}).get("thread_id") is not None
        # a thread's own run: a `thread_id`, and not a subgraph's run
        self.thread = self.message is not None and on_a_thread and not under_parent(config)
        named = _named_session(state, config)
        self.sid = named or state.get("thread_session") or None
        mark = _mark(state.get("messages"))
        self.shown = self.sid is None and not self.thread and mark is not None
        if self.shown:  # a parent's conversation continues the session it shows
            self.sid = mark[0] if mark is not None else None
        travel = (config.get("configurable") or {}).get(TRAVEL_KEY) is True
        self.rewind: int | None = None
        if mark is not None and mark[0] == self.sid and (named is None or travel):
            self.rewind = mark[1]
        self.new = self.sid is None and self.thread

    def request(self, main_id: str) -> ForkRequest:
        assert self.message is not None
        return ForkRequest.build(main_id, thread_label(self.message))

    def behind(self, turns: int) -> bool:
        """Whether the conversation stands at an earlier turn than the session's `turns`."""
        return self.rewind is not None and 1 <= self.rewind < turns

    def branch(self, source: SessionMeta, turns: int) -> ForkRequest | None:
        """The fork the turn goes on from, when its conversation stands at an earlier turn
        of its session than the session's `turns`; `None` when it stands at the last."""
        if self.rewind is None or not self.behind(turns):
            return None
        suffix = f" (from turn {self.rewind})"
        label = check_label(source.label[: MAX_LABEL_CHARS - len(suffix)] + suffix)
        return ForkRequest.build(
            source.id, label, context="inherit", inherit_system_prompt=True, at_turn=self.rewind
        )

    def done(self, deps: StelloRuntime, state: TurnState, main_id: str | None) -> TurnState:
        sid = main_id if self.sid is None else self.sid
        if sid is None:
            raise MainSessionNotFoundError(deps.storage.tree_id)
        out: TurnState = {"session_id": sid}
        if self.message is None:
            out["input"] = state["input"]
        else:
            out["input"] = message_text(self.message.content)
            out["asking"] = self.message.id or ""
            if self.thread:
                out["thread_session"] = sid
        if state.get("tool_choice") is not None:  # ephemeral: `assemble` reads it next step
            out["tool_choice"] = state["tool_choice"]
        return out


def _fork(deps: StelloRuntime, req: ForkRequest, by: str) -> Flow[str]:
    meta: SessionMeta = yield Call(fork_session, afork_session, (deps.storage, req))
    at: dict[str, Any] = {} if req.at_turn is None else {"at_turn": req.at_turn}
    emit(deps.bus, "session_forked", meta.id, parent_id=req.source_id, label=meta.label,
         by=by, **at)  # fmt: skip
    return meta.id


def _enter_flow(deps: StelloRuntime, state: TurnState, config: RunnableConfig) -> Flow[TurnState]:
    entry = _Entry(state, config)
    main = None
    if entry.sid is not None and entry.rewind is not None:
        turns = yield Storage(MainStorage.get_turn_count, entry.sid)
        if entry.behind(turns) or (entry.shown and not turns):
            source = yield Storage(MainStorage.get_session, entry.sid)
            if source is None:  # gone: the main session, if the conversation showed it
                entry.sid = None if entry.shown else entry.sid
            elif (req := entry.branch(source, turns)) is not None:
                entry.sid = yield from _fork(deps, req, "time_travel")
    if entry.sid is None:
        found = yield Storage(MainStorage.get_main_session)
        main = None if found is None else found.id
        if entry.new and main is not None:
            entry.sid = yield from _fork(deps, entry.request(main), "thread")
    return entry.done(deps, state, main)


def make_enter_node(deps: StelloRuntime) -> StelloNode:
    """Node `enter`: a turn's input and session from `messages`, the context, the config,
    the thread and the conversation (a new session for a thread's first `messages` run).

    Time travel branches: when the conversation the turn continues stands at an earlier
    turn of its session than the session does (a run from an earlier checkpoint, a parent
    graph replaying or editing its state, a conversation sent again from an earlier point),
    the turn goes on from a fork of the session at that turn (`at_turn`), and the thread
    continues the fork. A run that names its session forks only when it is a replay of an
    earlier checkpoint (`TRAVEL_KEY`): two threads may share a session on purpose."""

    def enter(state: TurnState, config: RunnableConfig) -> TurnState:
        return run(_enter_flow(deps, state, config), deps.storage)

    async def aenter(state: TurnState, config: RunnableConfig) -> TurnState:
        return await arun(_enter_flow(deps, state, config), deps.storage)

    return StelloNode("enter", enter, aenter)


def _records(state: TurnState) -> list[BaseMessage]:
    """The turn's records in `pending` (without the `RemoveMessage`s of a reducer's input)."""
    return [m for m in state.get("pending") or [] if not isinstance(m, RemoveMessage)]


def turn_output(state: TurnState, mark: tuple[str, int] | None = None) -> TurnState:
    """The `messages` output of a committed turn: for a `messages` turn, the thread's
    conversation with the turn's records merged in (the user record keeping the input
    message's id); for a `{"session_id", "input"}` turn, its records, the reply last. With
    `mark` (the session and its turn count after the turn), the reply is marked with where
    the conversation stands (`MARK`).

    Either way the user message it answered is marked answered (`asking` and `answered`
    both its id): a `messages` turn is one whose `asking`, set by `enter`, is not."""
    records = _records(state)
    if mark is not None and records and isinstance(records[-1], AIMessage):
        records[-1] = marked(records[-1], *mark)
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
