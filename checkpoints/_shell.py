"""The part of a `MainStorage` that does not depend on where the data lives.

`BackendStorage` implements every method of the `MainStorage` protocol, sync and async, once:
it validates arguments (so every backend refuses the same inputs with the same errors) and
runs each operation as a flow of the backend's primitives (`op_*`, see
`stello_graph.checkpoints.backend`; the flows are in `_flows`) under the lock of
`Transactions`, which drives it sync, natively async (`aop_*`) or in a worker thread. A
backend implements only the primitives and the transaction hooks; they are always called with
the lock held, with arguments already validated, and a write is always inside a transaction.
The async twins are in `_ashell`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any, Self

import stello_graph.checkpoints._flows as flows
from stello_graph._copies import detached_all
from stello_graph._tree_text import tree_order
from stello_graph.checkpoints._ashell import AsyncMethods
from stello_graph.checkpoints._bulk import BulkReads
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
    check_tree_id,
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

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

    from stello_graph.storage import SessionSnapshot

__all__ = ["FIELDS", "BackendStorage", "tree_order"]

FIELDS = frozenset(
    {
        *("system_prompt", "insight", "memory", "memory_through", "turn_count"),
        *("subtree_synthesis", "compression", "compression_through", "settings"),
        *("lease_owner", "lease_token", "lease_expires", "lease_waiter", "lease_wait_until"),
        *("forked_from", "forked_at_turn"),
    }
)
"""Per-session values read and written through `op_get_fields` / `op_set_fields`."""


class BackendStorage(BulkReads, AsyncMethods):
    """The `MainStorage` built over a `StorageBackend`: every method, sync and async.

    It validates arguments (so every backend refuses the same inputs with the same errors),
    runs the backend's primitives (`op_*`) under one lock with re-entrant transactions (see
    `TransactionHooks`), and composes them: topology checks, paging, compare-and-clear,
    leases. A backend implements only the primitives; it never validates, locks or nests.
    The async methods await the backend's async primitives when it is an
    `AsyncStorageBackend` (it has `async_transaction_hooks`); otherwise they run its sync
    primitives in the storage's worker thread: no backend I/O ever runs on the event loop.

    Args:
        backend: the primitives and transaction hooks (see `StorageBackend`, and
            `AsyncStorageBackend` for native async ones).
        tree_id: the tree this storage is bound to. A backend reads and writes one tree, the
            one it was made for: give both the same id.

    The reference storages are their own backend (`SqliteMainStorage(...)` subclasses this
    class and passes itself); a third-party backend is composed:
    `BackendStorage(MyBackend(...), tree_id="alice")`.

    Example:
        >>> from stello_graph.checkpoints import InMemoryMainStorage
        >>> from stello_graph.models import SessionMeta
        >>> storage = BackendStorage(InMemoryMainStorage())  # any StorageBackend
        >>> storage.put_session(SessionMeta(id="s1", label="Ideas"))
        >>> storage.get_session("s1").label
        'Ideas'
    """

    def __init__(self, backend: StorageBackend, *, tree_id: str = "default") -> None:
        self._tree_id = check_tree_id(tree_id)
        self._backend = backend
        # A backend with async hooks is a native `AsyncStorageBackend`: async methods await
        # its `aop_*`; any other one runs them in a worker thread (see `_txn`).
        ahooks = getattr(backend, "async_transaction_hooks", None)
        abackend = backend if ahooks is not None else None
        self._txn = Transactions(backend, backend.transaction_hooks, abackend, ahooks)

    @property
    def tree_id(self) -> str:
        """The tree this storage is bound to."""
        return self._tree_id

    def close(self) -> None:
        """Wait for a running transaction, then release the backend (its `close()`, if it
        has one). Storages that are their own backend override this."""
        backend: object = self._backend
        release = None if backend is self else getattr(backend, "close", None)
        self._txn.close(release if callable(release) else lambda: None)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._backend!r}, tree_id={self._tree_id!r})"

    # -- transactions ---------------------------------------------------------------------
    def transaction(self, *, savepoints: bool = True) -> AbstractContextManager[None]:
        """A re-entrant context in which every write is atomic.

        The outermost `transaction()` takes the storage's lock until it ends (other threads
        and tasks wait); nested ones are savepoints: an exception leaving a nested block
        undoes that block only. Nested blocks must not run concurrently (in gathered tasks)
        inside one transaction.

        `savepoints=False` makes the block all or nothing, for code that never goes on
        after a failed call: the storage calls and `transaction()` blocks inside it set no
        savepoint each (two statements fewer per call: round trips on PostgreSQL), and a
        failure of any of them undoes the whole block, even when the exception is caught
        inside it: the block then takes no further call, and leaving it raises
        `StorageError` (its cause: the failure). Nested in a plain transaction, the block
        is one savepoint of it; nested in an all-or-nothing one, it is part of that one.
        """
        return self._txn.transaction(savepoints=savepoints)

    def atransaction(self, *, savepoints: bool = True) -> AbstractAsyncContextManager[None]:
        """The async twin of `transaction()`; waiting for the lock never blocks the loop."""
        return self._txn.atransaction(savepoints=savepoints)

    # `_flow.Atomic` asks for all-or-nothing blocks of these two only: an override (say with
    # the protocol's own signature) lacks the mark and gets plain transactions
    transaction.stello_whole_blocks = True  # type: ignore[attr-defined]
    atransaction.stello_whole_blocks = True  # type: ignore[attr-defined]

    # -- meta -----------------------------------------------------------------------------
    def get_session(self, session_id: str) -> SessionMeta | None:
        """The session's meta, or `None`."""
        return self._txn.read(flows.get_session(check_identifier(session_id)))

    def put_session(self, meta: SessionMeta) -> None:
        """Insert or replace the meta (keeping records, memory, ...) and relabel its node."""
        self._txn.write(one(StorageBackend.op_put_session, meta_to_row(check_meta(meta))))

    def list_sessions(
        self,
        *,
        status: SessionStatus | None = None,
        role: SessionRole | None = None,
        tags: Sequence[str] = (),
    ) -> list[SessionMeta]:
        """Sessions in creation order, with the status, the role and all the `tags` given."""
        return self._txn.read(flows.list_sessions(*session_filter_args(status, role, tags)))

    def get_main_session(self) -> SessionMeta | None:
        """The first-created session with role `main`, or `None`."""
        return self._txn.read(flows.main_session())

    def get_all_session_l2s(self) -> list[ChildL2]:
        """The L2 of every active standard session that has one, in creation order."""
        return self._txn.read(flows.l2s())

    def list_session_stats(self) -> list[SessionStats]:
        """Every session's meta with its turns, records and memory figures, in creation
        order, read at once (a view of a large tree would otherwise read them one by one).

        Not part of the `MainStorage` protocol: a view falls back to the per-session reads
        on a storage without it.
        """
        return self._txn.read(one(OptionalPrimitives.op_session_stats))

    # -- L3 records -----------------------------------------------------------------------
    def append_records(
        self,
        session_id: str,
        messages: Sequence[BaseMessage],
        *,
        user_turn: bool = False,
        turn_id: str | None = None,
    ) -> int:
        """Append messages atomically (and with `user_turn` count a turn); return the count.

        The records are the turn `turn_id` (a new id when not given; records that carry a
        turn, as `Session.messages()` returns them, then keep it), numbered from 0; see
        `list_record_turns`.
        """
        args = append_args(session_id, messages, user_turn, turn_id)
        return self._txn.write(flows.append(*args))

    def list_record_turns(
        self,
        session_id: str,
        *,
        limit: int | None = None,
        offset: int = 0,
        role: str | None = None,
    ) -> list[tuple[str, int]]:
        """`(turn_id, turn_seq)` of the records `list_records` returns for the same arguments:
        the turn that wrote each one and its place in that turn (from 0)."""
        args = page_args(session_id, limit, offset, role)
        return self._txn.read(flows.list_turns(*args))

    def has_turn(self, session_id: str, turn_id: str) -> bool:
        """Whether L3 of the session holds a record of the turn `turn_id` (an index lookup)."""
        sid, tid = check_identifier(session_id), check_identifier(turn_id, "turn_id")
        return self._txn.read(flows.has_turn(sid, tid))

    def list_records(
        self,
        session_id: str,
        *,
        limit: int | None = None,
        offset: int = 0,
        role: str | None = None,
    ) -> list[BaseMessage]:
        """Records in append order; `role` filters first, then `offset` / `limit` page.

        The messages are the caller's own copies: changing them changes nothing stored.
        """
        args = page_args(session_id, limit, offset, role)
        return detached_all(self._txn.read(flows.list_records(*args)))

    def shared_records(self, session_id: str) -> list[BaseMessage]:
        """Every record of the session, in order, *not* copied: the messages are the ones the
        storage keeps (its record cache), shared with every other caller, and must never
        be changed. For the library's hot path, where a turn reads all of L3 at each model
        call; everyone else reads `list_records`, which returns copies.
        """
        return self._txn.read(flows.shared_records(check_identifier(session_id)))

    def read_session(self, session_id: str, *, records: bool = True) -> SessionSnapshot | None:
        """The session's meta, its per-session values and (with `records`) its L3 records,
        shared as `shared_records` returns them (never change them), read at once: one
        primitive (`op_read_session`), one statement where the backend can. What a turn reads
        before its model call; `None` when there is no such session."""
        return self._txn.read(flows.read_session(check_identifier(session_id), bool(records)))

    def commit_records(
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
        """A turn's commit in one transaction: check that `lease` (if given) still holds the
        session and that it is not archived, append the records (as `append_records`),
        clear the insight if it is still `insight`, and with `release` free the lease.
        Returns the session's user turns afterwards.

        Raises:
            SessionNotFoundError: no such session.
            LeaseLostError: `lease` no longer holds the session; nothing is stored.
            SessionArchivedError: the session is archived; nothing is stored.
        """
        args = commit_args(session_id, messages, user_turn, turn_id, insight, lease)
        return self._commit_records(args, bool(release))

    def _commit_records(self, args: CommitArgs, release: bool) -> int:
        """The commit of validated `args`, as one flow (a backend may send it its own way)."""
        return self._txn.write(flows.commit_records(*args, release))

    def count_records(self, session_id: str) -> int:
        """The number of L3 records (0 for a missing session)."""
        return self._txn.read(flows.count(check_identifier(session_id)))

    def get_turn_count(self, session_id: str) -> int:
        """User turns committed with `append_records(..., user_turn=True)`."""
        return self._txn.read(flows.number(check_identifier(session_id), "turn_count"))

    def trim_records(self, session_id: str, keep_last: int) -> int:
        """Drop all but the newest `keep_last` records; move the L2 cursor back as much."""
        sid, keep = check_identifier(session_id), check_non_negative(keep_last, "keep_last")
        return self._txn.write(flows.trim(sid, keep))

    # -- system prompt, insight, memory ---------------------------------------------------
    def get_system_prompt(self, session_id: str) -> str | None:
        """The system prompt, or `None`."""
        return self._txn.read(flows.text(check_identifier(session_id), "system_prompt"))

    def put_system_prompt(self, session_id: str, prompt: str | None) -> None:
        """Set the system prompt; `None` removes it."""
        values = {"system_prompt": check_optional_text(prompt, "prompt")}
        self._txn.write(one(StorageBackend.op_set_fields, check_identifier(session_id), values))

    def get_insight(self, session_id: str) -> str | None:
        """The pending insight, read without consuming it."""
        return self._txn.read(flows.text(check_identifier(session_id), "insight"))

    def put_insight(self, session_id: str, insight: str) -> None:
        """Replace the pending insight."""
        values = {"insight": check_text(insight, "insight")}
        self._txn.write(one(StorageBackend.op_set_fields, check_identifier(session_id), values))

    def clear_insight(self, session_id: str, *, expected: str | None = None) -> bool:
        """Remove the insight (only if it is still `expected`, when given); `True` if removed."""
        args = check_identifier(session_id), check_optional_text(expected, "expected")
        return self._txn.write(flows.clear_insight(*args))

    def get_memory(self, session_id: str) -> str | None:
        """The L2 (the synthesis, for the main session), or `None`."""
        return self._txn.read(flows.text(check_identifier(session_id), "memory"))

    def put_memory(self, session_id: str, memory: str, *, through: int | None = None) -> None:
        """Replace the memory; `through` (records covered) is kept when `None`.

        Raises:
            InvalidInputError: `through` is more than the session's records (counted in the
                write's own transaction).
        """
        sid, values = memory_args(session_id, memory, through)
        self._txn.write(flows.put_memory(sid, values))

    def get_memory_through(self, session_id: str) -> int:
        """How many records, from the first, the memory covers (0 if none)."""
        return self._txn.read(flows.number(check_identifier(session_id), "memory_through"))

    def get_subtree_synthesis(self, session_id: str) -> str | None:
        """What tree integration last made of the node's children, or `None`."""
        return self._txn.read(flows.text(check_identifier(session_id), "subtree_synthesis"))

    def put_subtree_synthesis(self, session_id: str, synthesis: str) -> None:
        """Replace the subtree synthesis of a node."""
        values = {"subtree_synthesis": check_text(synthesis, "synthesis")}
        self._txn.write(one(StorageBackend.op_set_fields, check_identifier(session_id), values))

    def get_compression(self, session_id: str) -> Compression | None:
        """The summary that replaces the oldest records in prompts, if there is one."""
        return self._txn.read(flows.compression(check_identifier(session_id)))

    def put_compression(self, session_id: str, compression: Compression | None) -> None:
        """Replace (or, with `None`, drop) the compression summary."""
        sid, values = compression_args(session_id, compression)
        self._txn.write(one(StorageBackend.op_set_fields, sid, values))

    def get_settings(self, session_id: str) -> dict[str, Any]:
        """The session's orchestration settings (JSON object; empty when none)."""
        return self._txn.read(flows.settings(check_identifier(session_id)))

    def put_settings(self, session_id: str, settings: dict[str, Any]) -> None:
        """Replace the session's orchestration settings."""
        values = {"settings": dumps(check_mapping(settings, "settings"), what="settings")}
        self._txn.write(one(StorageBackend.op_set_fields, check_identifier(session_id), values))

    # -- topology -------------------------------------------------------------------------
    def put_node(self, node: TopologyNode) -> None:
        """Insert, move or relabel a node; a moved node keeps its place in creation order."""
        self._txn.write(flows.put_node(check_node(node)))

    def get_node(self, node_id: str) -> TopologyNode | None:
        """The node, or `None`."""
        return self._txn.read(flows.get_node(check_identifier(node_id, "node_id")))

    def get_children(self, parent_id: str) -> list[TopologyNode]:
        """Direct children, in creation order."""
        return self._txn.read(
            one(OptionalPrimitives.op_children, check_identifier(parent_id, "parent_id"))
        )

    def get_ancestors(self, node_id: str) -> list[TopologyNode]:
        """Parent, grandparent, ... up to the root (nearest first)."""
        return self._txn.read(flows.ancestors(check_identifier(node_id, "node_id")))

    def get_tree(self) -> list[TopologyNode]:
        """Every node in depth-first pre-order: a parent, then each child's subtree in turn,
        siblings in creation order (the order in which a tree view lists them)."""
        return self._txn.read(flows.tree())

    def remove_node(self, node_id: str, *, cascade: bool = False) -> list[str]:
        """Remove a node (and with `cascade` its subtree) together with its sessions' data.

        Returns the removed ids, the node first, then its descendants breadth-first.

        Raises:
            NodeNotFoundError: there is no such node.
            NodeHasChildrenError: the node has children and `cascade` is false.
        """
        nid = check_identifier(node_id, "node_id")
        return self._txn.write(flows.remove_node(nid, bool(cascade)))

    # -- global key-value -----------------------------------------------------------------
    def get_global(self, key: str) -> Any:
        """The JSON value stored under `key`, or `None`."""
        return self._txn.read(flows.get_global(check_identifier(key, "key")))

    def put_global(self, key: str, value: Any) -> None:
        """Store a JSON-serialisable value under `key` (replacing any previous one)."""
        text = dumps(value, what="A global value")
        self._txn.write(one(StorageBackend.op_put_global, check_identifier(key, "key"), text))

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

    def get_lineage(self, session_id: str) -> ForkPoint | None:
        """Where the session was forked from (`forked_from`, `forked_at_turn`); `None` for
        a session that was not forked (or does not exist)."""
        return self._txn.read(flows.lineage(check_identifier(session_id)))

    def put_lineage(self, session_id: str, source_id: str, at_turn: int | None) -> None:
        """Record that the session was forked from `source_id` at its user turn `at_turn`."""
        self._txn.write(
            one(StorageBackend.op_set_fields, *lineage_args(session_id, source_id, at_turn))
        )

    def list_lineage(self) -> dict[str, ForkPoint]:
        """The fork point of every forked session of the tree, by session id (one read)."""
        return self._txn.read(flows.list_lineage())

    def list_session_digests(self) -> list[SessionDigest]:
        """Every session's `SessionDigest` (label, status, parent, turns, L2, staleness,
        pending insight, last activity), in creation order, in one read."""
        return self._txn.read(flows.digests())

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
        return self._txn.write(flows.append_event(*event_args(kind, session_id, data, at)))

    def events_after(self, cursor: int = 0, *, limit: int = 100) -> list[StoredEvent]:
        """The events of the log with a cursor above `cursor`, oldest first, at most `limit`
        (up to 10,000): follow the log by passing the last cursor seen."""
        return self._txn.read(flows.events_after(*events_page_args(cursor, limit)))

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
        return self._txn.write(flows.acquire_lease(*args))

    def lease_session(
        self,
        session_id: str,
        owner: str,
        ttl: float,
        *,
        replace: str | None = None,
        operation: str = "a turn",
    ) -> tuple[Lease, SessionSnapshot] | None:
        """`acquire_lease` of an active session and, when taken, its `read_session`, in one
        transaction: what a turn does before it runs (one transaction instead of three).
        `None` while another holds the lease (the asker waits in line, as `acquire_lease`).

        Not part of the `MainStorage` protocol: `SessionLeases` falls back to a read, the
        lease and another read on a storage without it.

        Raises:
            SessionNotFoundError / SessionArchivedError: no such session, or it is archived
                (refusing `operation`); nothing is written.
        """
        return self._lease_session(lease_args(session_id, owner, ttl, replace), str(operation))

    def _lease_session(
        self, args: tuple[str, str, float, str | None], operation: str
    ) -> tuple[Lease, SessionSnapshot] | None:
        """`lease_session` on validated arguments (a backend may send it its own way)."""
        return self._txn.write(flows.lease_session(*args, operation))

    def renew_lease(self, lease: Lease, ttl: float) -> Lease | None:
        """Extend a lease still held with its token; `None` if it was lost."""
        args = lease_args(lease.session_id, lease.owner, ttl, None)
        return self._txn.write(flows.renew_lease(lease, args[2]))

    def release_lease(self, lease: Lease) -> bool:
        """Free the session if `lease` still holds it; `True` if it did."""
        return self._txn.write(flows.release_lease(checked_lease(lease)))

    def get_lease(self, session_id: str) -> Lease | None:
        """The session's current lease (expired or not), or `None` when it is free."""
        return self._txn.read(flows.get_lease(check_identifier(session_id)))

    def check_lease(self, lease: Lease) -> None:
        """Refuse a holder that lost its lease: call it inside the transaction that commits.

        Raises:
            LeaseLostError: another owner took the session over (or it was released).
        """
        self._txn.read(flows.check_lease(checked_lease(lease)))
