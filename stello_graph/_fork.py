"""Forking: a new, independent session that copies its source's context once.

Shared by `Session.fork` and the orchestration layer (which also forks from the main session).
The child's meta, system prompt, copied records, opening line and TopologyNode are written in
one transaction: a fork never leaves a session without its node, or a node without its session.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from langchain_core.messages import AIMessage, BaseMessage

from stello_graph._calls import call_async, call_sync
from stello_graph._context import sanitize_history
from stello_graph._validate import (
    check_id,
    check_label,
    check_metadata,
    check_optional_text,
    check_tags,
    new_id,
)
from stello_graph.errors import (
    DuplicateSessionError,
    InvalidInputError,
    SessionArchivedError,
    SessionNotFoundError,
)
from stello_graph.models import SessionMeta, TopologyNode
from stello_graph.storage import SessionStorage

__all__ = ["ForkContext", "ForkRequest", "afork_session", "fork_session"]

ContextFn = Callable[[list[BaseMessage]], Any]
ForkContext = Literal["none", "inherit"] | ContextFn
"""How much of the source's L3 the child starts with: nothing, all of it, or a function of it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ForkRequest:
    """A validated fork, before anything is read or written."""

    source_id: str
    label: str
    context: ForkContext = "none"
    system_prompt: str | None = None
    inherit_system_prompt: bool | None = None
    prompt: str | None = None
    tags: tuple[str, ...] = ()
    metadata: dict[str, Any] | None = None
    id: str | None = None

    @classmethod
    def build(
        cls,
        source_id: str,
        label: object,
        *,
        context: object = "none",
        system_prompt: object = None,
        inherit_system_prompt: bool | None = None,
        prompt: object = None,
        tags: object = (),
        metadata: object = None,
        id: object = None,
    ) -> ForkRequest:
        if not (context in ("none", "inherit") or callable(context)):
            raise InvalidInputError(
                f"context must be 'none', 'inherit' or a function of the records, got {context!r}."
            )
        return cls(
            source_id=source_id,
            label=check_label(label),
            context=context,
            system_prompt=check_optional_text(system_prompt, "system_prompt"),
            inherit_system_prompt=inherit_system_prompt,
            prompt=check_optional_text(prompt, "prompt"),
            tags=check_tags(tags),
            metadata=check_metadata(metadata),
            id=None if id is None else check_id(id),
        )

    def child_prompt(self, source: SessionMeta, source_prompt: str | None) -> str | None:
        """The child's system prompt: the given one, else inherited (not from main unless asked)."""
        if self.system_prompt is not None:
            return self.system_prompt or None
        inherit = self.inherit_system_prompt
        if inherit is None:
            inherit = source.role != "main"
        return source_prompt if inherit else None


def _check_source(meta: SessionMeta | None, source_id: str) -> SessionMeta:
    if meta is None:
        raise SessionNotFoundError(source_id)
    if meta.status == "archived":
        raise SessionArchivedError(source_id, "a fork")
    return meta


def _child_records(req: ForkRequest, selected: object) -> list[BaseMessage]:
    if not isinstance(selected, list) or not all(isinstance(m, BaseMessage) for m in selected):
        raise InvalidInputError("A fork context function must return a list of messages.")
    records = sanitize_history(selected)
    if req.prompt:
        records.append(AIMessage(content=req.prompt))
    return [m.model_copy() for m in records]


def _child_meta(req: ForkRequest) -> SessionMeta:
    return SessionMeta(
        id=req.id or new_id(),
        label=req.label,
        tags=req.tags,
        metadata=req.metadata or {},
    )


def _write(
    storage: SessionStorage,
    req: ForkRequest,
    meta: SessionMeta,
    system_prompt: str | None,
    records: list[BaseMessage],
) -> None:
    """The writes of a fork; the caller holds the transaction."""
    _check_source(storage.get_session(req.source_id), req.source_id)
    if storage.get_session(meta.id) is not None:
        raise DuplicateSessionError(meta.id)
    storage.put_session(meta)
    if system_prompt:
        storage.put_system_prompt(meta.id, system_prompt)
    if records:
        storage.append_records(meta.id, records)
    get_node = getattr(storage, "get_node", None)
    if get_node is not None and get_node(req.source_id) is not None:
        storage.put_node(TopologyNode(id=meta.id, parent_id=req.source_id, label=meta.label))  # type: ignore[attr-defined]


async def _awrite(
    storage: SessionStorage,
    req: ForkRequest,
    meta: SessionMeta,
    system_prompt: str | None,
    records: list[BaseMessage],
) -> None:
    _check_source(await storage.aget_session(req.source_id), req.source_id)
    if await storage.aget_session(meta.id) is not None:
        raise DuplicateSessionError(meta.id)
    await storage.aput_session(meta)
    if system_prompt:
        await storage.aput_system_prompt(meta.id, system_prompt)
    if records:
        await storage.aappend_records(meta.id, records)
    aget_node = getattr(storage, "aget_node", None)
    if aget_node is not None and await aget_node(req.source_id) is not None:
        node = TopologyNode(id=meta.id, parent_id=req.source_id, label=meta.label)
        await storage.aput_node(node)  # type: ignore[attr-defined]


def _select(req: ForkRequest, records: list[BaseMessage]) -> object:
    if req.context == "none":
        return []
    if req.context == "inherit":
        return records
    return call_sync(req.context, list(records))


def fork_session(storage: SessionStorage, req: ForkRequest) -> SessionMeta:
    """Create the child of `req.source_id` and its TopologyNode atomically; return its meta."""
    source = _check_source(storage.get_session(req.source_id), req.source_id)
    source_prompt = storage.get_system_prompt(req.source_id)
    records = storage.list_records(req.source_id) if req.context != "none" else []
    child_records = _child_records(req, _select(req, records))
    meta = _child_meta(req)
    with storage.transaction():
        _write(storage, req, meta, req.child_prompt(source, source_prompt), child_records)
    return meta


async def afork_session(storage: SessionStorage, req: ForkRequest) -> SessionMeta:
    """Async twin of `fork_session`."""
    source = _check_source(await storage.aget_session(req.source_id), req.source_id)
    source_prompt = await storage.aget_system_prompt(req.source_id)
    records = await storage.alist_records(req.source_id) if req.context != "none" else []
    if req.context in ("none", "inherit"):
        selected: object = records if req.context == "inherit" else []
    else:
        selected = await call_async(req.context, list(records))  # type: ignore[arg-type]
    child_records = _child_records(req, selected)
    meta = _child_meta(req)
    async with storage.atransaction():
        await _awrite(storage, req, meta, req.child_prompt(source, source_prompt), child_records)
    return meta
