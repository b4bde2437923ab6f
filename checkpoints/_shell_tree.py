"""`BackendStorage`'s methods beyond sessions and their records (a mixin of it, split off
for length): the per-session values, the topology, the global key-value, lineage and
digests, the event log and leases, each with its async twin beside it (the same
validation, the same flow of primitives from `_flows`, driven with `aread` / `awrite`
without blocking the event loop).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress
from datetime import datetime
from typing import TYPE_CHECKING, Any

import stello_graph.checkpoints._flows as flows
from stello_graph.checkpoints._primitives import Flow, node_by_id, one
from stello_graph.checkpoints._serde import dumps
from stello_graph.checkpoints._txn import Transactions
from stello_graph.checkpoints._validate import (
    check_identifier,
    check_mapping,
    check_node,
    check_optional_text,
    check_text,
    checked_lease,
    compression_values,
    copy_args,
    event_args,
    events_page_args,
    lease_args,
    lineage_args,
    memory_args,
)
from stello_graph.checkpoints.backend import StorageBackend
from stello_graph.digest import SessionDigest
from stello_graph.errors import SessionArchivedError, SessionNotFoundError
from stello_graph.events import StoredEvent
from stello_graph.lineage import ForkPoint
from stello_graph.models import Compression, Lease, TopologyNode

if TYPE_CHECKING:
    from stello_graph.models import SessionSnapshot

__all__ = ["TreeMethods"]


def _set_fields(session_id: str, values: dict[str, Any]) -> Flow[None]:
    """Set the session's checked `values`, once its id is checked too."""
    return one(StorageBackend.op_set_fields, check_identifier(session_id), values)


def _put_global(key: str, value: Any) -> Flow[None]:
    text = dumps(value, what="A global value")
    return one(StorageBackend.op_put_global, check_identifier(key, "key"), text)


