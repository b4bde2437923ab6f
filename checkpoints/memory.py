"""`InMemoryMainStorage`: the `MainStorage` protocol over plain Python dicts.

It is the reference for anyone writing a backend of their own: each `op_*` method is one
primitive of `StorageBackend` that `BackendStorage` composes (validation, locking, async
twins and topology rules live there; its `aop_*` twins run the same code inline), and
transactions are an undo log: every change records how to revert itself, a savepoint is a
position in that log, and a rollback replays it backwards.

Values go through the same encoding as in SQLite (messages and metadata via JSON), so what
comes back is exactly what the SQLite storage would return, and a caller mutating an object
it passed in or got back never changes the stored data.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from stello_graph.checkpoints._inline import InlineAsyncPrimitives
from stello_graph.checkpoints._serde import (
    REMOVED_PAYLOAD,
    EncodedMessage,
    EventRow,
    MetaRow,
    RecordTurn,
    SessionRead,
    decode_message,
    encode_message,
    row_to_meta,
)
from stello_graph.checkpoints._shell import BackendStorage, tree_order
from stello_graph.checkpoints._txn import TransactionHooks
from stello_graph.digest import DigestRow
from stello_graph.errors import SessionNotFoundError
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

    from stello_graph.checkpoints.backend import ExportPart, L2Row, RowSink

__all__ = ["InMemoryMainStorage"]


@dataclass
class _Session:
    row: MetaRow
    """The encoded meta (see `_serde.MetaRow`); decoded into a fresh `SessionMeta` per read."""
    created_seq: int
    records: list[BaseMessage] = field(default_factory=list)
    turns: list[RecordTurn] = field(default_factory=list)
    """`(turn_id, turn_seq)` of each record, in the same order."""
    system_prompt: str | None = None
    insight: str | None = None
    memory: str | None = None
    memory_through: int = 0
    turn_count: int = 0
    subtree_synthesis: str | None = None
    compression: str | None = None
    compression_through: int = 0
    settings: str = "{}"
    lease_owner: str | None = None
    lease_token: int = 0
    lease_expires: float = 0.0
    lease_waiter: str | None = None
    lease_wait_until: float = 0.0
    forked_from: str | None = None
    forked_at_turn: int | None = None


@dataclass
class _Node:
    node: TopologyNode
    position: int


class _UndoLog:
    """The `TransactionHooks` of in-memory data: how to revert each change since `begin`.

    A savepoint is a position in the log; rolling back replays the log backwards to it.
    """

    def __init__(self) -> None:
        self._entries: list[Callable[[], None]] = []
        self._marks: list[int] = []

    def record(self, undo: Callable[[], None]) -> None:
        self._entries.append(undo)

    def begin(self, *, wait: bool) -> bool:
        self._entries.clear()
        self._marks.clear()
        return True

    def commit(self) -> None:
        self._entries.clear()

    def rollback(self) -> None:
        self._undo_to(0)

    def savepoint(self, depth: int) -> None:
        self._marks.append(len(self._entries))

    def release(self, depth: int) -> None:
        self._marks.pop()

    def rollback_to(self, depth: int) -> None:
        self._undo_to(self._marks.pop())

    def _undo_to(self, mark: int) -> None:
        while len(self._entries) > mark:
            self._entries.pop()()


class InMemoryMainStorage(BackendStorage, InlineAsyncPrimitives):
    """A `MainStorage` kept in memory, for tests and experiments.

    Thread-safe and asyncio-safe (same locking as `SqliteMainStorage`); transactions are
    atomic and nest as savepoints. Nothing survives the process. It does no I/O, so its
    async primitives run inline on the event loop (`InlineAsyncPrimitives`).

    Example:
        >>> from stello_graph.models import SessionMeta
        >>> storage = InMemoryMainStorage()
        >>> storage.put_session(SessionMeta(id="s1", label="Ideas"))
        >>> storage.get_session("s1").label
        'Ideas'
    """

    def __init__(self, *, tree_id: str = "default") -> None:
        self._log = _UndoLog()
        super().__init__(self, tree_id=tree_id)  # its own `StorageBackend`
        self._sessions: dict[str, _Session] = {}
        self._nodes: dict[str, _Node] = {}
        self._globals: dict[str, str] = {}
        self._events: list[EventRow] = []
        self._counter = 0

    @property
    def transaction_hooks(self) -> TransactionHooks:
        """The undo log: savepoints are positions in it, rollbacks replay it backwards."""
        return self._log

    def __repr__(self) -> str:
        return f"InMemoryMainStorage(tree_id={self.tree_id!r})"

    def close(self) -> None:
        """Wait for a running transaction; there is nothing else to release."""
        self._txn.close(lambda: None)

    def __enter__(self) -> InMemoryMainStorage:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _set(self, target: object, name: str, value: Any) -> None:
        """`setattr`, undone on rollback."""
        old = getattr(target, name)
        self._log.record(lambda: setattr(target, name, old))
        setattr(target, name, value)

    def _put(self, mapping: dict[str, Any], key: str, value: Any) -> None:
        """`mapping[key] = value`, undone on rollback."""
        if key in mapping:
            old = mapping[key]
            self._log.record(lambda: mapping.__setitem__(key, old))
        else:
            self._log.record(lambda: mapping.__delitem__(key))
        mapping[key] = value

    def _pop(self, mapping: dict[str, Any], key: str) -> None:
        """`del mapping[key]`, undone on rollback."""
        old = mapping.pop(key)
        self._log.record(lambda: mapping.__setitem__(key, old))

    def _next(self) -> int:
        self._counter += 1  # never undone: creation numbers only need to increase
        return self._counter

    def _session(self, session_id: str) -> _Session:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise SessionNotFoundError(session_id) from None

    # -- sessions -------------------------------------------------------------------------
    def op_session_exists(self, session_id: str) -> bool:
        return session_id in self._sessions

    def op_get_session(self, session_id: str) -> SessionMeta | None:
        session = self._sessions.get(session_id)
        return None if session is None else row_to_meta(session.row)

    def op_put_session(self, row: MetaRow) -> None:
        session_id, label = row[0], row[1]
        session = self._sessions.get(session_id)
        if session is None:
            self._put(self._sessions, session_id, _Session(row, self._next()))
        else:
            self._set(session, "row", row)
        node = self._nodes.get(session_id)
        if node is not None:
            self._set(node, "node", node.node.model_copy(update={"label": label}))

    def op_list_sessions(
        self, status: SessionStatus | None, role: SessionRole | None
    ) -> list[SessionMeta]:
        metas = (row_to_meta(session.row) for session in self._in_creation_order())
        return [
            meta
            for meta in metas
            if (status is None or meta.status == status) and (role is None or meta.role == role)
        ]

    def op_l2s(self) -> list[ChildL2]:
        children = []
        for session in self._in_creation_order():
            session_id, label, role, status = session.row[:4]
            if role == "standard" and status == "active" and session.memory is not None:
                children.append(ChildL2(session_id=session_id, label=label, l2=session.memory))
        return children

    def op_session_stats(self) -> list[SessionStats]:
        out = []
        for s in self._in_creation_order():
            meta, node = row_to_meta(s.row), self._nodes.get(s.row[0])
            out.append(
                SessionStats(
                    id=meta.id,
                    label=meta.label,
                    role=meta.role,
                    status=meta.status,
                    updated_at=meta.updated_at,
                    parent_id=node.node.parent_id if node is not None else None,
                    in_tree=node is not None,
                    turns=s.turn_count,
                    records=len(s.records),
                    memory_through=s.memory_through,
                    turns_since_memory=sum(
                        r.type == "human" for r in s.records[s.memory_through :]
                    ),
                    has_memory=s.memory is not None,
                    has_insight=s.insight is not None,
                    has_subtree_synthesis=s.subtree_synthesis is not None,
                )
            )
        return out

    def _in_creation_order(self) -> list[_Session]:
        return sorted(self._sessions.values(), key=lambda session: session.created_seq)

    def op_get_fields(self, session_id: str, names: Sequence[str]) -> tuple[Any, ...] | None:
        session = self._sessions.get(session_id)
        return None if session is None else tuple(getattr(session, name) for name in names)

    def op_read_session(
        self, session_id: str, names: Sequence[str], records: bool
    ) -> SessionRead | None:
        session = self._sessions.get(session_id)
        if session is None:
            return None
        values = tuple(getattr(session, name) for name in names)
        return row_to_meta(session.row), values, session.records if records else ()

    def op_set_fields(self, session_id: str, values: dict[str, Any]) -> None:
        session = self._session(session_id)
        for name, value in values.items():
            self._set(session, name, value)

    # -- records --------------------------------------------------------------------------
    def op_append(
        self,
        session_id: str,
        records: list[EncodedMessage],
        at: str,
        user_turn: bool,
        turns: list[RecordTurn],
    ) -> int:
        session = self._session(session_id)
        messages = [decode_message(data) for _, data in records]
        self._set(session, "turns", [*session.turns, *turns])
        self._set(session, "records", [*session.records, *messages])
        if records:  # new records are an update of the session: they move `updated_at`
            self._set(session, "row", (*session.row[:7], at))
        if user_turn:
            self._set(session, "turn_count", session.turn_count + 1)
        return len(session.records)

    def op_records(self, session_id: str) -> Sequence[BaseMessage]:
        session = self._sessions.get(session_id)
        return () if session is None else session.records

    def op_has_turn(self, session_id: str, turn_id: str) -> bool:
        session = self._sessions.get(session_id)
        return session is not None and any(turn[0] == turn_id for turn in session.turns)

    def op_turns(self, session_id: str) -> list[RecordTurn]:
        session = self._sessions.get(session_id)
        return [] if session is None else list(session.turns)

    def op_count(self, session_id: str) -> int:
        return len(self.op_records(session_id))

    def op_drop_oldest(self, session_id: str, count: int) -> None:
        session = self._session(session_id)
        self._set(session, "records", session.records[count:])
        self._set(session, "turns", session.turns[count:])

    # -- branching ------------------------------------------------------------------------
    def op_copy_records(self, source_id: str, target_id: str, count: int) -> int:
        # The decoded messages are shared, never mutated (lists are replaced on every
        # write): the copy is of references only, the in-memory form of a shared prefix
        # (`_shared_l3`), and a later trim or removal of the source cannot reach it.
        source, target = self._session(source_id), self._session(target_id)
        # the decoded records are shared, as they are never mutated (reads hand out copies)
        self._set(target, "turns", [*target.turns, *source.turns[:count]])
        self._set(target, "records", [*target.records, *source.records[:count]])
        return len(target.records)

    def op_all_fields(self, names: Sequence[str]) -> list[tuple[Any, ...]]:
        return [
            (s.row[0], *(getattr(s, name) for name in names)) for s in self._in_creation_order()
        ]

    def op_digests(self) -> list[DigestRow]:
        rows: list[DigestRow] = []
        for s in self._in_creation_order():
            node = self._nodes.get(s.row[0])
            stale = sum(r.type == "human" for r in s.records[s.memory_through :])
            parent = node.node.parent_id if node is not None else None
            rows.append((*s.row[:4], s.row[7], parent, s.turn_count, s.memory, stale, s.insight))
        return rows

    def op_l2s_after(self, after: int, limit: int) -> list[L2Row]:
        rows: list[L2Row] = []
        for session in self._in_creation_order():
            session_id, label, role, status = session.row[:4]
            if session.created_seq <= after or session.memory is None:
                continue
            if role == "standard" and status == "active":
                rows.append((session.created_seq, session_id, label, session.memory))
                if len(rows) == limit:
                    break
        return rows

    def op_export_rows(self, part: ExportPart, sink: RowSink) -> int:
        nodes = tree_order([entry.node for entry in self._nodes_in_order()])
        count = 0
        for node in nodes:
            session = self._sessions.get(node.id)
            if part == "nodes":
                sink((node.id, node.parent_id, node.label))
                count += 1
            elif session is not None:
                extra = (session.system_prompt, session.memory, session.insight)
                row = (*session.row, node.parent_id, session.turn_count, len(session.records),
                       *extra)  # fmt: skip
                if part == "sessions":
                    sink(row)
                    count += 1
                    continue
                if not session.records:
                    sink((*row, None))
                    count += 1
                for record in session.records:
                    sink((*row, encode_message(record)[1]))
                    count += 1
        return count

    # -- topology -------------------------------------------------------------------------
    def op_get_node(self, node_id: str) -> TopologyNode | None:
        entry = self._nodes.get(node_id)
        return None if entry is None else entry.node

    def op_put_node(self, node: TopologyNode) -> None:
        entry = self._nodes.get(node.id)
        if entry is None:
            self._put(self._nodes, node.id, _Node(node, self._next()))
        else:
            self._set(entry, "node", node)

    def op_children(self, parent_id: str) -> list[TopologyNode]:
        entries = [entry for entry in self._nodes.values() if entry.node.parent_id == parent_id]
        return [entry.node for entry in sorted(entries, key=lambda entry: entry.position)]

    def op_all_nodes(self) -> list[TopologyNode]:
        return [entry.node for entry in self._nodes_in_order()]

    def _nodes_in_order(self) -> list[_Node]:
        return sorted(self._nodes.values(), key=lambda entry: entry.position)

    def op_delete_sessions(self, session_ids: list[str]) -> None:
        for session_id in session_ids:
            if session_id in self._nodes:
                self._pop(self._nodes, session_id)
            self._pop(self._sessions, session_id)
        gone = set(session_ids)
        for index, row in enumerate(self._events):
            if row[2] in gone and row[3] != REMOVED_PAYLOAD:
                self._log.record(partial(self._events.__setitem__, index, row))
                self._events[index] = (*row[:3], REMOVED_PAYLOAD, row[4])

    # -- globals --------------------------------------------------------------------------
    def op_get_global(self, key: str) -> str | None:
        return self._globals.get(key)

    def op_put_global(self, key: str, value: str) -> None:
        self._put(self._globals, key, value)

    # -- the event log --------------------------------------------------------------------
    def op_append_event(self, kind: str, session_id: str | None, payload: str, at: str) -> int:
        cursor = self._events[-1][0] + 1 if self._events else 1
        self._events.append((cursor, kind, session_id, payload, at))
        self._log.record(lambda: self._events.__delitem__(-1))
        return cursor

    def op_events_after(self, cursor: int, limit: int) -> list[EventRow]:
        start = bisect.bisect_right(self._events, cursor, key=lambda row: row[0])
        return self._events[start : start + limit]
