"""`Session`: one independent conversation (a child of the topology, role `standard`).

A session keeps its own L3 (raw records), system prompt, L2 (its outward summary, written by
`consolidate`) and the insight the main session last pushed to it. It does not know where it
sits in the tree. Its model never sees its own L2.

Example:
    >>> from stello_graph.checkpoints import InMemoryMainStorage
    >>> from stello_graph.testing import ScriptedChatModel
    >>> storage = InMemoryMainStorage()
    >>> model = ScriptedChatModel(["Tea, then.", "Green tea."])
    >>> s = Session.create(storage, model=model, label="Drinks")
    >>> s.send("Coffee or tea?").content
    'Tea, then.'
    >>> child = s.fork("Tea kinds", context="inherit")
    >>> len(child.messages())
    2
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from typing_extensions import TypedDict, Unpack

from stello_graph._base import SessionBase
from stello_graph._calls import call_async, call_sync, failing_as
from stello_graph._context import (
    branch_block,
    identity_line,
    insight_block,
)
from stello_graph._flow import Atomic, Call, Flow, Storage, arun, run
from stello_graph._fork import ForkContext, ForkRequest, afork_session, fork_session
from stello_graph._session_core import CoreOptions, chosen_fn
from stello_graph._text import storable
from stello_graph._topology_slot import TopologySlot, check_topology_slot
from stello_graph._turn_parts import ContextParts, check_loaded, new_meta
from stello_graph._validate import (
    check_chat_model,
    check_id,
    check_text,
    check_tools,
)
from stello_graph.errors import (
    ConsolidationError,
    DuplicateSessionError,
)
from stello_graph.memory import CompressFn, ConsolidateFn
from stello_graph.models import SessionMeta, utcnow
from stello_graph.storage import MainStorage, SessionStorage

__all__ = ["Session"]

_CONSOLIDATE_ATTEMPTS = 3
"""Consolidations started again when another one wrote the L2 meanwhile."""


def _consolidated(result: object, session_id: str) -> str:
    if not isinstance(result, str):
        raise ConsolidationError(
            f"The consolidate function returned {type(result).__name__}, expected str.",
            session_id=session_id,
        )
    if not result.strip():
        raise ConsolidationError(
            "The consolidate function returned an empty summary.", session_id=session_id
        )
    return storable(result)  # a lone surrogate in it is not the user's fault


class SessionOptions(CoreOptions, total=False):
    """How a `Session` object runs (nothing of it is stored): the options of `create`, `load`.

    Attributes:
        model: the chat model of its turns, or its name (`"openai:gpt-4o-mini"`, built by
            LangChain's `init_chat_model` before anything is stored).
        tools: the tools bound to that model (LangChain tools or tool schemas).
        consolidate_fn: how `consolidate` distils L3 into the L2 (e.g. `llm_consolidator`).
        compression: when and how a long history is summarised in prompts.
        topology_slot: show the session where it stands in the tree, after its identity
            line (`TopologySlot`; needs a storage with a tree).
    """

    consolidate_fn: ConsolidateFn | None
    topology_slot: TopologySlot | bool | None


def _load_flow(session_id: str) -> Flow[SessionMeta]:
    found = yield Storage(MainStorage.get_session, check_id(session_id))
    return check_loaded(found, session_id, "standard")


class SessionForkOptions(TypedDict, total=False):
    """The options of `Session.fork` (each left out: its default)."""

    context: ForkContext
    """`"none"` (default), `"inherit"` (all of L3), `"compress"` (a summary of L3, made once
    by `compress_fn`, becomes the child's starting context) or a function that picks records
    from L3. Incomplete tool-call groups are never copied; L2 and the insight never are."""
    at_turn: int | None
    """Start from the end of this user turn (1-based; negative counts from the end) instead
    of the whole history; `context` then applies to that part."""
    system_prompt: str | None
    """The child's system prompt; by default it inherits this one's."""
    prompt: str | None
    """The child's opening assistant line."""
    model: BaseChatModel | str | None
    """The child's model (or its name, `"openai:gpt-4o-mini"`), instead of this session's."""
    tools: Sequence[Any] | None
    """The child's tools, instead of this session's."""
    tags: Sequence[str]
    """The child's tags."""
    metadata: dict[str, Any] | None
    """The child's metadata."""
    id: str | None
    """The child's id (default: a new one)."""
    compress_fn: CompressFn | None
    """The summariser for `context="compress"` (default: the compression policy's, else
    `llm_compressor` with this session's model)."""


class Session(SessionBase):
    """A child session of the topology. Create with `Session.create`, reopen with `load`."""

    role = "standard"

    def __init__(
        self,
        meta: SessionMeta,
        storage: SessionStorage,
        *,
        consolidate_fn: ConsolidateFn | None = None,
        topology_slot: TopologySlot | bool | None = None,
        **options: Unpack[CoreOptions],
    ) -> None:
        super().__init__(meta, storage, **options)
        self._consolidate_fn = consolidate_fn
        self._topology_slot = check_topology_slot(topology_slot)

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        storage: SessionStorage,
        *,
        label: str = "New Session",
        system_prompt: str | None = None,
        tags: Sequence[str] = (),
        metadata: dict[str, Any] | None = None,
        id: str | None = None,
        **options: Unpack[SessionOptions],
    ) -> Session:
        """Create and store a new session; `options` are how the object runs (`SessionOptions`).

        Raises:
            DuplicateSessionError: `id` is already taken.
            InvalidInputError: a bad label, tags, metadata, id or system prompt.
        """
        meta = new_meta("standard", label, tags, metadata, id)
        return run(cls._create_flow(storage, meta, system_prompt, dict(options)), storage)

    @classmethod
    async def acreate(
        cls,
        storage: SessionStorage,
        *,
        label: str = "New Session",
        system_prompt: str | None = None,
        tags: Sequence[str] = (),
        metadata: dict[str, Any] | None = None,
        id: str | None = None,
        **options: Unpack[SessionOptions],
    ) -> Session:
        """Async twin of `create`."""
        meta = new_meta("standard", label, tags, metadata, id)
        return await arun(cls._create_flow(storage, meta, system_prompt, dict(options)), storage)

    def _store_flow(self, prompt: str | None) -> Flow[None]:
        if (yield Storage(MainStorage.get_session, self._id)) is not None:
            raise DuplicateSessionError(self._id)
        yield from super()._store_flow(prompt)

    @classmethod
    def load(
        cls, session_id: str, storage: SessionStorage, **options: Unpack[SessionOptions]
    ) -> Session:
        """Open a stored session; `options` as for `create`.

        Raises:
            SessionNotFoundError: there is no session with that id.
            InvalidInputError: the id is the main session's (use `MainSession.load`).
        """
        return cls(run(_load_flow(session_id), storage), storage, **options)

    @classmethod
    async def aload(
        cls, session_id: str, storage: SessionStorage, **options: Unpack[SessionOptions]
    ) -> Session:
        """Async twin of `load`."""
        return cls(await arun(_load_flow(session_id), storage), storage, **options)

    # -- context ----------------------------------------------------------------------------
    def _blocks(self, meta: SessionMeta, parts: ContextParts) -> list[str | None]:
        return [
            identity_line(meta.label),
            parts.topology,
            insight_block(parts.extra) if parts.extra else None,
            branch_block(parts.branch) if parts.branch else None,
        ]

    # -- insight and memory -----------------------------------------------------------------
    def insight(self) -> str | None:
        """The pending insight from the main session (read without consuming it)."""
        return self._storage.get_insight(self._id)

    async def ainsight(self) -> str | None:
        return await self._storage.aget_insight(self._id)

    def set_insight(self, insight: str) -> None:
        """Replace the pending insight; the next turn shows it once.

        The status check and the write are one transaction: a session archived meanwhile
        refuses the insight with `SessionArchivedError`.
        """
        self._insight_write(insight).run(self._storage)

    async def aset_insight(self, insight: str) -> None:
        """Async twin of `set_insight`."""
        await self._insight_write(insight).arun(self._storage)

    def _insight_write(self, insight: str) -> Atomic:
        step = Storage(MainStorage.put_insight, self._id, check_text(insight, "insight"))
        return Atomic(self._active_write("an insight", step))

    def memory(self) -> str | None:
        """The session's L2: its outward summary, as the main session sees it."""
        return self._storage.get_memory(self._id)

    async def amemory(self) -> str | None:
        return await self._storage.aget_memory(self._id)

    def _fn_error(self, exc: Exception) -> ConsolidationError:
        return ConsolidationError(
            f"Consolidating session {self._id!r} failed: {type(exc).__name__}: {exc}",
            session_id=self._id,
        )

    def consolidate(
        self, fn: ConsolidateFn | None = None, *, archived_ok: bool = False
    ) -> str | None:
        """Distil the records not yet covered into a new L2 (which replaces the old one).

        Idempotent: with no new records since the last consolidation the function is not
        called and the current L2 is returned. Returns `None` for a session with no records.
        An archived session refuses (`SessionArchivedError`) unless `archived_ok` (its final
        L2, as archiving takes it).

        Safe to run concurrently (threads, processes, the scheduler): the L2 and its cursor
        are read together, and the new L2 is written only if no other consolidation wrote
        meanwhile; otherwise it starts again from that one's L2 (or returns it, if it
        covers as much), so an L2 never loses records nor moves back.
        """
        l2: str | None = run(self._consolidate_flow(fn, archived_ok), self._storage)
        return l2

    async def aconsolidate(
        self, fn: ConsolidateFn | None = None, *, archived_ok: bool = False
    ) -> str | None:
        """Async twin of `consolidate`."""
        l2: str | None = await arun(self._consolidate_flow(fn, archived_ok), self._storage)
        return l2

    def _consolidate_flow(self, fn: ConsolidateFn | None, archived_ok: bool) -> Flow[str | None]:
        sid = self._id
        chosen = chosen_fn(
            fn,
            self._consolidate_fn,
            f"Session {sid!r} has no consolidate function: pass fn= or create the session "
            "with consolidate_fn= (e.g. llm_consolidator(model)).",
        )
        for _ in range(_CONSOLIDATE_ATTEMPTS):
            # L2, its cursor and the records, as of one moment
            read: tuple[str | None, int, list[BaseMessage]]
            read = yield Atomic(self._uncovered_flow(archived_ok))
            current, through, records = read
            if not records:
                return current
            with failing_as(self._fn_error):
                result = yield Call(call_sync, call_async, (chosen, current, list(records)))
            l2 = _consolidated(result, sid)
            stored: tuple[str | None, int] | None
            stored = yield Atomic(self._put_l2_flow(l2, (current, through), len(records)))
            if stored is None:
                return l2
            if stored[1] >= through + len(records):
                return stored[0]  # a concurrent consolidation covered as much meanwhile
        memory: str | None = yield Storage(MainStorage.get_memory, sid)
        return memory

    def _uncovered_flow(self, archived_ok: bool) -> Flow[tuple[str | None, int, list[BaseMessage]]]:
        meta = yield from self._meta_flow()
        if not archived_ok:
            self._active(meta, "consolidation")
        current = yield Storage(MainStorage.get_memory, self._id)
        through = yield Storage(MainStorage.get_memory_through, self._id)
        records = yield Storage(MainStorage.list_records, self._id, offset=through)
        return current, through, records

    def _put_l2_flow(
        self, l2: str, read: tuple[str | None, int], count: int
    ) -> Flow[tuple[str | None, int] | None]:
        """Write `l2` if the L2 is still the one `read`; else return the one stored."""
        memory = yield Storage(MainStorage.get_memory, self._id)
        stored = memory, (yield Storage(MainStorage.get_memory_through, self._id))
        if stored != read:
            return stored
        yield Storage(MainStorage.put_memory, self._id, l2, through=read[1] + count)
        return None

    # -- fork and archive -------------------------------------------------------------------
    def _child(
        self,
        meta: SessionMeta,
        model: BaseChatModel | None,
        tools: Sequence[Any] | None,
    ) -> Session:
        return Session(
            meta,
            self._storage,
            model=model if model is not None else self._model,
            tools=tools if tools is not None else self._tools,
            consolidate_fn=self._consolidate_fn,
            compression=self._compression,
        )

    def fork(self, label: str, **options: Unpack[SessionForkOptions]) -> Session:
        """A new, independent session that starts from this one's context once.

        Options (`SessionForkOptions`, each documented there): `context`, `at_turn`,
        `system_prompt`, `prompt`, `model`, `tools`, `tags`, `metadata`, `id`, `compress_fn`.

        Args:
            label: the child's label.

        Raises:
            FunctionNotConfiguredError: `context="compress"` and no compress function can be
                found; nothing is created then.
            InvalidInputError: a bad option (a `model` that is not a chat model, `tools`
                that are not a list of tools, ...); nothing is created then.
            NodeNotFoundError: the storage keeps a tree (it has a main session) and this
                session has no TopologyNode in it; nothing is created then.
            TurnOutOfRangeError: `at_turn` names no user turn of this session.

        If this session has a TopologyNode, the child's node is written under it in the
        same transaction as the child. A standalone session (a storage with no main
        session) forks standalone children, without nodes. Either way the child's lineage
        (this session, and the user turn its context ends at) is stored with it
        (`storage.get_lineage(child.id)`).
        """
        request, model, tools = self._fork_request(label, options)
        return self._child(fork_session(self._storage, request), model, tools)

    async def afork(self, label: str, **options: Unpack[SessionForkOptions]) -> Session:
        """Async twin of `fork`."""
        request, model, tools = self._fork_request(label, options)
        return self._child(await afork_session(self._storage, request), model, tools)

    def _fork_request(
        self, label: str, options: SessionForkOptions
    ) -> tuple[ForkRequest, BaseChatModel | None, Sequence[Any] | None]:
        """A fork's request, and the child's own model (a name built) and tools: all checked
        before the child is written."""
        given: dict[str, Any] = dict(options)
        unknown = set(given) - set(SessionForkOptions.__annotations__)
        if unknown:
            raise TypeError(f"fork() got unexpected keyword arguments {sorted(unknown)}")
        model, tools = given.pop("model", None), given.pop("tools", None)
        if tools is not None:
            check_tools(tools, schemas=True)
        model = None if model is None else check_chat_model(model)
        if given.get("context") == "compress" and given.get("compress_fn") is None:
            given["compress_fn"] = self._compressor()
        return ForkRequest.build(self._id, label, **given), model, tools

    def archive(self) -> SessionMeta:
        """Archive the session: from now on it refuses turns, forks, consolidation, updates.

        The meta is read and written in one transaction, so only the status changes: an
        update that ran meanwhile is kept, and one that comes after is refused.
        """
        return run(self._meta_write(self._archive_flow()), self._storage)

    async def aarchive(self) -> SessionMeta:
        """Async twin of `archive`."""
        return await arun(self._meta_write(self._archive_flow()), self._storage)

    def _archive_flow(self) -> Flow[SessionMeta]:
        meta = yield from self._meta_flow()
        if meta.status != "archived":
            meta = meta.model_copy(update={"status": "archived", "updated_at": utcnow()})
            yield Storage(MainStorage.put_session, meta)
        return meta
