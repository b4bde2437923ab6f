"""`MainStorage`: the storage of a tree, whatever database holds it.

It implements every method the core calls, sync and async, once:
it validates arguments (so every backend refuses the same inputs with the same errors) and
runs each operation as a flow of the backend's primitives (`op_*`, see
`stello_graph.checkpoints.backend`; the flows are in `_flows`) under the lock of
`Transactions`, which drives it sync, natively async (`aop_*`) or in a worker thread. A
backend implements only the primitives and the transaction hooks; they are always called with
the lock held, with arguments already validated, and a write is always inside a transaction.
Each method has its async twin beside it; the per-session values, the topology, the
globals, lineage, events and leases are in `_shell_tree`, the whole-tree reads in `_bulk`.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import TYPE_CHECKING, Self

import stello_graph.checkpoints._flows as flows
from stello_graph._copies import detached_all
from stello_graph.checkpoints._bulk import BulkReads
from stello_graph.checkpoints._primitives import one
from stello_graph.checkpoints._serde import meta_to_row
from stello_graph.checkpoints._shell_tree import TreeMethods
from stello_graph.checkpoints._txn import Transactions
from stello_graph.checkpoints._validate import (
    append_args,
    check_identifier,
    check_meta,
    check_non_negative,
    check_tree_id,
    commit_args,
    page_args,
    session_filter_args,
)
from stello_graph.checkpoints.backend import OptionalPrimitives, StorageBackend
from stello_graph.models import (
    ChildL2,
    Lease,
    SessionMeta,
    SessionRole,
    SessionStats,
    SessionStatus,
)

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

    from stello_graph.models import SessionSnapshot

__all__ = ["FIELDS", "BackendStorage", "MainStorage"]

FIELDS = frozenset(
    {
        *("system_prompt", "insight", "memory", "memory_through", "turn_count"),
        *("subtree_synthesis", "compression", "compression_through", "settings"),
        *("lease_owner", "lease_token", "lease_expires", "lease_waiter", "lease_wait_until"),
        *("forked_from", "forked_at_turn"),
    }
)
"""Per-session values read through `op_read_session` and written through `op_set_fields`."""


class MainStorage(BulkReads, TreeMethods):
    """A tree's storage: every method the core and the orchestration call, sync and async,
    built over a `StorageBackend` (also named `BackendStorage`, and `SessionStorage` where
    only one session's data is used; see `stello_graph.storage` for the rules it keeps).

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
        """The session's meta, or `None` when there is no such session."""
        return self._txn.read(flows.get_session(check_identifier(session_id)))

    async def aget_session(self, session_id: str) -> SessionMeta | None:
        """Async twin of `get_session`."""
        return await self._txn.aread(flows.get_session(check_identifier(session_id)))

    def put_session(self, meta: SessionMeta) -> None:
        """Insert or replace the meta (keeping records, memory, ...) and relabel its node."""
        self._txn.write(one(StorageBackend.op_put_session, meta_to_row(check_meta(meta))))

    async def aput_session(self, meta: SessionMeta) -> None:
        """Async twin of `put_session`."""
        await self._txn.awrite(one(StorageBackend.op_put_session, meta_to_row(check_meta(meta))))

    def list_sessions(
        self,
        *,
        status: SessionStatus | None = None,
        role: SessionRole | None = None,
        tags: Sequence[str] = (),
    ) -> list[SessionMeta]:
        """Sessions in creation order, with the status, the role and all the `tags` given."""
        return self._txn.read(flows.list_sessions(*session_filter_args(status, role, tags)))

    async def alist_sessions(
        self,
        *,
        status: SessionStatus | None = None,
        role: SessionRole | None = None,
        tags: Sequence[str] = (),
    ) -> list[SessionMeta]:
        """Async twin of `list_sessions`."""
        return await self._txn.aread(flows.list_sessions(*session_filter_args(status, role, tags)))

    def get_main_session(self) -> SessionMeta | None:
        """The first-created session with role `main`, or `None`."""
        return self._txn.read(flows.main_session())

    async def aget_main_session(self) -> SessionMeta | None:
        """Async twin of `get_main_session`."""
        return await self._txn.aread(flows.main_session())

    def get_all_session_l2s(self) -> list[ChildL2]:
        """The L2 of every active standard session that has one, in creation order."""
        return self._txn.read(flows.l2s())

    async def aget_all_session_l2s(self) -> list[ChildL2]:
        """Async twin of `get_all_session_l2s`."""
        return await self._txn.aread(flows.l2s())

    def list_session_stats(self) -> list[SessionStats]:
        """Every session's meta with its turns, records and memory figures, in creation
        order, read at once (a view of a large tree would otherwise read them one by one)."""
        return self._txn.read(one(OptionalPrimitives.op_session_stats))

    async def alist_session_stats(self) -> list[SessionStats]:
        """Async twin of `list_session_stats`."""
        return await self._txn.aread(one(OptionalPrimitives.op_session_stats))

    # -- L3 records -----------------------------------------------------------------------
    def append_records(
        self,
        session_id: str,
        messages: Sequence[BaseMessage],
        *,
        user_turn: bool = False,
        turn_id: str | None = None,
    ) -> int:
        """Append messages to L3 atomically; return the number of records afterwards.

        `user_turn=True` also counts one user turn, in the same write, so the count can
        never drift from the records. Appending at least one record moves the session's
        `updated_at` to now. The records are the turn `turn_id` (a new id when not given;
        records that carry a turn, as `Session.messages()` returns them, keep it), numbered
        from 0 (`list_record_turns`).
        """
        args = append_args(session_id, messages, user_turn, turn_id)
        return self._txn.write(one(StorageBackend.op_append, *args))

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
        return await self._txn.awrite(one(StorageBackend.op_append, *args))

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

    def has_turn(self, session_id: str, turn_id: str) -> bool:
        """Whether L3 of the session holds a record of the turn `turn_id` (an index lookup)."""
        sid, tid = check_identifier(session_id), check_identifier(turn_id, "turn_id")
        return self._txn.read(flows.has_turn(sid, tid))

    async def ahas_turn(self, session_id: str, turn_id: str) -> bool:
        """Async twin of `has_turn`."""
        sid, tid = check_identifier(session_id), check_identifier(turn_id, "turn_id")
        return await self._txn.aread(flows.has_turn(sid, tid))

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

    def shared_records(self, session_id: str) -> list[BaseMessage]:
        """Every record of the session, in order, *not* copied: the messages are the ones the
        storage keeps (its record cache), shared with every other caller, and must never
        be changed. For the library's hot path, where a turn reads all of L3 at each model
        call; everyone else reads `list_records`, which returns copies.
        """
        return self._txn.read(flows.shared_records(check_identifier(session_id)))

    async def ashared_records(self, session_id: str) -> list[BaseMessage]:
        """Async twin of `shared_records`."""
        return await self._txn.aread(flows.shared_records(check_identifier(session_id)))

    def read_session(self, session_id: str, *, records: bool = True) -> SessionSnapshot | None:
        """The session's meta, its per-session values and (with `records`) its L3 records,
        shared as `shared_records` returns them (never change them), read at once: one
        primitive (`op_read_session`), one statement where the backend can. What a turn reads
        before its model call; `None` when there is no such session."""
        return self._txn.read(flows.read_session(check_identifier(session_id), bool(records)))

    async def aread_session(
        self, session_id: str, *, records: bool = True
    ) -> SessionSnapshot | None:
        """Async twin of `read_session`."""
        flow = flows.read_session(check_identifier(session_id), bool(records))
        return await self._txn.aread(flow)

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
        return self._txn.alone(one(StorageBackend.op_commit_turn, args, bool(release)))

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
        return await self._txn.aalone(one(StorageBackend.op_commit_turn, args, bool(release)))

    def count_records(self, session_id: str) -> int:
        """The number of L3 records of the session (0 when there is no such session)."""
        return self._txn.read(one(OptionalPrimitives.op_count, check_identifier(session_id)))

    async def acount_records(self, session_id: str) -> int:
        """Async twin of `count_records`."""
        return await self._txn.aread(one(OptionalPrimitives.op_count, check_identifier(session_id)))

    def get_turn_count(self, session_id: str) -> int:
        """The number of user turns committed with `append_records(..., user_turn=True)`."""
        return self._txn.read(flows.number(check_identifier(session_id), "turn_count"))

    async def aget_turn_count(self, session_id: str) -> int:
        """Async twin of `get_turn_count`."""
        return await self._txn.aread(flows.number(check_identifier(session_id), "turn_count"))

    def trim_records(self, session_id: str, keep_last: int) -> int:
        """Drop all but the newest `keep_last` records; return how many were dropped.

        The L2 cursor (`get_memory_through`) moves back by the number of dropped records.
        """
        sid, keep = check_identifier(session_id), check_non_negative(keep_last, "keep_last")
        return self._txn.write(flows.trim(sid, keep))

    async def atrim_records(self, session_id: str, keep_last: int) -> int:
        """Async twin of `trim_records`."""
        sid, keep = check_identifier(session_id), check_non_negative(keep_last, "keep_last")
        return await self._txn.awrite(flows.trim(sid, keep))


BackendStorage = MainStorage
"""`MainStorage`, by the name that says what it is built on: `BackendStorage(MyBackend(...))`."""
