"""Async primitives for a backend that does no I/O: each `aop_NAME` runs `op_NAME` inline.

`InMemoryMainStorage` mixes this in, so its async methods stay on the event loop (nothing
there can block it) instead of paying a thread hop per call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from stello_graph.checkpoints._serde import (
    EncodedMessage,
    EventRow,
    MetaRow,
    RecordTurn,
    SessionRead,
)
from stello_graph.checkpoints._txn import AsyncTransactionHooks, TransactionHooks
from stello_graph.digest import DigestRow
from stello_graph.models import (
    ChildL2,
    SessionMeta,
    SessionRole,
    SessionStats,
    SessionStatus,
    TopologyNode,
)

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

    from stello_graph.checkpoints.backend import ExportPart, L2Row, RowSink, StorageBackend

__all__ = ["InlineAsyncHooks", "InlineAsyncPrimitives"]


class InlineAsyncHooks:
    """`AsyncTransactionHooks` that run sync `TransactionHooks` inline."""

    def __init__(self, hooks: TransactionHooks) -> None:
        self._hooks = hooks

    async def begin(self, *, wait: bool) -> bool:
        return self._hooks.begin(wait=wait)

    async def commit(self) -> None:
        self._hooks.commit()

    async def rollback(self) -> None:
        self._hooks.rollback()

    async def savepoint(self, depth: int) -> None:
        self._hooks.savepoint(depth)

    async def release(self, depth: int) -> None:
        self._hooks.release(depth)

    async def rollback_to(self, depth: int) -> None:
        self._hooks.rollback_to(depth)


class InlineAsyncPrimitives:
    """The `aop_*` half of an `AsyncStorageBackend`, over the class's own `op_*` methods."""

    @property
    def _ops(self) -> StorageBackend:
        return cast("StorageBackend", self)

    @property
    def async_transaction_hooks(self) -> AsyncTransactionHooks:
        """The sync hooks, run inline."""
        return InlineAsyncHooks(self._ops.transaction_hooks)

    async def aop_session_exists(self, session_id: str) -> bool:
        return self._ops.op_session_exists(session_id)

    async def aop_get_session(self, session_id: str) -> SessionMeta | None:
        return self._ops.op_get_session(session_id)

    async def aop_put_session(self, row: MetaRow) -> None:
        return self._ops.op_put_session(row)

    async def aop_list_sessions(
        self, status: SessionStatus | None, role: SessionRole | None
    ) -> list[SessionMeta]:
        return self._ops.op_list_sessions(status, role)

    async def aop_l2s(self) -> list[ChildL2]:
        return self._ops.op_l2s()

    async def aop_session_stats(self) -> list[SessionStats]:
        return self._ops.op_session_stats()

    async def aop_get_fields(self, session_id: str, names: Sequence[str]) -> tuple[Any, ...] | None:
        return self._ops.op_get_fields(session_id, names)

    async def aop_read_session(
        self, session_id: str, names: Sequence[str], records: bool
    ) -> SessionRead | None:
        return self._ops.op_read_session(session_id, names, records)

    async def aop_set_fields(self, session_id: str, values: dict[str, Any]) -> None:
        return self._ops.op_set_fields(session_id, values)

    async def aop_all_fields(self, names: Sequence[str]) -> list[tuple[Any, ...]]:
        return self._ops.op_all_fields(names)

    async def aop_digests(self) -> list[DigestRow]:
        return self._ops.op_digests()

    async def aop_l2s_after(self, after: int, limit: int) -> list[L2Row]:
        return self._ops.op_l2s_after(after, limit)

    async def aop_export_rows(self, part: ExportPart, sink: RowSink) -> int:
        return self._ops.op_export_rows(part, sink)

    async def aop_delete_sessions(self, session_ids: list[str]) -> None:
        return self._ops.op_delete_sessions(session_ids)

    async def aop_append(
        self,
        session_id: str,
        records: list[EncodedMessage],
        at: str,
        user_turn: bool,
        turns: list[RecordTurn],
    ) -> int:
        return self._ops.op_append(session_id, records, at, user_turn, turns)

    async def aop_has_turn(self, session_id: str, turn_id: str) -> bool:
        return self._ops.op_has_turn(session_id, turn_id)

    async def aop_turns(self, session_id: str) -> list[RecordTurn]:
        return self._ops.op_turns(session_id)

    async def aop_records(self, session_id: str) -> Sequence[BaseMessage]:
        return self._ops.op_records(session_id)

    async def aop_count(self, session_id: str) -> int:
        return self._ops.op_count(session_id)

    async def aop_drop_oldest(self, session_id: str, count: int) -> None:
        return self._ops.op_drop_oldest(session_id, count)

    async def aop_copy_records(self, source_id: str, target_id: str, count: int) -> int:
        return self._ops.op_copy_records(source_id, target_id, count)

    async def aop_get_node(self, node_id: str) -> TopologyNode | None:
        return self._ops.op_get_node(node_id)

    async def aop_put_node(self, node: TopologyNode) -> None:
        return self._ops.op_put_node(node)

    async def aop_children(self, parent_id: str) -> list[TopologyNode]:
        return self._ops.op_children(parent_id)

    async def aop_all_nodes(self) -> list[TopologyNode]:
        return self._ops.op_all_nodes()

    async def aop_get_global(self, key: str) -> str | None:
        return self._ops.op_get_global(key)

    async def aop_put_global(self, key: str, value: str) -> None:
        return self._ops.op_put_global(key, value)

    async def aop_append_event(
        self, kind: str, session_id: str | None, payload: str, at: str
    ) -> int:
        return self._ops.op_append_event(kind, session_id, payload, at)

    async def aop_events_after(self, cursor: int, limit: int) -> list[EventRow]:
        return self._ops.op_events_after(cursor, limit)
