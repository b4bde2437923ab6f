"""The storage backend protocol: the few primitives a new storage implements.

A third-party storage (PostgreSQL, say) does not write the 60-odd methods of `MainStorage`.
It implements `StorageBackend`: twenty primitive operations (`op_*`) and the six
`TransactionHooks`, and `BackendStorage` builds the whole `MainStorage` on top of them,
sync and async: argument validation, one lock with re-entrant transactions and savepoints,
paging, compare-and-clear of insights, leases, topology rules (cycles, cascades, tree order).
The same split as LangGraph's `BaseCheckpointSaver` (`get_tuple` / `list` / `put` /
`put_writes`, the rest built by the library). Six more (`OptionalPrimitives`: a count, a
turn lookup, whole-tree figures, the copy of a fork's records) are the backend's to add for
speed: one it lacks runs composed of the required ones.

    storage = BackendStorage(MyBackend(dsn), tree_id="alice")   # a full MainStorage

Contract of every primitive (what `BackendStorage` guarantees, and what it relies on):

* It is called with the storage's lock held, with arguments already validated (identifiers
  are non-empty strings, values are encoded), and every write runs inside a transaction
  opened with `TransactionHooks.begin` (nested ones as savepoints). A primitive never
  validates, locks or opens a transaction of its own, except the three of a turn
  (`op_lease`, `op_release_lease`, `op_commit_turn`): each is atomic by itself, called in
  the caller's transaction when one is open, else making its own.
* It reads and writes only the tree it was made for, the storage's `tree_id` (a backend
  that keeps several trees in one database filters every statement by it, as SQLite does).
* Reads of something missing return `None`, `()` or `[]`; writes to a session that does not
  exist raise `SessionNotFoundError` (`op_set_fields`, `op_append`, `op_drop_oldest`).
* What a read returns is not changed by later writes (return new objects or immutable ones);
  `op_records` may return a shared sequence, which callers never mutate.

Async: a backend that can do its I/O natively async (psycopg's `AsyncConnection`, say) also
implements `AsyncStorageBackend`: an `aop_NAME` for every `op_NAME` it has, same arguments,
result and contract, and `async_transaction_hooks` (`AsyncTransactionHooks`). `BackendStorage`'s
async methods then await those on the event loop; the logic between primitives is written
once (generator flows, `_flows`), so the sync and async methods cannot drift apart. A backend
with sync primitives only (SQLite) still gets every async method: its primitives run in the
storage's worker thread, never on the event loop.

The reference backend is `SqliteMainStorage` (`InMemoryMainStorage` is the same class on
SQLite's `:memory:`); it is its own backend (it subclasses `BackendStorage` and passes
itself). To hold a new backend to the same rules, run the test suites against it: name a
factory `module:function(tmp_path, tree_id)` that returns a fresh storage in
`STELLO_TEST_STORAGE`, and every test parametrised over the storage backends (the
`main_storage` and `api` fixtures of the storage and core suites) runs on it too:

    STELLO_TEST_STORAGE=mypkg.testing:open_storage pytest tests/storage tests/core
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib import import_module
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:  # no import at run time: the primitive flows name these protocols' methods
    from langchain_core.messages import BaseMessage

    from stello_graph.checkpoints._flows import QUEUE, choose_lease, release_changes
    from stello_graph.checkpoints._serde import (
        EncodedMessage,
        EventRow,
        MetaRow,
        RecordTurn,
        SessionRead,
    )
    from stello_graph.checkpoints._shell import FIELDS, BackendStorage
    from stello_graph.checkpoints._validate import CommitArgs
    from stello_graph.digest import DigestRow
    from stello_graph.models import (
        Lease,
        SessionMeta,
        SessionRole,
        SessionStats,
        SessionStatus,
        TopologyNode,
    )

__all__ = [
    "FIELDS",
    "AsyncStorageBackend",
    "AsyncTransactionHooks",
    "BackendStorage",
    "EncodedMessage",
    "EventRow",
    "ExportPart",
    "L2Row",
    "MetaRow",
    "OptionalPrimitives",
    "QUEUE",
    "RowSink",
    "SessionRead",
    "StorageBackend",
    "TransactionHooks",
    "choose_lease",
    "release_changes",
]

ExportPart = Literal["nodes", "sessions", "records"]
"""What `op_export_rows` reads, in the tree's depth-first pre-order (as `get_tree` lists it):

* `"nodes"`: `(id, parent_id, label)` of every node;
* `"sessions"`: `(*MetaRow, parent_id, turn_count, record_count, system_prompt, memory,
  insight)` of every session that has a node;
* `"records"`: the `"sessions"` row with one record's `data` appended (the stored JSON of
  `encode_message`), for each record of each of those sessions in order; a session without
  records comes once, with `None`.
