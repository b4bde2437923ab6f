"""Forking: a new, independent session that copies its source's context once.

Shared by `Session.fork` and the orchestration layer (which also forks from the main session).
The child's meta, system prompt, copied records, opening line and TopologyNode are written in
one transaction: a fork never leaves a session without its node, or a node without its session.

In a tree (a storage with a main session) every fork gets a node under its source's, so a
source without a node is refused with `NodeNotFoundError` before anything is computed or
written. A storage without a tree (standalone sessions, or a plain `SessionStorage`) keeps
no nodes: there a fork is standalone like its source.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from langchain_core.messages import AIMessage, BaseMessage

from stello_graph._calls import call_async, call_sync
from stello_graph._context import sanitize_history
from stello_graph._copies import ashared_records, shared_records
from stello_graph._flow import Atomic, Call, Flow, Storage, arun, run
from stello_graph._text import storable, storable_message
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
    FunctionCallError,
    FunctionNotConfiguredError,
    InvalidInputError,
    NodeNotFoundError,
    SessionArchivedError,
    SessionNotFoundError,
    StelloError,
)
from stello_graph.memory import CompressFn
from stello_graph.models import Compression, SessionMeta, TopologyNode
from stello_graph.storage import SessionStorage

__all__ = ["ForkContext", "ForkRequest", "afork_session", "fork_session"]

ContextFn = Callable[[list[BaseMessage]], Any]
ForkContext = Literal["none", "inherit", "compress"] | ContextFn
"""How much of the source's L3 the child starts with: nothing, all of it, a summary of it
(`"compress"`), or what a function of it returns."""

_MODES = ("none", "inherit", "compress")


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
    compress_fn: CompressFn | None = None
    """Summarises the source's history for `context="compress"`."""
    settings: dict[str, Any] | None = None
    """Orchestration settings of the child (skills allow-list, profile), written with it."""

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
        compress_fn: CompressFn | None = None,
        settings: dict[str, Any] | None = None,
    ) -> ForkRequest:
        if not (context in _MODES or callable(context)):
            raise InvalidInputError(
                "context must be 'none', 'inherit', 'compress' or a function of the records, "
                f"got {context!r}."
            )
        if inherit_system_prompt is not None and not isinstance(inherit_system_prompt, bool):
            raise InvalidInputError(
                f"inherit_system_prompt must be a bool or None, got {inherit_system_prompt!r:.80}."
            )
        if context == "compress" and compress_fn is None:
            raise FunctionNotConfiguredError(
                "A fork with context='compress' needs a compress function: pass compress_fn= "
                "(e.g. llm_compressor(model)) or give the session a model."
            )
        return cls(
            source_id=source_id,
            label=check_label(label),
            context=context,  # type: ignore[arg-type]
            system_prompt=check_optional_text(system_prompt, "system_prompt"),
            inherit_system_prompt=inherit_system_prompt,
            prompt=check_optional_text(prompt, "prompt"),
            tags=check_tags(tags),
            metadata=check_metadata(metadata),
            id=None if id is None else check_id(id),
            compress_fn=compress_fn,
            settings=settings,
        )

    def child_prompt(self, source: SessionMeta, source_prompt: str | None) -> str | None:
        """The child's system prompt: the given one, else inherited (not from main unless asked)."""
        if self.system_prompt is not None:
            return self.system_prompt or None
        inherit = self.inherit_system_prompt
        if inherit is None:
            inherit = source.role != "main"
        return source_prompt if inherit else None


@dataclass(frozen=True, slots=True)
class _Child:
    """Everything a fork writes."""

    meta: SessionMeta
    system_prompt: str | None
    records: list[BaseMessage]
    compression: Compression | None


def _check_source(meta: SessionMeta | None, source_id: str) -> SessionMeta:
    if meta is None:
        raise SessionNotFoundError(source_id)
    if meta.status == "archived":
        raise SessionArchivedError(source_id, "a fork")
    return meta


def _outside_the_tree(source_id: str) -> NodeNotFoundError:
    return NodeNotFoundError(
        source_id,
        message=f"Session {source_id!r} has no topology node in this tree, so a fork of it "
        "would be a session outside the tree: fork a session of the tree (the main session "
        "or one made by a fork), or give it a node first with put_node(TopologyNode(...)).",
    )


_NO_TOPOLOGY: Any = object()
"""What a storage without `get_node` (a plain `SessionStorage`) answers for one."""


