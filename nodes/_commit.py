"""Committing a turn: its records to L3 in one transaction, the insight it showed consumed,
the lease freed when the run leaves nothing to write (`commit` node, and the model round that
commits a turn in `stello_graph.nodes.turn`)."""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.messages import BaseMessage
from langgraph.types import Overwrite

from stello_graph._base import SessionBase
from stello_graph._context import message_text
from stello_graph._flow import Atomic, Call, Flow, Storage, arun, run
from stello_graph.events import emit
from stello_graph.nodes._lease import TurnLease, aturn_lease, turn_lease
from stello_graph.nodes._runnable import StelloNode
from stello_graph.nodes.deps import StelloDeps
from stello_graph.nodes.entry import _records, turn_output
from stello_graph.nodes.scheduling import (
    TREE_TURNS_KEY,
    aforget_insight,
    after_turn,
    forget_insight,
)
from stello_graph.nodes.state import TurnState
from stello_graph.storage import MainStorage

__all__ = ["Commit", "make_commit_node"]

State = TurnState


def _turn_id(records: Sequence[BaseMessage]) -> str | None:
    """A graph turn's id: its user message's, the same when the step runs again (`_human_id`)."""
    return records[0].id if records else None


Commit = tuple[list[BaseMessage], str | None, str | None]
"""What a turn commits: its records, the insight it showed, its id."""


def _commit_steps(
    deps: StelloDeps, session: SessionBase, held: TurnLease, turn: Commit | None, lent: bool
) -> Flow[tuple[int, int]]:
    """Write `turn` (unless `None`: already stored) in one transaction under the turn's lease
    and release the lease there when it is the turn's own; `(user turns of the session,
    turns of the tree)`. The caller checked, under the same lease, that the turn is not in
    L3 yet (`has_turn`): only a run of the same step could store it, and that one would
    have to hold the lease. A turn to commit whose tree turns are not counted is one
    storage call (`commit_records`: one read, the append, one write); otherwise the commit
    and the tree's count share one transaction. A commit that freed the lease then wakes
    local waiters, or tells the lender.

    A lent lease is freed only with `lent` (the `model` round that opened the turn commits
    it: no step of the run came before it whose checkpoint could still be on its way to
    disk) and the lender's leave."""
    release = held.releases(lent)
    schedule = deps.schedule
    counts: tuple[int, int]
    if turn is not None and (schedule is None or schedule.integrate_every_n_turns is None):
        records, insight, turn_id = turn
        turns = yield from session.commit_flow(records, insight, held.lease, turn_id, release)
        counts = (turns, 0)
    else:
        counts = yield Atomic(_counted_commit(session, held, turn, release))
    if held.owned:
        deps.leases.forget(held.lease)
    elif release:
        held.released()
    return counts


def _counted_commit(
    session: SessionBase, held: TurnLease, turn: Commit | None, release: bool
) -> Flow[tuple[int, int]]:
    if turn is None:
        yield Storage(
            MainStorage.check_lease, held.lease
        )  # a turn that lost its lease commits nothing
        turns: int = yield Storage(MainStorage.get_turn_count, session.id)
        if release:
            yield Storage(MainStorage.release_lease, held.lease)
        return turns, 0
    records, insight, turn_id = turn
    turns = yield from session.commit_flow(records, insight, held.lease, turn_id, release)
    tree = int((yield Storage(MainStorage.get_global, TREE_TURNS_KEY)) or 0) + 1
    yield Storage(MainStorage.put_global, TREE_TURNS_KEY, tree)
    return turns, tree


def _done(
    deps: StelloDeps,
    session: SessionBase,
    held: TurnLease,
    state: State,
    records: Sequence[BaseMessage],
    counts: tuple[int, int],
    replace: bool = False,
) -> Flow[State]:
    """The state of a committed turn (its lender told first: `TurnLease.committed`); its
    events and the schedule's reaction; then the insight shown is deleted from the store
    (driven async, with the store's async API). `replace`: the turn's records become
    `pending` (a step that found its turn already in L3)."""
    turns, tree = counts
    final = records[-1] if records else None
    update: State = {
        "content": message_text(final.content) if final is not None else "",
        "turn_count": turns,
        **turn_output({**state, "pending": list(records)}, (session.id, turns)),
    }
    if state.get("lease") is not None:
        update["lease"] = None
    held.committed({**state, **update, "pending": list(records)})
    if replace:
        update["pending"] = Overwrite(list(records))  # type: ignore[typeddict-item]
    insight = state.get("insight")
    if insight:
        emit(deps.bus, "insight_delivered", session.id, insight=insight)
    emit(deps.bus, "turn_committed", session.id, turn_count=turns)
    after_turn(deps, session.id, session.role, turns, tree)
    yield Call(forget_insight, aforget_insight, (deps, session.id, insight))
    return update


def _commit_flow(
    deps: StelloDeps, session: SessionBase, held: TurnLease, state: State
) -> Flow[State]:
    """`commit`'s work under the turn's lease, written once for both drivers."""
    records = _records(state)
    turn = _turn_id(records)
    stored = turn is not None and (yield Storage(MainStorage.has_turn, session.id, turn))
    todo = None if stored else (records, state.get("insight"), turn)
    counts = yield from _commit_steps(deps, session, held, todo, False)
    return (yield from _done(deps, session, held, state, records, counts))


def make_commit_node(deps: StelloDeps) -> StelloNode:
    """Node `commit`: write the turn's records in one transaction, consume the insight.

    The `model` node commits the turn itself when its reply asks for no tools; this node is
    for graphs of your own that end a turn elsewhere (it commits nothing a second time: a
    turn already in L3 is only reported).
    """

    def commit(state: State) -> State:
        session = deps.session(state["session_id"])
        with turn_lease(deps.leases, session.id, state, park=False) as held:
            return run(_commit_flow(deps, session, held, state), deps.storage)

    async def acommit(state: State) -> State:
        session = await deps.asession(state["session_id"])
        async with aturn_lease(deps.leases, session.id, state, park=False) as held:
            return await arun(_commit_flow(deps, session, held, state), deps.storage)

    return StelloNode("commit", commit, acommit)