"""

RowSink = Callable[[tuple[Any, ...]], None]
"""Takes the rows of `op_export_rows` one at a time, as the backend reads them."""

L2Row = tuple[int, str, str, str]
"""`(position, session_id, label, l2)` of `op_l2s_after`: `position` orders the sessions by
creation (a backend's own increasing number) and is what the next page starts after."""


class TransactionHooks(Protocol):
    """What a backend does at each transaction boundary; called with the lock held."""

    def begin(self, *, wait: bool) -> bool:
        """Open a write transaction; with `wait=False` return `False` instead of waiting."""
        ...

    def commit(self) -> None: ...

    def rollback(self) -> None: ...

    def savepoint(self, depth: int) -> None: ...

    def release(self, depth: int) -> None: ...

    def rollback_to(self, depth: int) -> None:
        """Undo everything since `savepoint(depth)` and drop that savepoint."""
        ...


class AsyncTransactionHooks(Protocol):
    """The async twins of `TransactionHooks`, for a native async backend."""

    async def begin(self, *, wait: bool) -> bool:
        """Open a write transaction; with `wait=False` return `False` instead of waiting."""
        ...

    async def commit(self) -> None: ...

    async def rollback(self) -> None: ...

    async def savepoint(self, depth: int) -> None: ...

    async def release(self, depth: int) -> None: ...

    async def rollback_to(self, depth: int) -> None:
        """Undo everything since `savepoint(depth)` and drop that savepoint."""
        ...


class StorageBackend(Protocol):
    """The primitives `BackendStorage` composes into a `MainStorage` (see the module doc).

    Sessions are stored as a `MetaRow` (`id, label, role, status, tags, metadata,
    created_at, updated_at`, all text, as `_serde.meta_to_row` encodes them) plus the
    per-session values named in `FIELDS` (system prompt, insight, memory and its cursor,
    turn count, subtree synthesis, compression, settings, lease columns), each `None`/0 until
    set. Records are `EncodedMessage`s (`(role, json)`) on the way in and LangChain messages
    on the way out. Topology nodes keep their creation order, even when moved.
    """

    @property
    def transaction_hooks(self) -> TransactionHooks:
        """Begin / commit / rollback and savepoints of the backend's transactions."""
        ...

    # -- sessions -------------------------------------------------------------------------
    def op_put_session(self, row: MetaRow) -> None:
        """Insert or replace the meta, keeping the rest of the session; give the session's
        topology node (if any) the row's label."""
        ...

    def op_list_sessions(
        self, status: SessionStatus | None, role: SessionRole | None
    ) -> list[SessionMeta]:
        """Sessions with that status and role (`None`: any), in creation order."""
        ...

    def op_set_fields(self, session_id: str, values: dict[str, Any]) -> None:
        """Set the given `FIELDS`; raise `SessionNotFoundError` when the session is missing."""
        ...

    def op_read_session(
        self, session_id: str, names: Sequence[str], records: bool
    ) -> SessionRead | None:
        """The session's meta and its named `FIELDS` (in that order), read together (one
        statement where the backend can), and with `records` every L3 record in append
        order as `op_records` returns them (else `()`);
        `None` when the session is missing. What a turn reads before its model call, and
        every read of one session's values."""
        ...

    def op_l2s_after(self, after: int, limit: int) -> list[L2Row]:
        """Up to `limit` of the active `standard` sessions that have a memory (L2), those
        after position `after` (0: from the first), in creation order, with their
        positions."""
        ...

    def op_export_rows(self, part: ExportPart, sink: RowSink) -> int:
        """Hand `sink` every row of `part` (see `ExportPart`) as it is read, in one query
        where the backend can stream one, holding none of them; return how many."""
        ...

    def op_delete_sessions(self, session_ids: list[str]) -> None:
        """Delete the sessions with all their data and their nodes (children come first),
        and replace the details of their events by `_serde.REMOVED_PAYLOAD` (each event
        keeps its cursor: none of a removed session's text stays in the log)."""
        ...

    # -- L3 records -----------------------------------------------------------------------
    def op_append(
        self,
        session_id: str,
        records: list[EncodedMessage],
        at: str,
        user_turn: bool,
        turns: list[RecordTurn],
    ) -> int:
        """Append the records after the existing ones, the `i`-th written by the turn
        `turns[i]` (`(turn_id, turn_seq)`); when there is at least one, set the session's
        `updated_at` to `at`; with `user_turn`, add one to `turn_count`. Return the number of
        records afterwards. Raise `SessionNotFoundError` for a missing session."""
        ...

    def op_turns(self, session_id: str) -> list[RecordTurn]:
        """`(turn_id, turn_seq)` of every record, in append order."""
        ...

    def op_records(self, session_id: str) -> Sequence[BaseMessage]:
        """Every record in append order (empty for a missing session); may be shared, and is
        never mutated by the caller."""
        ...

    def op_drop_oldest(self, session_id: str, count: int) -> None:
        """Delete the `count` oldest records (cursors are moved by the caller)."""
        ...

    # -- topology -------------------------------------------------------------------------
    def op_put_node(self, node: TopologyNode) -> None:
        """Insert the node at the end of the creation order, or update the parent and label of
        an existing one (keeping its place). The caller checked sessions, parents and cycles."""
        ...

    def op_nodes(self, node_id: str | None, parent_id: str | None) -> list[TopologyNode]:
        """The node `node_id` (at most one), else the direct children of `parent_id`, else
        every node of the tree, in creation order."""
        ...

    # -- global key-value -----------------------------------------------------------------
    def op_get_global(self, key: str) -> str | None:
        """The JSON text stored under `key`, or `None`."""
        ...

    def op_put_global(self, key: str, value: str) -> None:
        """Store JSON text under `key`, replacing any previous value."""
        ...

    # -- the event log --------------------------------------------------------------------
    def op_append_event(self, kind: str, session_id: str | None, payload: str, at: str) -> int:
        """Append an event (`payload`: JSON text, `at`: an ISO timestamp) to the tree's log;
        return its cursor, larger than that of every event of the tree before it."""
        ...

    def op_events_after(self, cursor: int, limit: int) -> list[EventRow]:
        """The tree's events with a cursor above `cursor`, in cursor order, at most `limit`."""
        ...

    # -- a turn's lease and commit: each atomic by itself ----------------------------------
    # Called with the lock held: inside the caller's transaction when one is open, else in a
    # transaction of the backend's own (PostgreSQL sends each as one statement with its
    # `BEGIN` and `COMMIT`, one round trip: a turn takes and gives back its lease every time).
    def op_lease(
        self,
        session_id: str,
        owner: str,
        ttl: float,
        replace: str | None,
        refuse: str | None,
        read: Sequence[str] | None,
    ) -> tuple[Lease, SessionRead | None] | None:
        """Take, renew or wait in line for the session's lease for `ttl` seconds, by the
        rules of `choose_lease` on the session's `QUEUE` fields, and write
        what it decides; the lease taken, or `None`. Raise `SessionNotFoundError` for a
        missing session and, with `refuse` (the operation refused), `SessionArchivedError`
        for an archived one, writing nothing. With `read` (`FIELDS` names), the backend may
        also read the session in the same transaction, as `op_read_session(session_id,
        read, True)` (what a turn reads: SQLite does); `None` in its place when it did not,
        and the session is then read under the lease."""
        ...

    def op_release_lease(self, lease: Lease) -> bool:
        """Free the session if `lease` holds it, and the next holder's place if its owner
        keeps it (`release_changes`); whether the lease was freed (`False` for a
        missing session)."""
        ...

    def op_commit_turn(self, args: CommitArgs, release: bool) -> int:
        """A turn's commit: refuse (writing nothing) a missing session
        (`SessionNotFoundError`), a lease that no longer holds it (`args`' lease, if any:
        `LeaseLostError`) and an archived one (`SessionArchivedError(session_id, "a turn's
        records")`); append the records (as `op_append`), clear the insight if it is still
        `args`' insight, and with `release` free the lease. Return the session's user turns
        afterwards."""
        ...


class OptionalPrimitives(Protocol):
    """Primitives a backend may add to `StorageBackend` for speed. Each one it lacks runs
    composed of the required ones (`_primitives`: a whole session's records read to count
    them, ...), which suits a small store; the reference backends
    implement them all, in one statement each. A native async backend adds the `aop_` twin
    of each one it implements."""

    def op_session_stats(self) -> list[SessionStats]:
        """Every session's `SessionStats` (its figures, read in one pass), in creation order."""
        ...

    def op_all_fields(self, names: Sequence[str]) -> list[tuple[Any, ...]]:
        """`(id, *values)` of every session, with the named `FIELDS` in that order, in
        creation order (one read for a whole tree: the lineage of every session)."""
        ...

    def op_digests(self) -> list[DigestRow]:
        """Every session's `DigestRow` (`stello_graph.digest`), in creation order, read in
        one pass: meta, node parent, turn count, memory, the user (`human`) records after the
        memory's cursor, insight."""
        ...

    def op_has_turn(self, session_id: str, turn_id: str) -> bool:
        """Whether a record of the session was written by the turn `turn_id` (an index
        lookup: the commit's idempotency check)."""
        ...

    def op_count(self, session_id: str) -> int:
        """The number of records (0 for a missing session)."""
        ...

    def op_copy_records(self, source_id: str, target_id: str, count: int) -> int:
        """Append the first `count` records of `source_id` (in append order) after the
        existing records of `target_id`, keeping each record's stored form and its
        `(turn_id, turn_seq)`; return the number of records of the target afterwards.
        Rows are copied inside the database (no decode / re-encode); the target's
        `updated_at` and `turn_count` are left as they are. The caller checked that
        `count` is at most the source's records and that the two ids differ. Raise
        `SessionNotFoundError` when either session is missing.

        A backend may share the rows instead of copying them when the target has none
        (SQLite and PostgreSQL do: a shared prefix, `checkpoints/_shared_l3`); every read of
        the target must then see them, and no later write to the source may change them."""
        ...


class AsyncStorageBackend(StorageBackend, Protocol):
    """A backend with native async primitives: `BackendStorage`'s async methods await them.

    For every primitive `op_NAME` of `StorageBackend` (and of `OptionalPrimitives` it
    implements), an `aop_NAME` with the same arguments, result and contract, plus
    `async_transaction_hooks`. A backend is used as a native async
    one when it has `async_transaction_hooks`; without them its sync primitives run in a
    worker thread, never on the event loop. A backend doing no I/O (the in-memory one) may
    run its async primitives inline.
    """

    @property
    def async_transaction_hooks(self) -> AsyncTransactionHooks:
        """The async twins of `transaction_hooks`."""
        ...

    async def aop_put_session(self, row: MetaRow) -> None:
        """Async twin of `op_put_session`."""
        ...

    async def aop_list_sessions(
        self, status: SessionStatus | None, role: SessionRole | None
    ) -> list[SessionMeta]:
        """Async twin of `op_list_sessions`."""
        ...

    async def aop_set_fields(self, session_id: str, values: dict[str, Any]) -> None:
        """Async twin of `op_set_fields`."""
        ...

    async def aop_read_session(
        self, session_id: str, names: Sequence[str], records: bool
    ) -> SessionRead | None:
        """Async twin of `op_read_session`."""
        ...

    async def aop_l2s_after(self, after: int, limit: int) -> list[L2Row]:
        """Async twin of `op_l2s_after`."""
        ...

    async def aop_export_rows(self, part: ExportPart, sink: RowSink) -> int:
        """Async twin of `op_export_rows` (`sink` is called on the loop's side)."""
        ...

    async def aop_delete_sessions(self, session_ids: list[str]) -> None:
        """Async twin of `op_delete_sessions`."""
        ...

    async def aop_append(
        self,
        session_id: str,
        records: list[EncodedMessage],
        at: str,
        user_turn: bool,
        turns: list[RecordTurn],
    ) -> int:
        """Async twin of `op_append`."""
        ...

    async def aop_turns(self, session_id: str) -> list[RecordTurn]:
        """Async twin of `op_turns`."""
        ...

    async def aop_records(self, session_id: str) -> Sequence[BaseMessage]:
        """Async twin of `op_records`."""
        ...

    async def aop_drop_oldest(self, session_id: str, count: int) -> None:
        """Async twin of `op_drop_oldest`."""
        ...

    async def aop_put_node(self, node: TopologyNode) -> None:
        """Async twin of `op_put_node`."""
        ...

    async def aop_nodes(self, node_id: str | None, parent_id: str | None) -> list[TopologyNode]:
        """Async twin of `op_nodes`."""
        ...

    async def aop_get_global(self, key: str) -> str | None:
        """Async twin of `op_get_global`."""
        ...

    async def aop_put_global(self, key: str, value: str) -> None:
        """Async twin of `op_put_global`."""
        ...

    async def aop_append_event(
        self, kind: str, session_id: str | None, payload: str, at: str
    ) -> int:
        """Async twin of `op_append_event`."""
        ...

    async def aop_events_after(self, cursor: int, limit: int) -> list[EventRow]:
        """Async twin of `op_events_after`."""
        ...

    async def aop_lease(
        self,
        session_id: str,
        owner: str,
        ttl: float,
        replace: str | None,
        refuse: str | None,
        read: Sequence[str] | None,
    ) -> tuple[Lease, SessionRead | None] | None:
        """Async twin of `op_lease`."""
        ...

    async def aop_release_lease(self, lease: Lease) -> bool:
        """Async twin of `op_release_lease`."""
        ...

    async def aop_commit_turn(self, args: CommitArgs, release: bool) -> int:
        """Async twin of `op_commit_turn`."""
        ...


_REEXPORTED = {
    **dict.fromkeys(("FIELDS", "BackendStorage"), "_shell"),
    **dict.fromkeys(("QUEUE", "choose_lease", "release_changes"), "_flows"),
    **dict.fromkeys(("EncodedMessage", "EventRow", "MetaRow", "SessionRead"), "_serde"),
}


def __getattr__(name: str) -> Any:
    """The names this module shows a backend's author, imported from where they live on
    first use (those modules import the protocols above)."""
    if name not in _REEXPORTED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"stello_graph.checkpoints.{_REEXPORTED[name]}"), name)
