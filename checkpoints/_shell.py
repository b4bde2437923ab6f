"""The part of a `MainStorage` that does not depend on where the data lives.

`BackendStorage` implements every method of the `MainStorage` protocol, sync and async, once:
it validates arguments (so every backend refuses the same inputs with the same errors), runs
the backend's primitive operations (`op_*`, see `stello_graph.checkpoints.backend`) under
the lock of `Transactions`, and composes them (topology checks, paging, compare-and-clear,
...). A backend implements only the `op_*` methods and the `TransactionHooks`; they are
always called with the lock held, with arguments already validated, and a write is always
inside a transaction.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import TYPE_CHECKING, Any, Self

from langchain_core.messages import BaseMessage

from stello_graph._copies import detached_all
from stello_graph.checkpoints._serde import (
    RecordTurn,
    dumps,
    message_role,
    meta_to_row,
)
from stello_graph.checkpoints._txn import Transactions
from stello_graph.checkpoints._validate import (
    append_args,
    check_identifier,
    check_mapping,
    check_meta,
    check_node,
    check_non_negative,
    check_optional_text,
    check_text,
    compression_args,
    memory_args,
    page_args,
    session_filter_args,
)
from stello_graph.digest import SessionDigest, digest_from_row
from stello_graph.errors import (
    InvalidInputError,
    LeaseLostError,
    NodeHasChildrenError,
    NodeNotFoundError,
    SessionNotFoundError,
    TopologyCycleError,
)
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
    from stello_graph.checkpoints.backend import StorageBackend

__all__ = ["FIELDS", "BackendStorage", "tree_order"]

_WAITER_TTL = 0.5
"""Seconds a turn waiting for a lease keeps its place as the next holder without asking
again (a waiter asks every few milliseconds)."""

FIELDS = frozenset(
    {
        *("system_prompt", "insight", "memory", "memory_through", "turn_count"),
        *("subtree_synthesis", "compression", "compression_through", "settings"),
        *("lease_owner", "lease_token", "lease_expires", "lease_waiter", "lease_wait_until"),
        *("forked_from", "forked_at_turn"),
    }
)
"""Per-session values read and written through `op_get_fields` / `op_set_fields`."""


class BackendStorage:
    """The `MainStorage` built over a `StorageBackend`: every method, sync and async.

    It validates arguments (so every backend refuses the same inputs with the same errors),
    runs the backend's primitives (`op_*`) under one lock with re-entrant transactions (see
    `TransactionHooks`), and composes them: topology checks, paging, compare-and-clear,
    leases. A backend implements only the primitives; it never validates, locks or nests.

    Args:
        backend: the primitives and transaction hooks (see `StorageBackend`).
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
        self._tree_id = check_identifier(tree_id, "tree_id")
        self._backend = backend
        self._txn = Transactions(backend.transaction_hooks)

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
    def transaction(self) -> AbstractContextManager[None]:
        """A re-entrant context in which every write is atomic.

        The outermost `transaction()` takes the storage's lock until it ends (other threads
        and tasks wait); nested ones are savepoints: an exception leaving a nested block
        undoes that block only. Nested blocks must not run concurrently (in gathered tasks)
        inside one transaction.
        """
        return self._txn.transaction()

    def atransaction(self) -> AbstractAsyncContextManager[None]:
        """The async twin of `transaction()`; waiting for the lock never blocks the loop."""
        return self._txn.atransaction()

    # -- meta -----------------------------------------------------------------------------
    def get_session(self, session_id: str) -> SessionMeta | None:
        """The session's meta, or `None`."""
        return self._txn.read(self._backend.op_get_session, check_identifier(session_id))

    def put_session(self, meta: SessionMeta) -> None:
        """Insert or replace the meta (keeping records, memory, ...) and relabel its node."""
        self._txn.write(self._backend.op_put_session, meta_to_row(check_meta(meta)))

    def list_sessions(
        self,
        *,
        status: SessionStatus | None = None,
        role: SessionRole | None = None,
        tags: Sequence[str] = (),
    ) -> list[SessionMeta]:
        """Sessions in creation order, with the status, the role and all the `tags` given."""
        return self._txn.read(self._list_sessions, *session_filter_args(status, role, tags))

    def get_main_session(self) -> SessionMeta | None:
        """The first-created session with role `main`, or `None`."""
        return self._txn.read(self._main_session)

    def get_all_session_l2s(self) -> list[ChildL2]:
        """The L2 of every active standard session that has one, in creation order."""
        return self._txn.read(self._backend.op_l2s)

    def list_session_stats(self) -> list[SessionStats]:
        """Every session's meta with its turns, records and memory figures, in creation
        order, read at once (a view of a large tree would otherwise read them one by one).

        Not part of the `MainStorage` protocol: a view falls back to the per-session reads
        on a storage without it.
        """
        return self._txn.read(self._backend.op_session_stats)

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
        return self._txn.write(self._backend.op_append, *args)

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
        return self._txn.read(self._list_turns, *args)

    def has_turn(self, session_id: str, turn_id: str) -> bool:
        """Whether L3 of the session holds a record of the turn `turn_id` (an index lookup)."""
        sid, tid = check_identifier(session_id), check_identifier(turn_id, "turn_id")
        return self._txn.read(self._backend.op_has_turn, sid, tid)

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
        return detached_all(self._txn.read(self._list_records, *args))

    def shared_records(self, session_id: str) -> list[BaseMessage]:
        """Every record of the session, in order, *not* copied: the messages are the ones the
        storage keeps (its record cache), shared with every other caller, and must never
        be changed. For the library's hot path, where a turn reads all of L3 at each model
        call; everyone else reads `list_records`, which returns copies.
        """
        return self._txn.read(self._shared_records, check_identifier(session_id))

    def count_records(self, session_id: str) -> int:
        """The number of L3 records (0 for a missing session)."""
        return self._txn.read(self._backend.op_count, check_identifier(session_id))

    def get_turn_count(self, session_id: str) -> int:
        """User turns committed with `append_records(..., user_turn=True)`."""
        return self._txn.read(self._number, check_identifier(session_id), "turn_count")

    def trim_records(self, session_id: str, keep_last: int) -> int:
        """Drop all but the newest `keep_last` records; move the L2 cursor back as much."""
        sid, keep = check_identifier(session_id), check_non_negative(keep_last, "keep_last")
        return self._txn.write(self._trim, sid, keep)

    # -- system prompt, insight, memory ---------------------------------------------------
    def get_system_prompt(self, session_id: str) -> str | None:
        """The system prompt, or `None`."""
        return self._txn.read(self._text, check_identifier(session_id), "system_prompt")

    def put_system_prompt(self, session_id: str, prompt: str | None) -> None:
        """Set the system prompt; `None` removes it."""
        values = {"system_prompt": check_optional_text(prompt, "prompt")}
        self._txn.write(self._backend.op_set_fields, check_identifier(session_id), values)

    def get_insight(self, session_id: str) -> str | None:
        """The pending insight, read without consuming it."""
        return self._txn.read(self._text, check_identifier(session_id), "insight")

    def put_insight(self, session_id: str, insight: str) -> None:
        """Replace the pending insight."""
        values = {"insight": check_text(insight, "insight")}
        self._txn.write(self._backend.op_set_fields, check_identifier(session_id), values)

    def clear_insight(self, session_id: str, *, expected: str | None = None) -> bool:
        """Remove the insight (only if it is still `expected`, when given); `True` if removed."""
        args = check_identifier(session_id), check_optional_text(expected, "expected")
        return self._txn.write(self._clear_insight, *args)

    def get_memory(self, session_id: str) -> str | None:
        """The L2 (the synthesis, for the main session), or `None`."""
        return self._txn.read(self._text, check_identifier(session_id), "memory")

    def put_memory(self, session_id: str, memory: str, *, through: int | None = None) -> None:
        """Replace the memory; `through` (records covered) is kept when `None`.

        Raises:
            InvalidInputError: `through` is more than the session's records (counted in the
                write's own transaction).
        """
        sid, values = memory_args(session_id, memory, through)
        self._txn.write(self._put_memory, sid, values)

    def get_memory_through(self, session_id: str) -> int:
        """How many records, from the first, the memory covers (0 if none)."""
        return self._txn.read(self._number, check_identifier(session_id), "memory_through")

    def get_subtree_synthesis(self, session_id: str) -> str | None:
        """What tree integration last made of the node's children, or `None`."""
        return self._txn.read(self._text, check_identifier(session_id), "subtree_synthesis")

    def put_subtree_synthesis(self, session_id: str, synthesis: str) -> None:
        """Replace the subtree synthesis of a node."""
        values = {"subtree_synthesis": check_text(synthesis, "synthesis")}
        self._txn.write(self._backend.op_set_fields, check_identifier(session_id), values)

    def get_compression(self, session_id: str) -> Compression | None:
        """The summary that replaces the oldest records in prompts, if there is one."""
        return self._txn.read(self._compression, check_identifier(session_id))

    def put_compression(self, session_id: str, compression: Compression | None) -> None:
        """Replace (or, with `None`, drop) the compression summary."""
        sid, values = compression_args(session_id, compression)
        self._txn.write(self._backend.op_set_fields, sid, values)

    def get_settings(self, session_id: str) -> dict[str, Any]:
        """The session's orchestration settings (JSON object; empty when none)."""
        return self._txn.read(self._settings, check_identifier(session_id))

    def put_settings(self, session_id: str, settings: dict[str, Any]) -> None:
        """Replace the session's orchestration settings."""
        values = {"settings": dumps(check_mapping(settings, "settings"), what="settings")}
        self._txn.write(self._backend.op_set_fields, check_identifier(session_id), values)

    # -- topology -------------------------------------------------------------------------
    def put_node(self, node: TopologyNode) -> None:
        """Insert, move or relabel a node; a moved node keeps its place in creation order."""
        self._txn.write(self._put_node, check_node(node))

    def get_node(self, node_id: str) -> TopologyNode | None:
        """The node, or `None`."""
        return self._txn.read(self._backend.op_get_node, check_identifier(node_id, "node_id"))

    def get_children(self, parent_id: str) -> list[TopologyNode]:
        """Direct children, in creation order."""
        return self._txn.read(self._backend.op_children, check_identifier(parent_id, "parent_id"))

    def get_ancestors(self, node_id: str) -> list[TopologyNode]:
        """Parent, grandparent, ... up to the root (nearest first)."""
        return self._txn.read(self._ancestors, check_identifier(node_id, "node_id"))

    def get_tree(self) -> list[TopologyNode]:
        """Every node in depth-first pre-order: a parent, then each child's subtree in turn,
        siblings in creation order (the order in which a tree view lists them)."""
        return tree_order(self._txn.read(self._backend.op_all_nodes))

    def remove_node(self, node_id: str, *, cascade: bool = False) -> list[str]:
        """Remove a node (and with `cascade` its subtree) together with its sessions' data.

        Returns the removed ids, the node first, then its descendants breadth-first.

        Raises:
            NodeNotFoundError: there is no such node.
            NodeHasChildrenError: the node has children and `cascade` is false.
        """
        nid = check_identifier(node_id, "node_id")
        return self._txn.write(self._remove_node, nid, bool(cascade))

    # -- global key-value -----------------------------------------------------------------
    def get_global(self, key: str) -> Any:
        """The JSON value stored under `key`, or `None`."""
        return _loads(self._txn.read(self._backend.op_get_global, check_identifier(key, "key")))

    def put_global(self, key: str, value: Any) -> None:
        """Store a JSON-serialisable value under `key` (replacing any previous one)."""
        text = dumps(value, what="A global value")
        self._txn.write(self._backend.op_put_global, check_identifier(key, "key"), text)

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
        args = _lease_args(session_id, owner, ttl, replace)
        return self._txn.write(self._acquire_lease, *args)

    def renew_lease(self, lease: Lease, ttl: float) -> Lease | None:
        """Extend a lease still held with its token; `None` if it was lost."""
        args = _lease_args(lease.session_id, lease.owner, ttl, None)
        return self._txn.write(self._renew_lease, lease, args[2])

    def release_lease(self, lease: Lease) -> bool:
        """Free the session if `lease` still holds it; `True` if it did."""
        return self._txn.write(self._release_lease, _checked_lease(lease))

    def get_lease(self, session_id: str) -> Lease | None:
        """The session's current lease (expired or not), or `None` when it is free."""
        return self._txn.read(self._get_lease, check_identifier(session_id))

    def check_lease(self, lease: Lease) -> None:
        """Refuse a holder that lost its lease: call it inside the transaction that commits.

        Raises:
            LeaseLostError: another owner took the session over (or it was released).
        """
        self._txn.read(self._check_lease, _checked_lease(lease))

    # -- async twins ----------------------------------------------------------------------
    async def aget_session(self, session_id: str) -> SessionMeta | None:
        return await self._txn.aread(self._backend.op_get_session, check_identifier(session_id))

    async def aput_session(self, meta: SessionMeta) -> None:
        await self._txn.awrite(self._backend.op_put_session, meta_to_row(check_meta(meta)))

    async def alist_sessions(
        self,
        *,
        status: SessionStatus | None = None,
        role: SessionRole | None = None,
        tags: Sequence[str] = (),
    ) -> list[SessionMeta]:
        args = session_filter_args(status, role, tags)
        return await self._txn.aread(self._list_sessions, *args)

    async def aget_main_session(self) -> SessionMeta | None:
        return await self._txn.aread(self._main_session)

    async def aget_all_session_l2s(self) -> list[ChildL2]:
        return await self._txn.aread(self._backend.op_l2s)

    async def alist_session_stats(self) -> list[SessionStats]:
        return await self._txn.aread(self._backend.op_session_stats)

    async def aappend_records(
        self,
        session_id: str,
        messages: Sequence[BaseMessage],
        *,
        user_turn: bool = False,
        turn_id: str | None = None,
    ) -> int:
        args = append_args(session_id, messages, user_turn, turn_id)
        return await self._txn.awrite(self._backend.op_append, *args)

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
        return await self._txn.aread(self._list_turns, *args)

    async def ahas_turn(self, session_id: str, turn_id: str) -> bool:
        """Async twin of `has_turn`."""
        sid, tid = check_identifier(session_id), check_identifier(turn_id, "turn_id")
        return await self._txn.aread(self._backend.op_has_turn, sid, tid)

    async def alist_records(
        self,
        session_id: str,
        *,
        limit: int | None = None,
        offset: int = 0,
        role: str | None = None,
    ) -> list[BaseMessage]:
        args = page_args(session_id, limit, offset, role)
        return detached_all(await self._txn.aread(self._list_records, *args))

    async def ashared_records(self, session_id: str) -> list[BaseMessage]:
        """Async twin of `shared_records`."""
        return await self._txn.aread(self._shared_records, check_identifier(session_id))

    async def acount_records(self, session_id: str) -> int:
        return await self._txn.aread(self._backend.op_count, check_identifier(session_id))

    async def aget_turn_count(self, session_id: str) -> int:
        sid = check_identifier(session_id)
        return await self._txn.aread(self._number, sid, "turn_count")

    async def atrim_records(self, session_id: str, keep_last: int) -> int:
        sid, keep = check_identifier(session_id), check_non_negative(keep_last, "keep_last")
        return await self._txn.awrite(self._trim, sid, keep)

    async def aget_system_prompt(self, session_id: str) -> str | None:
        return await self._txn.aread(self._text, check_identifier(session_id), "system_prompt")

    async def aput_system_prompt(self, session_id: str, prompt: str | None) -> None:
        values = {"system_prompt": check_optional_text(prompt, "prompt")}
        await self._txn.awrite(self._backend.op_set_fields, check_identifier(session_id), values)

    async def aget_insight(self, session_id: str) -> str | None:
        return await self._txn.aread(self._text, check_identifier(session_id), "insight")

    async def aput_insight(self, session_id: str, insight: str) -> None:
        values = {"insight": check_text(insight, "insight")}
        await self._txn.awrite(self._backend.op_set_fields, check_identifier(session_id), values)

    async def aclear_insight(self, session_id: str, *, expected: str | None = None) -> bool:
        args = check_identifier(session_id), check_optional_text(expected, "expected")
        return await self._txn.awrite(self._clear_insight, *args)

    async def aget_memory(self, session_id: str) -> str | None:
        return await self._txn.aread(self._text, check_identifier(session_id), "memory")

    async def aput_memory(
        self, session_id: str, memory: str, *, through: int | None = None
    ) -> None:
        sid, values = memory_args(session_id, memory, through)
        await self._txn.awrite(self._put_memory, sid, values)

    async def aget_memory_through(self, session_id: str) -> int:
        sid = check_identifier(session_id)
        return await self._txn.aread(self._number, sid, "memory_through")

    async def aget_subtree_synthesis(self, session_id: str) -> str | None:
        sid = check_identifier(session_id)
        return await self._txn.aread(self._text, sid, "subtree_synthesis")

    async def aput_subtree_synthesis(self, session_id: str, synthesis: str) -> None:
        values = {"subtree_synthesis": check_text(synthesis, "synthesis")}
        await self._txn.awrite(self._backend.op_set_fields, check_identifier(session_id), values)

    async def aget_compression(self, session_id: str) -> Compression | None:
        return await self._txn.aread(self._compression, check_identifier(session_id))

    async def aput_compression(self, session_id: str, compression: Compression | None) -> None:
        sid, values = compression_args(session_id, compression)
        await self._txn.awrite(self._backend.op_set_fields, sid, values)

    async def aget_settings(self, session_id: str) -> dict[str, Any]:
        return await self._txn.aread(self._settings, check_identifier(session_id))

    async def aput_settings(self, session_id: str, settings: dict[str, Any]) -> None:
        values = {"settings": dumps(check_mapping(settings, "settings"), what="settings")}
        await self._txn.awrite(self._backend.op_set_fields, check_identifier(session_id), values)

    async def aput_node(self, node: TopologyNode) -> None:
        await self._txn.awrite(self._put_node, check_node(node))

    async def aget_node(self, node_id: str) -> TopologyNode | None:
        return await self._txn.aread(
            self._backend.op_get_node, check_identifier(node_id, "node_id")
        )

    async def aget_children(self, parent_id: str) -> list[TopologyNode]:
        pid = check_identifier(parent_id, "parent_id")
        return await self._txn.aread(self._backend.op_children, pid)

    async def aget_ancestors(self, node_id: str) -> list[TopologyNode]:
        return await self._txn.aread(self._ancestors, check_identifier(node_id, "node_id"))

    async def aget_tree(self) -> list[TopologyNode]:
        return tree_order(await self._txn.aread(self._backend.op_all_nodes))

    async def aremove_node(self, node_id: str, *, cascade: bool = False) -> list[str]:
        nid = check_identifier(node_id, "node_id")
        return await self._txn.awrite(self._remove_node, nid, bool(cascade))

    async def aget_global(self, key: str) -> Any:
        return _loads(
            await self._txn.aread(self._backend.op_get_global, check_identifier(key, "key"))
        )

    async def aput_global(self, key: str, value: Any) -> None:
        text = dumps(value, what="A global value")
        await self._txn.awrite(self._backend.op_put_global, check_identifier(key, "key"), text)

    async def aacquire_lease(
        self, session_id: str, owner: str, ttl: float, *, replace: str | None = None
    ) -> Lease | None:
        args = _lease_args(session_id, owner, ttl, replace)
        return await self._txn.awrite(self._acquire_lease, *args)

    async def arenew_lease(self, lease: Lease, ttl: float) -> Lease | None:
        args = _lease_args(lease.session_id, lease.owner, ttl, None)
        return await self._txn.awrite(self._renew_lease, lease, args[2])

    async def arelease_lease(self, lease: Lease) -> bool:
        return await self._txn.awrite(self._release_lease, _checked_lease(lease))

    async def aget_lease(self, session_id: str) -> Lease | None:
        return await self._txn.aread(self._get_lease, check_identifier(session_id))

    async def acheck_lease(self, lease: Lease) -> None:
        await self._txn.aread(self._check_lease, _checked_lease(lease))

    # -- branching: copied records, lineage, digests ---------------------------------------
    def copy_records(self, source_id: str, target_id: str, *, count: int) -> int:
        """Append the first `count` records of `source_id` after those of `target_id`, as
        stored (no decoding, each keeps its `(turn_id, turn_seq)`); return the target's
        number of records afterwards. A fork uses it when nothing has to be rewritten.

        Raises:
            SessionNotFoundError: either session is missing.
            InvalidInputError: a bad id or count, or `count` is more than the source's
                records (counted in the write's own transaction).
        """
        args = _copy_args(source_id, target_id, count)
        return self._txn.write(self._copy_records, *args)

    async def acopy_records(self, source_id: str, target_id: str, *, count: int) -> int:
        """Async twin of `copy_records`."""
        args = _copy_args(source_id, target_id, count)
        return await self._txn.awrite(self._copy_records, *args)

    def get_lineage(self, session_id: str) -> ForkPoint | None:
        """Where the session was forked from (`forked_from`, `forked_at_turn`); `None` for
        a session that was not forked (or does not exist)."""
        return self._txn.read(self._lineage, check_identifier(session_id))

    async def aget_lineage(self, session_id: str) -> ForkPoint | None:
        """Async twin of `get_lineage`."""
        return await self._txn.aread(self._lineage, check_identifier(session_id))

    def put_lineage(self, session_id: str, source_id: str, at_turn: int | None) -> None:
        """Record that the session was forked from `source_id` at its user turn `at_turn`."""
        self._txn.write(self._backend.op_set_fields, *_lineage_args(session_id, source_id, at_turn))

    async def aput_lineage(self, session_id: str, source_id: str, at_turn: int | None) -> None:
        """Async twin of `put_lineage`."""
        args = _lineage_args(session_id, source_id, at_turn)
        await self._txn.awrite(self._backend.op_set_fields, *args)

    def list_lineage(self) -> dict[str, ForkPoint]:
        """The fork point of every forked session of the tree, by session id (one read)."""
        return _fork_points(self._txn.read(self._backend.op_all_fields, _LINEAGE))

    async def alist_lineage(self) -> dict[str, ForkPoint]:
        """Async twin of `list_lineage`."""
        return _fork_points(await self._txn.aread(self._backend.op_all_fields, _LINEAGE))

    def list_session_digests(self) -> list[SessionDigest]:
        """Every session's `SessionDigest` (label, status, parent, turns, L2, staleness,
        pending insight, last activity), in creation order, in one read."""
        return [digest_from_row(row) for row in self._txn.read(self._backend.op_digests)]

    async def alist_session_digests(self) -> list[SessionDigest]:
        """Async twin of `list_session_digests`."""
        rows = await self._txn.aread(self._backend.op_digests)
        return [digest_from_row(row) for row in rows]

    def _copy_records(self, source_id: str, target_id: str, count: int) -> int:
        for session_id in (source_id, target_id):
            if not self._backend.op_session_exists(session_id):
                raise SessionNotFoundError(session_id)
        if count > (available := self._backend.op_count(source_id)):
            raise InvalidInputError(
                f"count={count} is beyond the {available} record(s) of session "
                f"{source_id!r}; pass at most {available}."
            )
        return self._backend.op_copy_records(source_id, target_id, count)

    def _lineage(self, session_id: str) -> ForkPoint | None:
        values = self._backend.op_get_fields(session_id, _LINEAGE)
        if values is None or values[0] is None:
            return None
        return ForkPoint(session_id, values[0], values[1])

    # -- compositions of primitives (run under the lock) ----------------------------------
    _LEASE = ("lease_owner", "lease_token", "lease_expires")
    _QUEUE = (*_LEASE, "lease_waiter", "lease_wait_until")

    def _lease_row(self, session_id: str) -> tuple[Any, ...]:
        values = self._backend.op_get_fields(session_id, self._QUEUE)
        if values is None:
            raise SessionNotFoundError(session_id)
        return values

    def _acquire_lease(
        self, session_id: str, owner: str, ttl: float, replace: str | None
    ) -> Lease | None:
        holder, token, expires, waiter, wait_until = self._lease_row(session_id)
        now, token = time.time(), int(token or 0)
        free = holder is None or holder in (owner, replace) or (expires or 0.0) <= now
        queued = waiter is not None and waiter != owner and (wait_until or 0.0) > now
        if holder != owner and (not free or queued):
            if waiter is None or waiter == owner or (wait_until or 0.0) <= now:
                # the first to wait is the next to hold: a holder that turns again at once
                # cannot starve the others
                values = {"lease_waiter": owner, "lease_wait_until": now + _WAITER_TTL}
                self._backend.op_set_fields(session_id, values)
            return None
        lease = Lease(session_id, owner, token if holder == owner else token + 1, now + ttl)
        self._write_lease(lease)
        if waiter == owner:
            self._backend.op_set_fields(session_id, {"lease_waiter": None, "lease_wait_until": 0.0})
        return lease

    def _renew_lease(self, lease: Lease, ttl: float) -> Lease | None:
        holder, token = self._lease_row(lease.session_id)[:2]
        if holder != lease.owner or token != lease.token:
            return None
        renewed = Lease(lease.session_id, lease.owner, token, time.time() + ttl)
        self._write_lease(renewed)
        return renewed

    def _write_lease(self, lease: Lease) -> None:
        values = dict(zip(self._LEASE, (lease.owner, lease.token, lease.expires_at), strict=True))
        self._backend.op_set_fields(lease.session_id, values)

    def _release_lease(self, lease: Lease) -> bool:
        values = self._backend.op_get_fields(lease.session_id, self._LEASE)
        if values is None or values[0] != lease.owner or values[1] != lease.token:
            return False  # lost, or the session is gone with its lease
        self._backend.op_set_fields(lease.session_id, {"lease_owner": None, "lease_expires": 0.0})
        return True

    def _get_lease(self, session_id: str) -> Lease | None:
        values = self._backend.op_get_fields(session_id, self._LEASE)
        if values is None or values[0] is None:
            return None
        return Lease(session_id, values[0], int(values[1] or 0), float(values[2] or 0.0))

    def _check_lease(self, lease: Lease) -> None:
        values = self._backend.op_get_fields(lease.session_id, self._LEASE)
        if values is None:
            raise SessionNotFoundError(lease.session_id)
        if values[0] != lease.owner or values[1] != lease.token:
            raise LeaseLostError(lease.session_id)

    def _field(self, session_id: str, name: str) -> Any:
        values = self._backend.op_get_fields(session_id, (name,))
        return None if values is None else values[0]

    def _text(self, session_id: str, name: str) -> str | None:
        value: str | None = self._field(session_id, name)
        return value

    def _number(self, session_id: str, name: str) -> int:
        value: int | None = self._field(session_id, name)
        return value or 0

    def _list_sessions(
        self, status: SessionStatus | None, role: SessionRole | None, tags: tuple[str, ...]
    ) -> list[SessionMeta]:
        metas = self._backend.op_list_sessions(status, role)
        wanted = set(tags)
        return [meta for meta in metas if wanted.issubset(meta.tags)] if wanted else metas

    def _main_session(self) -> SessionMeta | None:
        mains = self._backend.op_list_sessions(None, "main")
        return mains[0] if mains else None

    def _list_records(
        self, session_id: str, limit: int | None, offset: int, role: str | None
    ) -> list[BaseMessage]:
        records = self._backend.op_records(session_id)
        if role is not None:
            records = [record for record in records if message_role(record) == role]
        end = None if limit is None else offset + limit
        return list(records[offset:end])

    def _list_turns(
        self, session_id: str, limit: int | None, offset: int, role: str | None
    ) -> list[RecordTurn]:
        turns = self._backend.op_turns(session_id)
        if role is not None:
            records = self._backend.op_records(session_id)
            turns = [t for r, t in zip(records, turns, strict=True) if message_role(r) == role]
        end = None if limit is None else offset + limit
        return turns[offset:end]

    def _shared_records(self, session_id: str) -> list[BaseMessage]:
        return list(self._backend.op_records(session_id))

    def _trim(self, session_id: str, keep_last: int) -> int:
        cursors = self._backend.op_get_fields(session_id, ("memory_through", "compression_through"))
        if cursors is None:
            raise SessionNotFoundError(session_id)
        dropped = self._backend.op_count(session_id) - keep_last
        if dropped <= 0:
            return 0
        self._backend.op_drop_oldest(session_id, dropped)
        memory, compression = (max(0, (c or 0) - dropped) for c in cursors)
        values = {"memory_through": memory, "compression_through": compression}
        self._backend.op_set_fields(session_id, values)
        return dropped

    def _put_memory(self, session_id: str, values: dict[str, Any]) -> None:
        through = values.get("memory_through")
        if through is not None and not self._backend.op_session_exists(session_id):
            raise SessionNotFoundError(session_id)
        if through is not None and through > (count := self._backend.op_count(session_id)):
            raise InvalidInputError(
                f"through={through} is beyond the {count} record(s) of session "
                f"{session_id!r}: the memory can cover at most every record; pass at most "
                f"{count}."
            )
        self._backend.op_set_fields(session_id, values)

    def _compression(self, session_id: str) -> Compression | None:
        values = self._backend.op_get_fields(session_id, ("compression", "compression_through"))
        if values is None or values[0] is None:
            return None
        return Compression(summary=values[0], through=values[1] or 0)

    def _settings(self, session_id: str) -> dict[str, Any]:
        found = _loads(self._text(session_id, "settings"))
        return dict(found) if isinstance(found, dict) else {}

    def _clear_insight(self, session_id: str, expected: str | None) -> bool:
        values = self._backend.op_get_fields(session_id, ("insight",))
        if values is None:
            raise SessionNotFoundError(session_id)
        current = values[0]
        if current is None or (expected is not None and current != expected):
            return False
        self._backend.op_set_fields(session_id, {"insight": None})
        return True

    def _put_node(self, node: TopologyNode) -> None:
        if not self._backend.op_session_exists(node.id):
            raise SessionNotFoundError(node.id)
        parent_id = node.parent_id
        if parent_id is not None:
            if parent_id == node.id:
                raise TopologyCycleError(node.id, parent_id)
            if self._backend.op_get_node(parent_id) is None:
                raise NodeNotFoundError(parent_id)
            if any(above.id == node.id for above in self._ancestors(parent_id)):
                raise TopologyCycleError(node.id, parent_id)
        self._backend.op_put_node(node)

    def _ancestors(self, node_id: str) -> list[TopologyNode]:
        found: list[TopologyNode] = []
        seen = {node_id}
        node = self._backend.op_get_node(node_id)
        while node is not None and node.parent_id is not None and node.parent_id not in seen:
            node = self._backend.op_get_node(node.parent_id)
            if node is not None:
                found.append(node)
                seen.add(node.id)
        return found

    def _remove_node(self, node_id: str, cascade: bool) -> list[str]:
        if self._backend.op_get_node(node_id) is None:
            raise NodeNotFoundError(node_id)
        children = self._backend.op_children(node_id)
        if children and not cascade:
            raise NodeHasChildrenError(node_id, len(children))
        removed = [node_id]
        index = 0
        while index < len(removed):  # breadth-first: every parent before its children
            removed.extend(child.id for child in self._backend.op_children(removed[index]))
            index += 1
        self._backend.op_delete_sessions(removed[::-1])
        return removed


