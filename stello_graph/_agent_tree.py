"""`StelloAgent`'s tree reads and edits: children, ancestors, siblings, move, remove; the
lineage of forks and the sessions' digests."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from stello_graph._event_log import EventRecorder
from stello_graph._flow import Call, Flow, Storage, arun, run
from stello_graph._threads import CheckpointThreads
from stello_graph._validate import check_id
from stello_graph.digest import _STATUSES, SessionDigest
from stello_graph.errors import (
    InvalidInputError,
    NodeHasChildrenError,
    NodeNotFoundError,
    SessionNotFoundError,
)
from stello_graph.lease import SessionLeases
from stello_graph.lineage import ForkPoint
from stello_graph.main_session import MainSession
from stello_graph.models import SessionMeta, TopologyNode
from stello_graph.nodes.deps import StelloRuntime
from stello_graph.nodes.scheduling import (
    aunpublish,
    unpublish,
)
from stello_graph.storage import MainStorage

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

__all__ = []


class _Tree:
    """The tree of a `StelloAgent` (a part of it; see `stello_graph.agent`)."""

    storage: MainStorage
    _runtime: StelloRuntime
    _leases: SessionLeases
    main: MainSession
    _threads: CheckpointThreads
    _recorder: EventRecorder

    # The tree reads raise `NodeNotFoundError` for an id without a node (an unknown id, or a
    # session made outside the tree); an empty answer always means a node that has none.
    def children(self, session_id: str) -> list[TopologyNode]:
        """The direct children of a session's node, in creation order (read on demand).

        Raises:
            NodeNotFoundError: the id has no node.
        """
        return run(_nodes_flow(MainStorage.get_children, session_id), self.storage)

    async def achildren(self, session_id: str) -> list[TopologyNode]:
        """Async twin of `children`."""
        return await arun(_nodes_flow(MainStorage.get_children, session_id), self.storage)

    def ancestors(self, session_id: str) -> list[TopologyNode]:
        """The parent, grandparent, ... up to the main session (nearest first).

        Raises:
            NodeNotFoundError: the id has no node.
        """
        return run(_nodes_flow(MainStorage.get_ancestors, session_id), self.storage)

    async def aancestors(self, session_id: str) -> list[TopologyNode]:
        """Async twin of `ancestors`."""
        return await arun(_nodes_flow(MainStorage.get_ancestors, session_id), self.storage)

    def siblings(self, session_id: str) -> list[TopologyNode]:
        """The other children of the session's parent.

        Raises:
            NodeNotFoundError: the id has no node.
        """
        return run(_siblings_flow(check_id(session_id)), self.storage)

    async def asiblings(self, session_id: str) -> list[TopologyNode]:
        """Async twin of `siblings`."""
        return await arun(_siblings_flow(check_id(session_id)), self.storage)

    def _movable(self, session_id: object, new_parent_id: object) -> Flow[TopologyNode]:
        sid, parent = check_id(session_id), check_id(new_parent_id, "new parent id")
        if sid == self.main.id:
            raise InvalidInputError("The main session is the root of the tree; it cannot move.")
        node = yield from _node_flow(sid)
        yield from _node_flow(parent)
        moved = node.model_copy(update={"parent_id": parent})
        yield Storage(MainStorage.put_node, moved)
        return moved

    def move(self, session_id: str, new_parent_id: str) -> TopologyNode:
        """Move a session, with its whole subtree, under another parent.

        Raises:
            NodeNotFoundError: either node does not exist.
            TopologyCycleError: the new parent is the session itself or lies in its subtree.
            InvalidInputError: the session is the main session.
        """
        return run(self._movable(session_id, new_parent_id), self.storage)

    async def amove(self, session_id: str, new_parent_id: str) -> TopologyNode:
        """Async twin of `move`."""
        return await arun(self._movable(session_id, new_parent_id), self.storage)

    def _removable(self, session_id: object, cascade: bool) -> Flow[str]:
        """The session's id, refused before its lease is taken: the main session, a session
        without a node, one with children (unless `cascade`)."""
        sid = check_id(session_id)
        if sid == self.main.id:
            raise InvalidInputError(
                "The main session is the root of the tree; it cannot be removed."
            )
        yield from _node_flow(sid)
        children = yield Storage(MainStorage.get_children, sid)
        if children and not cascade:
            raise NodeHasChildrenError(sid, len(children))
        return sid

    def _remove_flow(self, sid: str, cascade: bool) -> Flow[list[str]]:
        """Under the session's lease: its events queued so far stored (then blanked), the
        subtree removed with its checkpoint threads, what was published of it and the
        runtime's objects of it."""
        yield Call(self._recorder.flush, self._recorder.aflush)
        removed: list[str] = yield Storage(MainStorage.remove_node, sid, cascade=cascade)
        for gone in removed:
            yield from self._threads.drop(gone)
            yield Call(unpublish, aunpublish, (self._runtime, gone))
            self._runtime.forget(gone)
        return removed

    def remove(self, session_id: str, *, cascade: bool = False) -> list[str]:
        """Delete a session, its node and all its data; with `cascade`, its whole subtree.

        The checkpoint threads of every removed session go too (a turn in flight, or kept
        turns when checkpoints are not pruned, under the current or the earlier thread id),
        and what was published of it to the agent's store; its events in the tree's stored
        log keep their cursors but lose their details (labels, L2s, insights). So none of
        its text stays behind and a new session given the same id starts clean.

        Raises:
            NodeHasChildrenError: the session has children and `cascade` is false.
            NodeNotFoundError: the session has no node.
        """
        sid = run(self._removable(session_id, cascade), self.storage)
        with self._leases.hold(sid):
            return run(self._remove_flow(sid, cascade), self.storage)

    async def aremove(self, session_id: str, *, cascade: bool = False) -> list[str]:
        """Async twin of `remove`."""
        sid = await arun(self._removable(session_id, cascade), self.storage)
        async with self._leases.ahold(sid):
            return await arun(self._remove_flow(sid, cascade), self.storage)

    # -- lineage and digests ------------------------------------------------------------------
    def lineage(self, session_id: str) -> list[ForkPoint]:
        """Where a session came from, generation by generation (nearest first): the
        session's fork point (its source and the source's turn it starts from), then its
        source's, ... up to a session that was not forked (the main session) or a source
        removed since. Unlike `ancestors`, it does not change when a session is moved.

        Raises:
            SessionNotFoundError: there is no such session.
        """
        return run(lineage_flow(check_id(session_id)), self.storage)

    async def alineage(self, session_id: str) -> list[ForkPoint]:
        """Async twin of `lineage`."""
        return await arun(lineage_flow(check_id(session_id)), self.storage)

    def digests(self, *, status: str | None = None) -> list[SessionDigest]:
        """Every session's `SessionDigest` (only those with `status`, `"active"` or
        `"archived"`, when given), in creation order, from two whole-tree reads: what an
        outside orchestrator needs to run its own reflection with `Session.set_insight` and
        `consolidate`.

        Raises:
            InvalidInputError: an unknown `status`.
        """
        return run(_digests(status), self.storage)

    async def adigests(self, *, status: str | None = None) -> list[SessionDigest]:
        """Async twin of `digests`."""
        return await arun(_digests(status), self.storage)

    def digest(self, session_id: str) -> SessionDigest:
        """One session's `SessionDigest`.

        Raises:
            SessionNotFoundError: there is no such session.
        """
        return run(_digest(session_id), self.storage)

    async def adigest(self, session_id: str) -> SessionDigest:
        """Async twin of `digest`."""
        return await arun(_digest(session_id), self.storage)