class TreeMethods:
    """The per-session values, topology, globals, lineage, events and leases of
    `BackendStorage`, sync and async."""

    _txn: Transactions

    if TYPE_CHECKING:  # `MainStorage`'s

        def read_session(self, session_id: str) -> SessionSnapshot | None: ...

        async def aread_session(self, session_id: str) -> SessionSnapshot | None: ...

    # -- system prompt, insight, memory ---------------------------------------------------
    def get_system_prompt(self, session_id: str) -> str | None:
        """The system prompt, or `None`."""
        return self._txn.read(flows.text(check_identifier(session_id), "system_prompt"))

    async def aget_system_prompt(self, session_id: str) -> str | None:
        """Async twin of `get_system_prompt`."""
        return await self._txn.aread(flows.text(check_identifier(session_id), "system_prompt"))

    def put_system_prompt(self, session_id: str, prompt: str | None) -> None:
        """Set the system prompt; `None` removes it."""
        values = {"system_prompt": check_optional_text(prompt, "prompt")}
        self._txn.write(_set_fields(session_id, values))

    async def aput_system_prompt(self, session_id: str, prompt: str | None) -> None:
        """Async twin of `put_system_prompt`."""
        values = {"system_prompt": check_optional_text(prompt, "prompt")}
        await self._txn.awrite(_set_fields(session_id, values))

    def get_insight(self, session_id: str) -> str | None:
        """The pending insight, read without consuming it."""
        return self._txn.read(flows.text(check_identifier(session_id), "insight"))

    async def aget_insight(self, session_id: str) -> str | None:
        """Async twin of `get_insight`."""
        return await self._txn.aread(flows.text(check_identifier(session_id), "insight"))

    def put_insight(self, session_id: str, insight: str) -> None:
        """Replace the pending insight (an insight is never appended to another)."""
        values = {"insight": check_text(insight, "insight")}
        self._txn.write(_set_fields(session_id, values))

    async def aput_insight(self, session_id: str, insight: str) -> None:
        """Async twin of `put_insight`."""
        values = {"insight": check_text(insight, "insight")}
        await self._txn.awrite(_set_fields(session_id, values))

    def clear_insight(self, session_id: str, *, expected: str | None = None) -> bool:
        """Remove the pending insight; return whether one was removed.

        With `expected`, only remove it if it is still that text: an insight written by a
        newer integration while a turn was running is kept for the next turn.
        """
        args = check_identifier(session_id), check_optional_text(expected, "expected")
        return self._txn.write(flows.clear_insight(*args))

    async def aclear_insight(self, session_id: str, *, expected: str | None = None) -> bool:
        """Async twin of `clear_insight`."""
        args = check_identifier(session_id), check_optional_text(expected, "expected")
        return await self._txn.awrite(flows.clear_insight(*args))

    def get_memory(self, session_id: str) -> str | None:
        """The session's memory: L2 for a standard session, the synthesis for the main one."""
        return self._txn.read(flows.text(check_identifier(session_id), "memory"))

    async def aget_memory(self, session_id: str) -> str | None:
        """Async twin of `get_memory`."""
        return await self._txn.aread(flows.text(check_identifier(session_id), "memory"))

    def put_memory(self, session_id: str, memory: str, *, through: int | None = None) -> None:
        """Replace the memory; `through` (records covered) is kept when `None`.

        Raises:
            InvalidInputError: `through` is more than the session's records (counted in the
                write's own transaction).
        """
        self._txn.write(flows.put_memory(*memory_args(session_id, memory, through)))

    async def aput_memory(
        self, session_id: str, memory: str, *, through: int | None = None
    ) -> None:
        """Async twin of `put_memory`."""
        await self._txn.awrite(flows.put_memory(*memory_args(session_id, memory, through)))

    def get_memory_through(self, session_id: str) -> int:
        """How many records, from the first, the memory covers (0 if none)."""
        return self._txn.read(flows.number(check_identifier(session_id), "memory_through"))

    async def aget_memory_through(self, session_id: str) -> int:
        """Async twin of `get_memory_through`."""
        return await self._txn.aread(flows.number(check_identifier(session_id), "memory_through"))

    def get_subtree_synthesis(self, session_id: str) -> str | None:
        """What tree integration last made of the session's children (its branch summary,
        shown in its prompt), or `None`.
        """
        return self._txn.read(flows.text(check_identifier(session_id), "subtree_synthesis"))

    async def aget_subtree_synthesis(self, session_id: str) -> str | None:
        """Async twin of `get_subtree_synthesis`."""
        return await self._txn.aread(flows.text(check_identifier(session_id), "subtree_synthesis"))

    def put_subtree_synthesis(self, session_id: str, synthesis: str) -> None:
        """Replace the subtree synthesis of a node."""
        values = {"subtree_synthesis": check_text(synthesis, "synthesis")}
        self._txn.write(_set_fields(session_id, values))

    async def aput_subtree_synthesis(self, session_id: str, synthesis: str) -> None:
        """Async twin of `put_subtree_synthesis`."""
        values = {"subtree_synthesis": check_text(synthesis, "synthesis")}
        await self._txn.awrite(_set_fields(session_id, values))

    def get_compression(self, session_id: str) -> Compression | None:
        """The summary that replaces the oldest records in prompts, if there is one."""
        return self._txn.read(flows.compression(check_identifier(session_id)))

    async def aget_compression(self, session_id: str) -> Compression | None:
        """Async twin of `get_compression`."""
        return await self._txn.aread(flows.compression(check_identifier(session_id)))

    def put_compression(self, session_id: str, compression: Compression | None) -> None:
        """Replace (or drop, with `None`) the compression summary. `trim_records` moves its
        `through` back like the L2 cursor.
        """
        self._txn.write(_set_fields(session_id, compression_values(compression)))

    async def aput_compression(self, session_id: str, compression: Compression | None) -> None:
        """Async twin of `put_compression`."""
        await self._txn.awrite(_set_fields(session_id, compression_values(compression)))

    def get_settings(self, session_id: str) -> dict[str, Any]:
        """The session's orchestration settings (JSON object; empty when none)."""
        return self._txn.read(flows.settings(check_identifier(session_id)))

    async def aget_settings(self, session_id: str) -> dict[str, Any]:
        """Async twin of `get_settings`."""
        return await self._txn.aread(flows.settings(check_identifier(session_id)))

    def put_settings(self, session_id: str, settings: dict[str, Any]) -> None:
        """Replace the session's orchestration settings."""
        values = {"settings": dumps(check_mapping(settings, "settings"), what="settings")}
        self._txn.write(_set_fields(session_id, values))

    async def aput_settings(self, session_id: str, settings: dict[str, Any]) -> None:
        """Async twin of `put_settings`."""
        values = {"settings": dumps(check_mapping(settings, "settings"), what="settings")}
        await self._txn.awrite(_set_fields(session_id, values))

    # -- topology -------------------------------------------------------------------------
    def put_node(self, node: TopologyNode) -> None:
        """Insert, move or relabel a node; a moved node keeps its place in creation order.

        Raises:
            SessionNotFoundError: no session has the node's id.
            NodeNotFoundError: the parent node does not exist.
            TopologyCycleError: the new parent lies inside the node's subtree.
        """
        self._txn.write(flows.put_node(check_node(node)))

    async def aput_node(self, node: TopologyNode) -> None:
        """Async twin of `put_node`."""
        await self._txn.awrite(flows.put_node(check_node(node)))

    def get_node(self, node_id: str) -> TopologyNode | None:
        """The node, or `None`."""
        nid = check_identifier(node_id, "node_id")
        return self._txn.read(node_by_id(nid))

    async def aget_node(self, node_id: str) -> TopologyNode | None:
        """Async twin of `get_node`."""
        nid = check_identifier(node_id, "node_id")
        return await self._txn.aread(node_by_id(nid))

    def get_children(self, parent_id: str) -> list[TopologyNode]:
        """Direct children of a node, in the order they were created."""
        pid = check_identifier(parent_id, "parent_id")
        return self._txn.read(one(StorageBackend.op_nodes, None, pid))

    async def aget_children(self, parent_id: str) -> list[TopologyNode]:
        """Async twin of `get_children`."""
        pid = check_identifier(parent_id, "parent_id")
        return await self._txn.aread(one(StorageBackend.op_nodes, None, pid))

    def get_ancestors(self, node_id: str) -> list[TopologyNode]:
        """Parent, grandparent, ... up to the root (nearest first)."""
        return self._txn.read(flows.ancestors(check_identifier(node_id, "node_id")))

    async def aget_ancestors(self, node_id: str) -> list[TopologyNode]:
        """Async twin of `get_ancestors`."""
        return await self._txn.aread(flows.ancestors(check_identifier(node_id, "node_id")))

    def get_tree(self) -> list[TopologyNode]:
        """Every node in depth-first pre-order: a parent, then each child's subtree in turn,
        siblings in creation order (the order in which a tree view lists them)."""
        return self._txn.read(flows.tree())

    async def aget_tree(self) -> list[TopologyNode]:
        """Async twin of `get_tree`."""
        return await self._txn.aread(flows.tree())

    def remove_node(self, node_id: str, *, cascade: bool = False) -> list[str]:
        """Remove a node (and with `cascade` its subtree) together with its sessions' data.

        Returns the removed ids, the node first, then its descendants breadth-first.

        Raises:
            NodeNotFoundError: there is no such node.
            NodeHasChildrenError: the node has children and `cascade` is false.
        """
        nid = check_identifier(node_id, "node_id")
        return self._txn.write(flows.remove_node(nid, bool(cascade)))

    async def aremove_node(self, node_id: str, *, cascade: bool = False) -> list[str]:
        """Async twin of `remove_node`."""
        nid = check_identifier(node_id, "node_id")
        return await self._txn.awrite(flows.remove_node(nid, bool(cascade)))

    # -- global key-value -----------------------------------------------------------------
    def get_global(self, key: str) -> Any:
        """The JSON value stored under `key`, or `None`."""
        return self._txn.read(flows.get_global(check_identifier(key, "key")))

    async def aget_global(self, key: str) -> Any:
        """Async twin of `get_global`."""
        return await self._txn.aread(flows.get_global(check_identifier(key, "key")))

    def put_global(self, key: str, value: Any) -> None:
        """Store a JSON-serialisable value under `key` (replacing any previous one)."""
        self._txn.write(_put_global(key, value))

    async def aput_global(self, key: str, value: Any) -> None:
        """Async twin of `put_global`."""
        await self._txn.awrite(_put_global(key, value))

    # -- branching: copied records, lineage, digests ---------------------------------------
    def copy_records(self, source_id: str, target_id: str, *, count: int) -> int:
        """Append the first `count` records of `source_id` after those of `target_id`, as
        stored (no decoding, each keeps its `(turn_id, turn_seq)`); return the target's
        number of records afterwards. A fork uses it when nothing has to be rewritten. The
        SQL backends give a target without records a shared prefix instead of copies (no
        row written, the same reads; see `checkpoints/_shared_l3`).

        Raises:
            SessionNotFoundError: either session is missing.
            InvalidInputError: a bad id or count, or `count` is more than the source's
                records (counted in the write's own transaction).
        """
        return self._txn.write(flows.copy_records(*copy_args(source_id, target_id, count)))

    async def acopy_records(self, source_id: str, target_id: str, *, count: int) -> int:
        """Async twin of `copy_records`."""
        return await self._txn.awrite(flows.copy_records(*copy_args(source_id, target_id, count)))

    def get_lineage(self, session_id: str) -> ForkPoint | None:
        """Where the session was forked from (`forked_from`, `forked_at_turn`); `None` for
        a session that was not forked (or does not exist)."""
        return self._txn.read(flows.lineage(check_identifier(session_id)))

    async def aget_lineage(self, session_id: str) -> ForkPoint | None:
        """Async twin of `get_lineage`."""
        return await self._txn.aread(flows.lineage(check_identifier(session_id)))

    def put_lineage(self, session_id: str, source_id: str, at_turn: int | None) -> None:
        """Record that the session was forked from `source_id` at its user turn `at_turn`."""
        args = lineage_args(session_id, source_id, at_turn)
        self._txn.write(one(StorageBackend.op_set_fields, *args))

    async def aput_lineage(self, session_id: str, source_id: str, at_turn: int | None) -> None:
        """Async twin of `put_lineage`."""
        args = lineage_args(session_id, source_id, at_turn)
        await self._txn.awrite(one(StorageBackend.op_set_fields, *args))

    def list_lineage(self) -> dict[str, ForkPoint]:
        """The fork point of every forked session of the tree, by session id (one read)."""
        return self._txn.read(flows.list_lineage())

    async def alist_lineage(self) -> dict[str, ForkPoint]:
        """Async twin of `list_lineage`."""
        return await self._txn.aread(flows.list_lineage())

    def list_session_digests(self) -> list[SessionDigest]:
        """Every session's `SessionDigest` (label, status, parent, turns, L2, staleness,
        pending insight, last activity), in creation order, in one read."""
        return self._txn.read(flows.digests())

    async def alist_session_digests(self) -> list[SessionDigest]:
        """Async twin of `list_session_digests`."""
        return await self._txn.aread(flows.digests())

    # -- the event log --------------------------------------------------------------------
    def append_event(
        self,
        kind: str,
        session_id: str | None = None,
        data: Mapping[str, Any] | None = None,
        *,
        at: datetime | None = None,
    ) -> int:
        """Append an event to the tree's log; return its cursor (larger than every earlier
        one). `data` is a JSON object; `at` defaults to now. Inside a transaction, the event
        is written (or rolled back) with it."""
        args = event_args(kind, session_id, data, at)
        return self._txn.write(one(StorageBackend.op_append_event, *args))

    async def aappend_event(
        self,
        kind: str,
        session_id: str | None = None,
        data: Mapping[str, Any] | None = None,
        *,
        at: datetime | None = None,
    ) -> int:
        """Async twin of `append_event`."""
        args = event_args(kind, session_id, data, at)
        return await self._txn.awrite(one(StorageBackend.op_append_event, *args))

    def events_after(self, cursor: int = 0, *, limit: int = 100) -> list[StoredEvent]:
        """The tree's events with a cursor above `cursor`, oldest first, at most `limit`
        (1 to 10,000): every process sees them; follow the log from the last cursor seen.
        """
        return self._txn.read(flows.events_after(*events_page_args(cursor, limit)))

    async def aevents_after(self, cursor: int = 0, *, limit: int = 100) -> list[StoredEvent]:
        """Async twin of `events_after`."""
        return await self._txn.aread(flows.events_after(*events_page_args(cursor, limit)))

    # -- session lease ----------------------------------------------------------------------
    def acquire_lease(
        self, session_id: str, owner: str, ttl: float, *, replace: str | None = None
    ) -> Lease | None:
        """Take (or renew) the session's lease for `ttl` seconds; `None` if another holds it.

        The lease is free when nobody holds it, when it has expired, or when its holder is
        `replace` (one the caller found dead). Taken by a new owner, it gets a new fencing
        token; renewed by its owner, it keeps it. The first owner refused waits in line: until
        it takes the lease (or stops asking for half a second), nobody else does.

        Raises:
            SessionNotFoundError: no such session.
        """
        args = lease_args(session_id, owner, ttl, replace)
        found = self._txn.alone(one(StorageBackend.op_lease, *args, None, None))
        return None if found is None else found[0]

    async def aacquire_lease(
        self, session_id: str, owner: str, ttl: float, *, replace: str | None = None
    ) -> Lease | None:
        """Async twin of `acquire_lease`."""
        args = lease_args(session_id, owner, ttl, replace)
        found = await self._txn.aalone(one(StorageBackend.op_lease, *args, None, None))
        return None if found is None else found[0]

    def lease_session(
        self,
        session_id: str,
        owner: str,
        ttl: float,
        *,
        replace: str | None = None,
        operation: str = "a turn",
    ) -> tuple[Lease, SessionSnapshot] | None:
        """`acquire_lease` of an active session and, when taken, its `read_session` under
        it: what a turn does before it runs. `None` while another holds the lease (the asker
        waits in line, as `acquire_lease`). A read that fails gives the lease back.

        Raises:
            SessionNotFoundError / SessionArchivedError: no such session, or it is archived
                (refusing `operation`); nothing is written.
        """
        args = lease_args(session_id, owner, ttl, replace)
        step = one(StorageBackend.op_lease, *args, str(operation), flows.SNAPSHOT)
        found = self._txn.alone(step)
        if found is None:
            return None
        lease, read = found
        if read is not None:  # read in the lease's transaction
            return lease, flows.snapshot(*read)
        try:  # whatever ends the read (a refusal, a lost connection, Ctrl-C) frees the lease
            snapshot = self.read_session(session_id)
            return lease, _active(session_id, snapshot, str(operation))
        except BaseException:
            with suppress(Exception):  # else it lapses after its ttl
                self.release_lease(lease)
            raise

    async def alease_session(
        self,
        session_id: str,
        owner: str,
        ttl: float,
        *,
        replace: str | None = None,
        operation: str = "a turn",
    ) -> tuple[Lease, SessionSnapshot] | None:
        """Async twin of `lease_session`."""
        args = lease_args(session_id, owner, ttl, replace)
        step = one(StorageBackend.op_lease, *args, str(operation), flows.SNAPSHOT)
        found = await self._txn.aalone(step)
        if found is None:
            return None
        lease, read = found
        if read is not None:
            return lease, flows.snapshot(*read)
        try:
            snapshot = await self.aread_session(session_id)
            return lease, _active(session_id, snapshot, str(operation))
        except BaseException:
            with suppress(Exception):
                await self.arelease_lease(lease)
            raise

    def renew_lease(self, lease: Lease, ttl: float) -> Lease | None:
        """Extend `lease` if it still holds the session (same owner and token), else `None`."""
        args = lease_args(lease.session_id, lease.owner, ttl, None)
        return self._txn.write(flows.renew_lease(lease, args[2]))

    async def arenew_lease(self, lease: Lease, ttl: float) -> Lease | None:
        """Async twin of `renew_lease`."""
        args = lease_args(lease.session_id, lease.owner, ttl, None)
        return await self._txn.awrite(flows.renew_lease(lease, args[2]))

    def release_lease(self, lease: Lease) -> bool:
        """Free the session if `lease` still holds it (the token is kept, to keep growing),
        and the next-to-hold place if `lease.owner` keeps it; `True` if the lease was freed.
        `Lease(session_id, owner, 0, 0.0)`, never held, frees only the place.
        """
        return self._txn.alone(one(StorageBackend.op_release_lease, checked_lease(lease)))

    async def arelease_lease(self, lease: Lease) -> bool:
        """Async twin of `release_lease`."""
        return await self._txn.aalone(one(StorageBackend.op_release_lease, checked_lease(lease)))

    def get_lease(self, session_id: str) -> Lease | None:
        """The session's current lease (expired or not), or `None` when it is free."""
        return self._txn.read(flows.get_lease(check_identifier(session_id)))

    async def aget_lease(self, session_id: str) -> Lease | None:
        """Async twin of `get_lease`."""
        return await self._txn.aread(flows.get_lease(check_identifier(session_id)))

    def check_lease(self, lease: Lease) -> None:
        """Refuse a holder that lost its lease: call it inside the transaction that commits.

        Raises:
            LeaseLostError: another owner took the session over (or it was released).
        """
        self._txn.read(flows.check_lease(checked_lease(lease)))

    async def acheck_lease(self, lease: Lease) -> None:
        """Async twin of `check_lease`."""
        await self._txn.aread(flows.check_lease(checked_lease(lease)))


def _active(session_id: str, snapshot: SessionSnapshot | None, operation: str) -> SessionSnapshot:
    """The snapshot read under a lease just taken, refused when the session is missing or
    archived (only a call that bypassed the lease can have changed it since)."""
    if snapshot is None:
        raise SessionNotFoundError(session_id)
    if snapshot.meta.status == "archived":
        raise SessionArchivedError(session_id, operation)
    return snapshot