def _node_flow(source_id: str) -> Flow[bool]:
    """Whether the child gets a node (its source has one); refuse a source outside the tree.

    Raises:
        NodeNotFoundError: the storage keeps a tree (it has a main session) and the source
            has no node in it.
    """
    node = yield Storage("get_node", source_id, optional=True, default=_NO_TOPOLOGY)
    if node is _NO_TOPOLOGY:
        return False  # a plain SessionStorage keeps no topology
    if node is not None:
        return True
    if (yield Storage("get_main_session")) is not None:
        raise _outside_the_tree(source_id)
    return False


def _child_records(req: ForkRequest, selected: object) -> list[BaseMessage]:
    if not isinstance(selected, list) or not all(isinstance(m, BaseMessage) for m in selected):
        raise InvalidInputError("A fork context function must return a list of messages.")
    records = sanitize_history(selected)
    if callable(req.context):  # made by a function, not read from L3: may need mending
        records = [storable_message(m) for m in records]
    if req.prompt:
        records.append(AIMessage(content=req.prompt))
    return [m.model_copy() for m in records]


def _summary(result: object) -> Compression:
    if not isinstance(result, str) or not result.strip():
        raise FunctionCallError(
            f"The compress function returned {result!r:.60}, expected a non-empty summary."
        )
    return Compression(summary=storable(result), through=0)


def _child(
    req: ForkRequest,
    source: SessionMeta,
    source_prompt: str | None,
    selected: object,
    compression: Compression | None,
) -> _Child:
    meta = SessionMeta(
        id=req.id or new_id(), label=req.label, tags=req.tags, metadata=req.metadata or {}
    )
    prompt = req.child_prompt(source, source_prompt)
    return _Child(meta, prompt, _child_records(req, selected), compression)


def _write_flow(req: ForkRequest, child: _Child) -> Flow[None]:
    """The writes of a fork, run in one transaction."""
    _check_source((yield Storage("get_session", req.source_id)), req.source_id)
    with_node = yield from _node_flow(req.source_id)
    meta = child.meta
    if (yield Storage("get_session", meta.id)) is not None:
        raise DuplicateSessionError(meta.id)
    yield Storage("put_session", meta)
    if child.system_prompt:
        yield Storage("put_system_prompt", meta.id, child.system_prompt)
    if child.records:
        yield Storage("append_records", meta.id, child.records)
    if child.compression is not None:
        yield Storage("put_compression", meta.id, child.compression)
    if req.settings:
        yield Storage("put_settings", meta.id, req.settings)
    if with_node:
        yield Storage(
            "put_node", TopologyNode(id=meta.id, parent_id=req.source_id, label=meta.label)
        )


def _records_flow(storage: SessionStorage, req: ForkRequest) -> Flow[list[BaseMessage]]:
    """The source's L3 the fork needs: shared when it is only copied into the child,
    copies when a context or compress function gets it."""
    if req.context == "none":
        return []
    if req.context == "inherit":
        shared: list[BaseMessage]
        shared = yield Call(shared_records, ashared_records, (storage, req.source_id))
        return shared
    copies: list[BaseMessage] = yield Storage("list_records", req.source_id)
    return copies


def _fn_error(exc: Exception, what: str) -> FunctionCallError:
    return FunctionCallError(f"The fork's {what} function failed: {type(exc).__name__}: {exc}")


def fork_session(storage: SessionStorage, req: ForkRequest) -> SessionMeta:
    """Create the child of `req.source_id` and its TopologyNode atomically; return its meta.

    Nothing is written when anything fails: the source is missing, archived or (in a tree)
    has no node, the id is taken, or a context / compress function raises.
    """
    meta: SessionMeta = run(_fork_flow(storage, req), storage)
    return meta


async def afork_session(storage: SessionStorage, req: ForkRequest) -> SessionMeta:
    """Async twin of `fork_session`."""
    meta: SessionMeta = await arun(_fork_flow(storage, req), storage)
    return meta


def _fork_flow(storage: SessionStorage, req: ForkRequest) -> Flow[SessionMeta]:
    source = _check_source((yield Storage("get_session", req.source_id)), req.source_id)
    yield from _node_flow(req.source_id)  # refuse early, before any function runs
    source_prompt = yield Storage("get_system_prompt", req.source_id)
    records = yield from _records_flow(storage, req)
    selected: object = records if req.context == "inherit" else []
    compression = None
    try:
        if callable(req.context):
            selected = yield Call(call_sync, call_async, (req.context, list(records)))
        elif req.context == "compress" and req.compress_fn is not None:
            older = sanitize_history(records)
            result = yield Call(call_sync, call_async, (req.compress_fn, None, older))
            compression = _summary(result)
    except StelloError:
        raise
    except Exception as exc:
        raise _fn_error(exc, "context" if callable(req.context) else "compress") from exc
    child = _child(req, source, source_prompt, selected, compression)
    yield Atomic(_write_flow(req, child))
    return child.meta
