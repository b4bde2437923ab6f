"""The async twins of `BackendStorage`'s methods (a mixin of it, split off for length).

Each is its sync twin with `aread` / `awrite` for `read` / `write`: the same validation, the
same flow of primitives (`_flows`), driven without blocking the event loop (see `_txn`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import stello_graph.checkpoints._flows as flows
from stello_graph._copies import detached_all
from stello_graph.checkpoints._primitives import one
from stello_graph.checkpoints._serde import dumps, meta_to_row
from stello_graph.checkpoints._txn import Transactions
from stello_graph.checkpoints._validate import (
    CommitArgs,
    append_args,
    check_identifier,
    check_mapping,
    check_meta,
    check_node,
    check_non_negative,
    check_optional_text,
    check_text,
    checked_lease,
    commit_args,
    compression_args,
    copy_args,
    event_args,
    events_page_args,
    lease_args,
    lineage_args,
    memory_args,
    page_args,
    session_filter_args,
)
from stello_graph.checkpoints.backend import OptionalPrimitives, StorageBackend
from stello_graph.digest import SessionDigest
from stello_graph.events import StoredEvent
from stello_graph.lineage import ForkPoint
from stello_graph.models import (
    ChildL2,
    Compression,
    Lease,
    SessionMeta,
    SessionRole,
    SessionStats,
    SessionStatus,
    TopologyNode,
)
from stello_graph.storage import SessionSnapshot

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

__all__ = ["AsyncMethods"]


class AsyncMethods:
    """The async methods of `BackendStorage`: each awaits the flow its sync twin runs."""

    _txn: Transactions

    async def aget_session(self, session_id: str) -> SessionMeta | None:
        """Async twin of `get_session`."""
        return await self._txn.aread(flows.get_session(check_identifier(session_id)))

    async def aput_session(self, meta: SessionMeta) -> None:
        """Async twin of `put_session`."""
        await self._txn.awrite(one(StorageBackend.op_put_session, meta_to_row(check_meta(meta))))

    async def alist_sessions(
        self,
        *,
        status: SessionStatus | None = None,
        role: SessionRole | None = None,
        tags: Sequence[str] = (),
    ) -> list[SessionMeta]:
        """Async twin of `list_sessions`."""
        return await self._txn.aread(flows.list_sessions(*session_filter_args(status, role, tags)))

    async def aget_main_session(self) -> SessionMeta | None:
        """Async twin of `get_main_session`."""
        return await self._txn.aread(flows.main_session())

    async def aget_all_session_l2s(self) -> list[ChildL2]:
        """Async twin of `get_all_session_l2s`."""
        return await self._txn.aread(flows.l2s())

    async def alist_session_stats(self) -> list[SessionStats]:
        """Async twin of `list_session_stats`."""
        return await self._txn.aread(one(OptionalPrimitives.op_session_stats))

    async def aappend_records(
        self,
        session_id: str,
        messages: Sequence[BaseMessage],
        *,
        user_turn: bool = False,
        turn_id: str | None = None,
    ) -> int:
        """Async twin of `append_records`."""
        args = append_args(session_id, messages, user_turn, turn_id)
        return await self._txn.awrite(flows.append(*args))

    async def alist_record_turns(
        self,
        session_id: str,
        *,
        limit: int | None = None,
        offset: int = 0,
        role: str | None = None,
    ) -> list[tuple[str, int]]:
        """Async twin of `list_record_turns`."""
        args = page_args(session_id, limit, offset, role)
        return await self._txn.aread(flows.list_turns(*args))

    async def ahas_turn(self, session_id: str, turn_id: str) -> bool:
        """Async twin of `has_turn`."""
        sid, tid = check_identifier(session_id), check_identifier(turn_id, "turn_id")
        return await self._txn.aread(flows.has_turn(sid, tid))

    async def alist_records(
        self,
        session_id: str,
        *,
        limit: int | None = None,
        offset: int = 0,
        role: str | None = None,
    ) -> list[BaseMessage]:
        """Async twin of `list_records`."""
        args = page_args(session_id, limit, offset, role)
        return detached_all(await self._txn.aread(flows.list_records(*args)))

    async def ashared_records(self, session_id: str) -> list[BaseMessage]:
        """Async twin of `shared_records`."""
        return await self._txn.aread(flows.shared_records(check_identifier(session_id)))

    async def aread_session(
        self, session_id: str, *, records: bool = True
    ) -> SessionSnapshot | None:
        """Async twin of `read_session`."""
        flow = flows.read_session(check_identifier(session_id), bool(records))
        return await self._txn.aread(flow)

    async def acommit_records(
        self,
        session_id: str,
        messages: Sequence[BaseMessage],
        *,
        user_turn: bool = False,
        turn_id: str | None = None,
        insight: str | None = None,
        lease: Lease | None = None,
        release: bool = False,
    ) -> int:
        """Async twin of `commit_records`."""
        args = commit_args(session_id, messages, user_turn, turn_id, insight, lease)
        return await self._acommit_records(args, bool(release))

    async def _acommit_records(self, args: CommitArgs, release: bool) -> int:
        """Async twin of `_commit_records`."""
        return await self._txn.awrite(flows.commit_records(*args, release))

    async def acount_records(self, session_id: str) -> int:
        """Async twin of `count_records`."""
        return await self._txn.aread(flows.count(check_identifier(session_id)))

    async def aget_turn_count(self, session_id: str) -> int:
        """Async twin of `get_turn_count`."""
        return await self._txn.aread(flows.number(check_identifier(session_id), "turn_count"))

    async def atrim_records(self, session_id: str, keep_last: int) -> int:
        """Async twin of `trim_records`."""
        sid, keep = check_identifier(session_id), check_non_negative(keep_last, "keep_last")
        return await self._txn.awrite(flows.trim(sid, keep))

    async def aget_system_prompt(self, session_id: str) -> str | None:
        """Async twin of `get_system_prompt`."""
        return await self._txn.aread(flows.text(check_identifier(session_id), "system_prompt"))

    async def aput_system_prompt(self, session_id: str, prompt: str | None) -> None:
        """Async twin of `put_system_prompt`."""
        values = {"system_prompt": check_optional_text(prompt, "prompt")}
        await self._txn.awrite(
            one(StorageBackend.op_set_fields, check_identifier(session_id), values)
        )

    async def aget_insight(self, session_id: str) -> str | None:
        """Async twin of `get_insight`."""
        return await self._txn.aread(flows.text(check_identifier(session_id), "insight"))

    async def aput_insight(self, session_id: str, insight: str) -> None:
        """Async twin of `put_insight`."""
        values = {"insight": check_text(insight, "insight")}
        await self._txn.awrite(
            one(StorageBackend.op_set_fields, check_identifier(session_id), values)
        )

    async def aclear_insight(self, session_id: str, *, expected: str | None = None) -> bool:
        """Async twin of `clear_insight`."""
        args = check_identifier(session_id), check_optional_text(expected, "expected")
        return await self._txn.awrite(flows.clear_insight(*args))

    async def aget_memory(self, session_id: str) -> str | None:
        """Async twin of `get_memory`."""
        return await self._txn.aread(flows.text(check_identifier(session_id), "memory"))

    async def aput_memory(
        self, session_id: str, memory: str, *, through: int | None = None
    ) -> None:
        """Async twin of `put_memory`."""
        sid, values = memory_args(session_id, memory, through)
        await self._txn.awrite(flows.put_memory(sid, values))

    async def aget_memory_through(self, session_id: str) -> int:
        """Async twin of `get_memory_through`."""
        return await self._txn.aread(flows.number(check_identifier(session_id), "memory_through"))

    async def aget_subtree_synthesis(self, session_id: str) -> str | None:
        """Async twin of `get_subtree_synthesis`."""
        return await self._txn.aread(flows.text(check_identifier(session_id), "subtree_synthesis"))

    async def aput_subtree_synthesis(self, session_id: str, synthesis: str) -> None:
        """Async twin of `put_subtree_synthesis`."""
        values = {"subtree_synthesis": check_text(synthesis, "synthesis")}
        await self._txn.awrite(
            one(StorageBackend.op_set_fields, check_identifier(session_id), values)
        )

    async def aget_compression(self, session_id: str) -> Compression | None:
        """Async twin of `get_compression`."""
        return await self._txn.aread(flows.compression(check_identifier(session_id)))

    async def aput_compression(self, session_id: str, compression: Compression | None) -> None:
        """Async twin of `put_compression`."""
        sid, values = compression_args(session_id, compression)
        await self._txn.awrite(one(StorageBackend.op_set_fields, sid, values))

    async def aget_settings(self, session_id: str) -> dict[str, Any]:
        """Async twin of `get_settings`."""
        return await self._txn.aread(flows.settings(check_identifier(session_id)))

    async def aput_settings(self, session_id: str, settings: dict[str, Any]) -> None:
        """Async twin of `put_settings`."""
        values = {"settings": dumps(check_mapping(settings, "settings"), what="settings")}
        await self._txn.awrite(
            one(StorageBackend.op_set_fields, check_identifier(session_id), values)
        )

    async def aput_node(self, node: TopologyNode) -> None:
        """Async twin of `put_node`."""
        await self._txn.awrite(flows.put_node(check_node(node)))

    async def aget_node(self, node_id: str) -> TopologyNode | None:
        """Async twin of `get_node`."""
        return await self._txn.aread(flows.get_node(check_identifier(node_id, "node_id")))

    async def aget_children(self, parent_id: str) -> list[TopologyNode]:
        """Async twin of `get_children`."""
        return await self._txn.aread(
            one(OptionalPrimitives.op_children, check_identifier(parent_id, "parent_id"))
        )

    async def aget_ancestors(self, node_id: str) -> list[TopologyNode]:
        """Async twin of `get_ancestors`."""
        return await self._txn.aread(flows.ancestors(check_identifier(node_id, "node_id")))

    async def aget_tree(self) -> list[TopologyNode]:
        """Async twin of `get_tree`."""
        return await self._txn.aread(flows.tree())

    async def aremove_node(self, node_id: str, *, cascade: bool = False) -> list[str]:
        """Async twin of `remove_node`."""
        nid = check_identifier(node_id, "node_id")
        return await self._txn.awrite(flows.remove_node(nid, bool(cascade)))

    async def aget_global(self, key: str) -> Any:
        """Async twin of `get_global`."""
        return await self._txn.aread(flows.get_global(check_identifier(key, "key")))

    async def aput_global(self, key: str, value: Any) -> None:
        """Async twin of `put_global`."""
        text = dumps(value, what="A global value")
        await self._txn.awrite(
            one(StorageBackend.op_put_global, check_identifier(key, "key"), text)
        )

    async def acopy_records(self, source_id: str, target_id: str, *, count: int) -> int:
        """Async twin of `copy_records`."""
        args = copy_args(source_id, target_id, count)
        return await self._txn.awrite(flows.copy_records(*args))

    async def aget_lineage(self, session_id: str) -> ForkPoint | None:
        """Async twin of `get_lineage`."""
        return await self._txn.aread(flows.lineage(check_identifier(session_id)))

    async def aput_lineage(self, session_id: str, source_id: str, at_turn: int | None) -> None:
        """Async twin of `put_lineage`."""
        await self._txn.awrite(
            one(StorageBackend.op_set_fields, *lineage_args(session_id, source_id, at_turn))
        )

    async def alist_lineage(self) -> dict[str, ForkPoint]:
        """Async twin of `list_lineage`."""
        return await self._txn.aread(flows.list_lineage())

    async def alist_session_digests(self) -> list[SessionDigest]:
        """Async twin of `list_session_digests`."""
        return await self._txn.aread(flows.digests())

    async def aappend_event(
        self,
        kind: str,
        session_id: str | None = None,
        data: Mapping[str, Any] | None = None,
        *,
        at: datetime | None = None,
    ) -> int:
        """Async twin of `append_event`."""
        return await self._txn.awrite(flows.append_event(*event_args(kind, session_id, data, at)))

    async def aevents_after(self, cursor: int = 0, *, limit: int = 100) -> list[StoredEvent]:
        """Async twin of `events_after`."""
        return await self._txn.aread(flows.events_after(*events_page_args(cursor, limit)))

    async def aacquire_lease(
        self, session_id: str, owner: str, ttl: float, *, replace: str | None = None
    ) -> Lease | None:
        """Async twin of `acquire_lease`."""
        args = lease_args(session_id, owner, ttl, replace)
        return await self._txn.awrite(flows.acquire_lease(*args))

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
        return await self._alease_session(args, str(operation))

    async def _alease_session(
        self, args: tuple[str, str, float, str | None], operation: str
    ) -> tuple[Lease, SessionSnapshot] | None:
        """Async twin of `_lease_session`."""
        return await self._txn.awrite(flows.lease_session(*args, operation))

    async def arenew_lease(self, lease: Lease, ttl: float) -> Lease | None:
        """Async twin of `renew_lease`."""
        args = lease_args(lease.session_id, lease.owner, ttl, None)
        return await self._txn.awrite(flows.renew_lease(lease, args[2]))

    async def arelease_lease(self, lease: Lease) -> bool:
        """Async twin of `release_lease`."""
        return await self._txn.awrite(flows.release_lease(checked_lease(lease)))

    async def aget_lease(self, session_id: str) -> Lease | None:
        """Async twin of `get_lease`."""
        return await self._txn.aread(flows.get_lease(check_identifier(session_id)))

    async def acheck_lease(self, lease: Lease) -> None:
        """Async twin of `check_lease`."""
        await self._txn.aread(flows.check_lease(checked_lease(lease)))
