"""Storage seams: `SessionStorage` (one session's data) and `MainStorage` (the whole tree).

Storage is split by who consumes it: a `Session` needs only `SessionStorage`; the main session
and the orchestration layer need `MainStorage`, which adds the batch read of every child's L2,
the topology tree, listings and a global key-value store.

Both are `Protocol`s, the types the core and the orchestration are written against: every
method the library calls is here (it never probes a storage for optional ones). Every method
has an async twin prefixed with `a` (`get_session` / `aget_session`). The reference
implementations live in `stello_graph.checkpoints`: `SqliteMainStorage` and
`InMemoryMainStorage`. A new storage does not implement these protocols by hand: it
implements the eighteen primitives of `stello_graph.checkpoints.backend.StorageBackend`, and
`BackendStorage(backend)` builds all of this on them.

Rules every implementation follows (the test suite holds both reference implementations to
them, and can be pointed at a third):

* Reads of something missing return `None` (or an empty list); writes to a session that does
  not exist raise `SessionNotFoundError`.
* L3 is append-only apart from `trim_records`; records come back in the order they were
  appended, as LangChain message objects that belong to the caller: changing one changes
  nothing stored (`shared_records` is the one exception, for the core's prompts).
* `transaction()` makes every write inside it atomic and is re-entrant: a nested
  `transaction()` joins (as a savepoint) the outer one, so the orchestration can create a
  session and its `TopologyNode` atomically around calls that open transactions of their own.
* A `MainStorage` is bound to one tree: it never reads or writes another tree's data.
* The tree's event log (`append_event` / `events_after`) is append-only, ordered by a cursor
  that only grows, and shared by every process that opens the tree (`StoredEvents` follows
  it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

from stello_graph.events import StoredEvent
from stello_graph.models import (
    ChildL2,
    Compression,
    Lease,
    SessionMeta,
    SessionRole,
    SessionStatus,
    TopologyNode,
)

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

    from stello_graph.digest import SessionDigest
    from stello_graph.lineage import ForkPoint

__all__ = ["MainStorage", "RecordRole", "SessionSnapshot", "SessionStorage", "normalize_role"]

RecordRole = Literal["human", "ai", "tool", "system", "user", "assistant"]
"""Role filter of `list_records`: LangChain message types, with `user` / `assistant` aliases."""


@dataclass(frozen=True, slots=True)
class SessionSnapshot:
    """Everything a turn reads of its session, read at once (`SessionStorage.read_session`).

    Attributes:
        meta: the session's meta.
        settings: its orchestration settings (empty when none).
        system_prompt: its own system prompt.
        insight: the pending insight.
        memory: the L2 (the synthesis, for the main session).
        subtree_synthesis: what tree integration last made of the node's children.
        compression: the summary that replaces the oldest records in prompts.
        turn_count: user turns committed.
        records: every L3 record in order, shared as `shared_records` returns them (never
            change them); empty when the read did not ask for them.
    """

    meta: SessionMeta
    settings: Mapping[str, Any]
    system_prompt: str | None
    insight: str | None
    memory: str | None
    subtree_synthesis: str | None
    compression: Compression | None
    turn_count: int
    records: Sequence[BaseMessage]


_ROLE_ALIASES = {"user": "human", "assistant": "ai"}
_ROLES = frozenset({"human", "ai", "tool", "system"})


def normalize_role(role: str | None) -> str | None:
    """Map a role filter to the LangChain message type stored (`"user"` -> `"human"`).

    Raises:
        InvalidInputError: the role is not one of `RecordRole`.
    """
    if role is None:
        return None
    from stello_graph.errors import InvalidInputError

    if not isinstance(role, str):
        raise InvalidInputError(f"role must be a string, got {type(role).__name__}.")
    normalized = _ROLE_ALIASES.get(role, role)
    if normalized not in _ROLES:
        raise InvalidInputError(
            f"Unknown record role {role!r}; use one of human/user, ai/assistant, tool, system."
        )
    return normalized


class SessionStorage(Protocol):
    """The data of individual sessions: meta, L3 records, system prompt, insight and L2."""

    # -- meta -----------------------------------------------------------------------------
    def get_session(self, session_id: str) -> SessionMeta | None:
        """The session's meta, or `None` when there is no such session."""
        ...

    def put_session(self, meta: SessionMeta) -> None:
        """Insert or replace the session's meta (and the label of its topology node)."""
        ...

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
        ...

    def list_record_turns(
        self,
        session_id: str,
        *,
        limit: int | None = None,
        offset: int = 0,
        role: str | None = None,
    ) -> list[tuple[str, int]]:
        """`(turn_id, turn_seq)` of the records `list_records` returns for the same arguments."""
        ...

    def has_turn(self, session_id: str, turn_id: str) -> bool:
        """Whether L3 holds a record written by the turn `turn_id` (an index lookup)."""
        ...

    def list_records(
        self,
        session_id: str,
        *,
        limit: int | None = None,
        offset: int = 0,
        role: str | None = None,
    ) -> list[BaseMessage]:
        """Records in append order, optionally filtered by `role` and paged; the caller's
        own copies."""
        ...

    def shared_records(self, session_id: str) -> list[BaseMessage]:
        """Every record in order, *not* copied: the messages may be the ones the storage
        keeps, shared with every caller, and must never be changed. The core reads prompts
        through it (all of L3 at every model call); a storage that keeps no decoded records
        returns `list_records(session_id)`."""
        ...

    def count_records(self, session_id: str) -> int:
        """The number of L3 records of the session (0 when there is no such session)."""
        ...

    def read_session(self, session_id: str, *, records: bool = True) -> SessionSnapshot | None:
        """The session's meta, its per-session values and (with `records`) its L3 records as
        `shared_records` returns them, read at once (one statement where the storage can):
        what a turn needs before its model call. `None` when there is no such session."""
        ...

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
        """A turn's commit, in one transaction: check that `lease` (if given) still holds
        the session and that the session is not archived, append the records (as
        `append_records`), clear the insight if it is still `insight`, and with `release`
        free the lease; return the session's user turns afterwards.

        Raises:
            SessionNotFoundError: no such session.
            LeaseLostError: `lease` no longer holds the session.
            SessionArchivedError: the session is archived.
        """
        ...

    def get_turn_count(self, session_id: str) -> int:
        """The number of user turns committed with `append_records(..., user_turn=True)`."""
        ...

    def trim_records(self, session_id: str, keep_last: int) -> int:
        """Drop all but the newest `keep_last` records; return how many were dropped.

        The L2 cursor (`get_memory_through`) moves back by the number of dropped records.
        """
        ...

    # -- system prompt, insight, memory ---------------------------------------------------
    def get_system_prompt(self, session_id: str) -> str | None: ...

    def put_system_prompt(self, session_id: str, prompt: str | None) -> None:
        """Set the system prompt; `None` removes it."""
        ...

    def get_insight(self, session_id: str) -> str | None: ...

    def put_insight(self, session_id: str, insight: str) -> None:
        """Replace the pending insight (an insight is never appended to another)."""
        ...

    def clear_insight(self, session_id: str, *, expected: str | None = None) -> bool:
        """Remove the pending insight; return whether one was removed.

        With `expected`, only remove it if it is still that text: an insight written by a
        newer integration while a turn was running is kept for the next turn.
        """
        ...

    def get_memory(self, session_id: str) -> str | None:
        """The session's memory: L2 for a standard session, the synthesis for the main one."""
        ...

    def put_memory(self, session_id: str, memory: str, *, through: int | None = None) -> None:
        """Replace the memory; `through` records how many L3 records it covers (at most
        the session's records, counted in the same transaction; more is an
        `InvalidInputError`)."""
        ...

    def get_memory_through(self, session_id: str) -> int:
        """How many L3 records (from the first) the current memory covers; 0 if none."""
        ...

    def get_subtree_synthesis(self, session_id: str) -> str | None:
        """What tree integration last made of the session's children (its branch summary,
        shown in its prompt), or `None`."""
        ...

    def put_subtree_synthesis(self, session_id: str, synthesis: str) -> None:
        """Replace the session's subtree synthesis."""
        ...

    def get_compression(self, session_id: str) -> Compression | None:
        """The summary that replaces the session's oldest records in prompts, if any."""
        ...

    def put_compression(self, session_id: str, compression: Compression | None) -> None:
        """Replace (or drop, with `None`) the compression summary. `trim_records` moves its
        `through` back like the L2 cursor."""
        ...

    def get_settings(self, session_id: str) -> dict[str, Any]:
        """The session's orchestration settings (a JSON object; `{}` when none)."""
        ...

    def put_settings(self, session_id: str, settings: dict[str, Any]) -> None:
        """Replace the session's orchestration settings."""
        ...

    # -- session lease (turns on one session run one at a time, across processes) ----------
    def acquire_lease(
        self, session_id: str, owner: str, ttl: float, *, replace: str | None = None
    ) -> Lease | None:
        """Take or renew the session's lease atomically; `None` while another holds it.

        Free means: nobody holds it, it expired, or its holder is `replace`. A new owner
        gets the stored fencing token plus one; the owner renewing keeps its token. A refused
        owner is remembered as the next holder (unless another waits already, and asked
        again within the last half second), so a holder that turns again at once cannot
        starve the others.
        """
        ...

    def renew_lease(self, lease: Lease, ttl: float) -> Lease | None:
        """Extend `lease` if it still holds the session (same owner and token), else `None`."""
        ...

    def release_lease(self, lease: Lease) -> bool:
        """Free the session if `lease` still holds it (the token is kept, to keep growing),
        and the next-to-hold place if `lease.owner` keeps it; `True` if the lease was freed.
        `Lease(session_id, owner, 0, 0.0)`, never held, frees only the place."""
        ...

    def get_lease(self, session_id: str) -> Lease | None:
        """The session's lease (possibly expired), or `None` when free."""
        ...

    def check_lease(self, lease: Lease) -> None:
        """Raise `LeaseLostError` unless `lease` still holds the session (use it inside the
        transaction that commits what the holder did)."""
        ...

    # -- branching ------------------------------------------------------------------------
    def copy_records(self, source_id: str, target_id: str, *, count: int) -> int:
        """Append the first `count` records of `source_id` after those of `target_id` as
        they are stored (each keeps its turn); return the target's number of records."""
        ...

    def get_lineage(self, session_id: str) -> ForkPoint | None:
        """Where the session was forked from, or `None` (not forked, or no such session)."""
        ...

    def put_lineage(self, session_id: str, source_id: str, at_turn: int | None) -> None:
        """Record the session's fork point: its source and the source's user turn."""
        ...

    # -- transactions ---------------------------------------------------------------------
    def transaction(self) -> AbstractContextManager[None]:
        """A re-entrant context in which every write is atomic."""
        ...

    # -- async twins ----------------------------------------------------------------------
    async def aget_session(self, session_id: str) -> SessionMeta | None: ...
    async def aput_session(self, meta: SessionMeta) -> None: ...
    async def aappend_records(
        self,
        session_id: str,
        messages: Sequence[BaseMessage],
        *,
        user_turn: bool = False,
        turn_id: str | None = None,
    ) -> int: ...
    async def alist_record_turns(
        self,
        session_id: str,
        *,
        limit: int | None = None,
        offset: int = 0,
        role: str | None = None,
    ) -> list[tuple[str, int]]: ...
    async def ahas_turn(self, session_id: str, turn_id: str) -> bool: ...
    async def alist_records(
        self,
        session_id: str,
        *,
        limit: int | None = None,
        offset: int = 0,
        role: str | None = None,
    ) -> list[BaseMessage]: ...
    async def ashared_records(self, session_id: str) -> list[BaseMessage]: ...
    async def acount_records(self, session_id: str) -> int: ...
    async def aread_session(
        self, session_id: str, *, records: bool = True
    ) -> SessionSnapshot | None: ...
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
    ) -> int: ...
    async def aget_turn_count(self, session_id: str) -> int: ...
    async def atrim_records(self, session_id: str, keep_last: int) -> int: ...
    async def aget_system_prompt(self, session_id: str) -> str | None: ...
    async def aput_system_prompt(self, session_id: str, prompt: str | None) -> None: ...
    async def aget_insight(self, session_id: str) -> str | None: ...
    async def aput_insight(self, session_id: str, insight: str) -> None: ...
    async def aclear_insight(self, session_id: str, *, expected: str | None = None) -> bool: ...
    async def aget_memory(self, session_id: str) -> str | None: ...
    async def aput_memory(
        self, session_id: str, memory: str, *, through: int | None = None
    ) -> None: ...
    async def aget_memory_through(self, session_id: str) -> int: ...
    async def aget_subtree_synthesis(self, session_id: str) -> str | None: ...
    async def aput_subtree_synthesis(self, session_id: str, synthesis: str) -> None: ...
    async def aget_compression(self, session_id: str) -> Compression | None: ...
    async def aput_compression(self, session_id: str, compression: Compression | None) -> None: ...
    async def aget_settings(self, session_id: str) -> dict[str, Any]: ...
    async def aput_settings(self, session_id: str, settings: dict[str, Any]) -> None: ...
    async def aacquire_lease(
        self, session_id: str, owner: str, ttl: float, *, replace: str | None = None
    ) -> Lease | None: ...
    async def arenew_lease(self, lease: Lease, ttl: float) -> Lease | None: ...
    async def arelease_lease(self, lease: Lease) -> bool: ...
    async def aget_lease(self, session_id: str) -> Lease | None: ...
    async def acheck_lease(self, lease: Lease) -> None: ...
    async def acopy_records(self, source_id: str, target_id: str, *, count: int) -> int: ...
    async def aget_lineage(self, session_id: str) -> ForkPoint | None: ...
    async def aput_lineage(self, session_id: str, source_id: str, at_turn: int | None) -> None: ...
    def atransaction(self) -> AbstractAsyncContextManager[None]: ...