def _node_flow(node_id: str) -> Flow[TopologyNode]:
    node: TopologyNode | None = yield Storage(MainStorage.get_node, node_id)
    if node is None:
        raise NodeNotFoundError(node_id)
    return node


def _nodes_flow(
    read: Callable[[MainStorage, str], list[TopologyNode]], session_id: str
) -> Flow[list[TopologyNode]]:
    """The nodes `read` finds for a session's node, which must exist."""
    sid = check_id(session_id)
    found: list[TopologyNode] = yield Storage(read, sid)
    if not found:
        yield from _node_flow(sid)
    return found


def _siblings_flow(sid: str) -> Flow[list[TopologyNode]]:
    node = yield from _node_flow(sid)
    if node.parent_id is None:
        return []
    children: list[TopologyNode] = yield Storage(MainStorage.get_children, node.parent_id)
    return [n for n in children if n.id != sid]


def lineage_flow(session_id: str, *, limit: int = 10_000) -> Flow[list[ForkPoint]]:
    """The fork points of `session_id`, its source, its source's source, ... (nearest
    first), read one generation at a time (`get_lineage`); stops at a session that was not
    forked, at a source that no longer exists, or after `limit` generations.

    Raises:
        SessionNotFoundError: `session_id` does not exist.
    """
    if (yield Storage(MainStorage.get_session, session_id)) is None:
        raise SessionNotFoundError(session_id)
    found: list[ForkPoint] = []
    seen = {session_id}
    current = session_id
    while len(found) < limit:
        point: ForkPoint | None = yield Storage(MainStorage.get_lineage, current)
        if point is None:
            break
        found.append(point)
        if point.source_id in seen:  # never stored by a fork; a hand-written cycle stops here
            break
        seen.add(point.source_id)
        current = point.source_id
    return found


def _digests(status: object = None) -> Flow[list[SessionDigest]]:
    """Every session's digest (with `status`, only those), in creation order."""
    if status is not None and status not in _STATUSES:
        raise InvalidInputError(f"status must be 'active', 'archived' or None, got {status!r}.")
    found: list[SessionDigest] = yield Storage(MainStorage.list_session_digests)
    return found if status is None else [d for d in found if d.status == status]


def _digest(session_id: object) -> Flow[SessionDigest]:
    """The digest of one session, from its own reads.

    Raises:
        SessionNotFoundError: there is no such session.
    """
    sid = check_id(session_id)
    meta: SessionMeta | None = yield Storage(MainStorage.get_session, sid)
    if meta is None:
        raise SessionNotFoundError(sid)
    node: TopologyNode | None = yield Storage(MainStorage.get_node, sid)
    through: int = yield Storage(MainStorage.get_memory_through, sid)
    records: list[BaseMessage] = yield Storage(MainStorage.shared_records, sid)
    stale = sum(record.type == "human" for record in records[through:])
    return SessionDigest(
        id=meta.id,
        label=meta.label,
        role=meta.role,
        status=meta.status,
        parent_id=node.parent_id if node is not None else None,
        turns=(yield Storage(MainStorage.get_turn_count, sid)),
        l2=(yield Storage(MainStorage.get_memory, sid)),
        stale_turns=stale,
        insight=(yield Storage(MainStorage.get_insight, sid)),
        last_activity=meta.updated_at,
    )
