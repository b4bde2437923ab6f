"""The session's own state and its plain storage members (meta, records, system prompt).

`SessionBase` (`_base`) builds the turn's context and the turn on top of this layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Self, TypeVar

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    BaseMessage,
)
from langchain_core.runnables import Runnable
from typing_extensions import TypedDict

from stello_graph._context import SanitizedHistory
from stello_graph._flow import Atomic, Flow, Storage, arun, run
from stello_graph._topology_slot import TopologySlot
from stello_graph._turn_parts import ModelInput, TurnContext, _with_turns
from stello_graph._validate import (
    check_chat_model,
    check_label,
    check_metadata,
    check_optional_text,
    check_tags,
)
from stello_graph.compression import CompressionPolicy
from stello_graph.errors import (
    FunctionNotConfiguredError,
    InvalidInputError,
    SessionArchivedError,
    SessionNotFoundError,
)
from stello_graph.models import Compression, SessionMeta, SessionRole, utcnow
from stello_graph.storage import MainStorage, SessionStorage

__all__ = ["CoreOptions", "SessionCore"]

T = TypeVar("T")


def chosen_fn(fn: T | None, configured: T | None, missing: str) -> T:
    """The memory function of a call: `fn` if given, else the session's `configured` one
    (`FunctionNotConfiguredError` with `missing` when neither is there)."""
    chosen = fn if fn is not None else configured
    if chosen is None:
        raise FunctionNotConfiguredError(missing)
    if not callable(chosen):
        raise InvalidInputError(f"fn must be callable, got {type(chosen).__name__}.")
    return chosen


class CoreOptions(TypedDict, total=False):
    """The options every session object runs with (`SessionOptions` and `MainOptions` add
    their own): as `SessionCore.__init__` takes them."""

    model: BaseChatModel | str | None
    tools: Sequence[Any] | None
    compression: CompressionPolicy | None


class SessionCore:
    """A session's identity, state and storage members; the base of `SessionBase`."""

    role: ClassVar[SessionRole] = "standard"
    _topology_slot: TopologySlot | None = None
    """Shows the session where it stands in the tree (`Session` sets it when asked)."""

    def __init__(
        self,
        meta: SessionMeta,
        storage: SessionStorage,
        *,
        model: BaseChatModel | str | None = None,
        tools: Sequence[Any] | None = None,
        compression: CompressionPolicy | None = None,
    ) -> None:
        self._id = meta.id
        self._compression = compression
        self._meta = meta
        self._storage = storage
        self._model: BaseChatModel | None = (
            None if model is None else check_chat_model(model)  # a name is built once
        )
        self._tools: list[Any] = list(tools) if tools else []
        self._bound: Runnable[ModelInput, Any] | None = None
        self._history = SanitizedHistory()  # the history shown at the last model call
        # The last cut this object made, and how many records L3 held then: the replies
        # among those predate the cut (see `_plan`).
        self._cut: tuple[Compression, int] | None = None
        # The context the running turn read: (turn id, records in L3 then, context).
        self._turn: tuple[str, int, TurnContext] | None = None

    @classmethod
    def _create_flow(
        cls, storage: SessionStorage, meta: SessionMeta, prompt: object, options: dict[str, Any]
    ) -> Flow[Self]:
        """The steps of `create`: the session, its system prompt and the `options` of the
        object are checked first, before the transaction that writes it."""
        prompt = check_optional_text(prompt, "system_prompt")
        session = cls(meta, storage, **options)
        yield Atomic(session._store_flow(prompt))
        return session

    def _store_flow(self, prompt: str | None) -> Flow[None]:
        """Write the new session (in the transaction of `create`)."""
        yield Storage(MainStorage.put_session, self._meta)
        if prompt:
            yield Storage(MainStorage.put_system_prompt, self._id, prompt)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self._id!r}, label={self._meta.label!r})"

    # -- identity ---------------------------------------------------------------------------
    @property
    def id(self) -> str:
        """The session id."""
        return self._id

    @property
    def meta(self) -> SessionMeta:
        """The session's meta, read from storage (so another writer's changes show)."""
        self._meta = run(self._meta_flow(), self._storage)
        return self._meta

    async def ameta(self) -> SessionMeta:
        """Async twin of `meta`."""
        self._meta = await arun(self._meta_flow(), self._storage)
        return self._meta

    @property
    def storage(self) -> SessionStorage:
        return self._storage

    @property
    def model(self) -> BaseChatModel | None:
        return self._model

    @property
    def tools(self) -> list[Any]:
        """The tools bound to the session's model (LangChain tools or tool schemas)."""
        return list(self._tools)

    # -- storage reads ----------------------------------------------------------------------
    def _meta_flow(self) -> Flow[SessionMeta]:
        meta: SessionMeta | None = yield Storage(MainStorage.get_session, self._id)
        if meta is None:
            raise SessionNotFoundError(self._id)
        return meta

    def _active(self, meta: SessionMeta, operation: str) -> SessionMeta:
        if meta.status == "archived":
            raise SessionArchivedError(self._id, operation)
        self._meta = meta
        return meta

    # -- records and system prompt ----------------------------------------------------------
    def messages(
        self, *, limit: int | None = None, offset: int = 0, role: str | None = None
    ) -> list[BaseMessage]:
        """L3 records as LangChain messages (copies: safe to change).

        Each one carries the turn that wrote it in `response_metadata`: under
        `"stello_turn_id"` the turn's id (one per committed turn), under `"stello_turn_seq"`
        its place in that turn (0, 1, ...). Chat models do not send `response_metadata` to
        providers, so the messages can be replayed as they are.
        """
        found = self._storage.list_records(self._id, limit=limit, offset=offset, role=role)
        marks = self._storage.list_record_turns(self._id, limit=limit, offset=offset, role=role)
        return _with_turns(found, marks)

    async def amessages(
        self, *, limit: int | None = None, offset: int = 0, role: str | None = None
    ) -> list[BaseMessage]:
        """Async twin of `messages`."""
        s = self._storage
        found = await s.alist_records(self._id, limit=limit, offset=offset, role=role)
        marks = await s.alist_record_turns(self._id, limit=limit, offset=offset, role=role)
        return _with_turns(found, marks)

    def system_prompt(self) -> str | None:
        """The session's own system prompt (without identity, insight or synthesis)."""
        return self._storage.get_system_prompt(self._id)

    async def asystem_prompt(self) -> str | None:
        return await self._storage.aget_system_prompt(self._id)

    def set_system_prompt(self, prompt: str | None) -> None:
        """Replace the system prompt (`None` removes it).

        The status check and the write are one transaction: a session archived meanwhile
        refuses the change with `SessionArchivedError`.
        """
        self._prompt_write(prompt).run(self._storage)

    async def aset_system_prompt(self, prompt: str | None) -> None:
        """Async twin of `set_system_prompt`."""
        await self._prompt_write(prompt).arun(self._storage)

    def _prompt_write(self, prompt: str | None) -> Atomic:
        prompt = check_optional_text(prompt, "system_prompt")  # checked before the transaction
        step = Storage(MainStorage.put_system_prompt, self._id, prompt)
        return Atomic(self._active_write("a system prompt change", step))

    def _active_write(self, operation: str, step: Storage) -> Flow[None]:
        """The meta read and refused if archived (`operation` names the write), then `step`;
        its callers run it in one transaction, so a session archived meanwhile refuses it."""
        self._active((yield from self._meta_flow()), operation)
        yield step

    def _meta_update(
        self,
        label: str | None,
        tags: Sequence[str] | None,
        metadata: dict[str, Any] | None,
    ) -> Flow[SessionMeta]:
        """The steps of a meta update; its fields are checked now, before any lock is taken."""
        changes: dict[str, Any] = {}
        if label is not None:
            changes["label"] = check_label(label)
        if tags is not None:
            changes["tags"] = check_tags(tags)
        if metadata is not None:
            changes["metadata"] = check_metadata(metadata)
        return self._meta_write(self._updated_flow(changes))

    def update_meta(
        self,
        *,
        label: str | None = None,
        tags: Sequence[str] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> SessionMeta:
        """Change label, tags or metadata (each replaced when given); return the new meta.

        The meta is read, checked and written in one transaction, so the update changes only
        the fields given: a concurrent archive or update of other fields is never undone
        (and an archive that came first refuses the update with `SessionArchivedError`).
        """
        return run(self._meta_update(label, tags, metadata), self._storage)

    async def aupdate_meta(
        self,
        *,
        label: str | None = None,
        tags: Sequence[str] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> SessionMeta:
        """Async twin of `update_meta`."""
        return await arun(self._meta_update(label, tags, metadata), self._storage)

    def _meta_write(self, flow: Flow[SessionMeta]) -> Flow[SessionMeta]:
        """`flow` run in one transaction; the meta it wrote is the object's from then on."""
        self._meta = yield Atomic(flow)
        return self._meta

    def _updated_flow(self, changes: dict[str, Any]) -> Flow[SessionMeta]:
        meta = self._active((yield from self._meta_flow()), "a meta update")
        new = meta.model_copy(update={**changes, "updated_at": utcnow()})
        yield Storage(MainStorage.put_session, new)
        return new