class MainStorage(SessionStorage, Protocol):
    """Everything a `SessionStorage` does, plus the tree-wide reads and the topology."""

    @property
    def tree_id(self) -> str:
        """The tree this storage is bound to."""
        ...

    def get_all_session_l2s(self) -> list[ChildL2]:
        """The L2 of every active standard session that has one, in creation order."""
        ...

    def list_sessions(
        self,
        *,
        status: SessionStatus | None = None,
        role: SessionRole | None = None,
        tags: Sequence[str] = (),
    ) -> list[SessionMeta]:
        """Sessions in creation order, filtered by status, role and (all of the) tags."""
        ...

    def get_main_session(self) -> SessionMeta | None:
        """The tree's main session, if it has one."""
        ...

    # -- topology -------------------------------------------------------------------------
    def put_node(self, node: TopologyNode) -> None:
        """Insert a node or move/relabel an existing one.

        Raises:
            SessionNotFoundError: no session has the node's id.
            NodeNotFoundError: the parent node does not exist.
            TopologyCycleError: the new parent lies inside the node's subtree.
        """
        ...

    def get_node(self, node_id: str) -> TopologyNode | None: ...

    def get_children(self, parent_id: str) -> list[TopologyNode]:
        """Direct children of a node, in the order they were created."""
        ...

    def get_ancestors(self, node_id: str) -> list[TopologyNode]:
        """The parent, grandparent, ... up to the root (nearest first)."""
        ...

    def get_tree(self) -> list[TopologyNode]:
        """Every node of the tree, parents before children, siblings in creation order."""
        ...

    def remove_node(self, node_id: str, *, cascade: bool = False) -> list[str]:
        """Remove a node and the data of its session; return the removed ids.

        Raises:
            NodeHasChildrenError: the node has children and `cascade` is false.
        """
        ...

    # -- global key-value -----------------------------------------------------------------
    def get_global(self, key: str) -> Any: ...
    def put_global(self, key: str, value: Any) -> None: ...

    # -- the event log --------------------------------------------------------------------
    def append_event(
        self,
        kind: str,
        session_id: str | None = None,
        data: Mapping[str, Any] | None = None,
        *,
        at: datetime | None = None,
    ) -> int:
        """Append an event to the tree's log; return its cursor, larger than every earlier
        one of the tree. Written atomically with the caller's transaction, if any."""
        ...

    def events_after(self, cursor: int = 0, *, limit: int = 100) -> list[StoredEvent]:
        """The tree's events with a cursor above `cursor`, oldest first, at most `limit`
        (1 to 10,000): every process sees them; follow the log from the last cursor seen."""
        ...

    # -- whole-tree reads of branching -----------------------------------------------------
    def list_lineage(self) -> dict[str, ForkPoint]:
        """The fork point of every forked session, by id (one read)."""
        ...

    def list_session_digests(self) -> list[SessionDigest]:
        """Every session's digest, in creation order (one read)."""
        ...

    # -- async twins ----------------------------------------------------------------------
    async def aget_all_session_l2s(self) -> list[ChildL2]: ...
    async def alist_sessions(
        self,
        *,
        status: SessionStatus | None = None,
        role: SessionRole | None = None,
        tags: Sequence[str] = (),
    ) -> list[SessionMeta]: ...
    async def aget_main_session(self) -> SessionMeta | None: ...
    async def aput_node(self, node: TopologyNode) -> None: ...
    async def aget_node(self, node_id: str) -> TopologyNode | None: ...
    async def aget_children(self, parent_id: str) -> list[TopologyNode]: ...
    async def aget_ancestors(self, node_id: str) -> list[TopologyNode]: ...
    async def aget_tree(self) -> list[TopologyNode]: ...
    async def aremove_node(self, node_id: str, *, cascade: bool = False) -> list[str]: ...
    async def aget_global(self, key: str) -> Any: ...
    async def aput_global(self, key: str, value: Any) -> None: ...
    async def aappend_event(
        self,
        kind: str,
        session_id: str | None = None,
        data: Mapping[str, Any] | None = None,
        *,
        at: datetime | None = None,
    ) -> int: ...
    async def aevents_after(self, cursor: int = 0, *, limit: int = 100) -> list[StoredEvent]: ...
    async def alist_lineage(self) -> dict[str, ForkPoint]: ...
    async def alist_session_digests(self) -> list[SessionDigest]: ...