def tree_order(nodes: list[TopologyNode]) -> list[TopologyNode]:
    """`nodes` (in creation order) in depth-first pre-order, siblings in creation order."""
    ids = {node.id for node in nodes}
    children: dict[str | None, list[TopologyNode]] = {}
    for node in nodes:
        parent = node.parent_id if node.parent_id in ids else None
        children.setdefault(parent, []).append(node)
    ordered: list[TopologyNode] = []
    stack = list(reversed(children.get(None, [])))
    while stack:
        node = stack.pop()
        ordered.append(node)
        stack.extend(reversed(children.get(node.id, [])))
    return ordered


def _lease_args(
    session_id: str, owner: object, ttl: object, replace: object
) -> tuple[str, str, float, str | None]:
    sid = check_identifier(session_id)
    if not isinstance(owner, str) or not owner:
        raise InvalidInputError(f"A lease owner must be a non-empty str, got {owner!r}.")
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl < 86_400:
        raise InvalidInputError(f"A lease ttl must be seconds in (0, 86400), got {ttl!r}.")
    if replace is not None and not isinstance(replace, str):
        raise InvalidInputError(f"replace must be an owner (str) or None, got {replace!r}.")
    return sid, owner, float(ttl), replace


def _checked_lease(lease: object) -> Lease:
    if not isinstance(lease, Lease):
        raise InvalidInputError(f"Expected a Lease, got {type(lease).__name__}.")
    check_identifier(lease.session_id)
    return lease


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


_LINEAGE = ("forked_from", "forked_at_turn")


def _copy_args(source_id: object, target_id: object, count: object) -> tuple[str, str, int]:
    source, target = check_identifier(source_id), check_identifier(target_id, "target_id")
    if source == target:
        raise InvalidInputError(
            f"copy_records copies records into another session, got {source!r} twice."
        )
    return source, target, check_non_negative(count, "count")


def _lineage_args(
    session_id: object, source_id: object, at_turn: object
) -> tuple[str, dict[str, Any]]:
    sid, source = check_identifier(session_id), check_identifier(source_id, "source_id")
    if at_turn is not None:
        at_turn = check_non_negative(at_turn, "at_turn")
        if at_turn == 0:
            raise InvalidInputError("at_turn is a 1-based user turn (or None), got 0.")
    return sid, {"forked_from": source, "forked_at_turn": at_turn}


def _fork_points(rows: list[tuple[Any, ...]]) -> dict[str, ForkPoint]:
    return {row[0]: ForkPoint(row[0], row[1], row[2]) for row in rows if row[1] is not None}
