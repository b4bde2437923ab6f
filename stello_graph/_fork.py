"""Forking: a new, independent session that copies its source's context once.

Shared by `Session.fork` and the orchestration layer (which also forks from the main session).
The child's meta, system prompt, copied records, opening line and TopologyNode are written in
one transaction: a fork never leaves a session without its node, or a node without its session.

In a tree (a storage with a main session) every fork gets a node under its source's, so a
source without a node is refused with `NodeNotFoundError` before anything is computed or
written. A storage without a tree (standalone sessions, no main session) keeps no nodes:
there a fork is standalone like its source.

A fork can start from an earlier turn of its source (`at_turn`: 1-based user turns,
negative from the end): the source's L3 is cut before the next user turn, so a turn's
tool-call groups stay whole. Every fork stores its lineage (`put_lineage`: the source and
the user turn its context ends at). When the child inherits records unchanged (the cut is
already clean: no incomplete tool-call group), they go through `copy_records`, read, cut and
written in one transaction: the SQL storages then write no record row at all, the child
shares its source's rows as a copy-on-write prefix (`checkpoints/_shared_l3`: materialised
in the child before the source trims below the cut or is removed), so a fork costs the same
whatever the length of the history.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from langchain_core.messages import AIMessage, BaseMessage

from stello_graph._calls import call_async, call_sync, failing_as
from stello_graph._context import is_clean, sanitize_history
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
from stello_graph.checkpoints._serde import with_turn
from stello_graph.errors import (
    DuplicateLabelError,
    DuplicateSessionError,
    FunctionCallError,
    InvalidInputError,
    NodeNotFoundError,
    SessionArchivedError,
    SessionNotFoundError,
    TurnOutOfRangeError,
)
from stello_graph.memory import CompressFn
from stello_graph.models import Compression, SessionMeta, TopologyNode
from stello_graph.storage import MainStorage, SessionStorage

__all__ = [
    "ForkContext",
    "ForkRequest",
    "afork_session",
    "check_active",
    "check_at_turn",
    "fork_session",
    "turn_cut",
]

ContextFn = Callable[[list[BaseMessage]], Any]
ForkContext = Literal["none", "inherit", "compress"] | ContextFn
"""How much of the source's L3 the child starts with: nothing, all of it, a summary of it
(`"compress"`), or what a function of it returns."""

_MODES = ("none", "inherit", "compress")


def check_at_turn(value: object) -> int | None:
    """`None`, or a non-zero `int` (not a `bool`): a 1-based user turn, negative from the end.

    Raises:
        InvalidInputError: anything else.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(
            f"at_turn must be an int (a 1-based user turn, negative from the end), "
            f"got {value!r:.60}."
        )
    if value == 0:
        raise InvalidInputError(
            "at_turn=0 names no turn: user turns count from 1 (and -1 is the last one)."
        )
    return value


def turn_cut(records: list[BaseMessage], at_turn: int | None, session_id: str) -> tuple[int, int]:
    """`(end, turn)`: how many records, from the first, make the history up to the end of
    user turn `at_turn` (all of them for `None`), and that turn as a positive number (0 when
    there is no user turn).

    Raises:
        TurnOutOfRangeError: `at_turn` names no user turn of the records.
    """
    # every user message starts a turn (the records before the first belong to turn 1)
    starts = [i for i, record in enumerate(records) if record.type == "human"]
    count = len(starts)
    if at_turn is None:
        return len(records), count
    turn = at_turn if at_turn > 0 else count + 1 + at_turn
    if not 1 <= turn <= count:
        raise TurnOutOfRangeError(session_id, at_turn, count)
    return (starts[turn] if turn < count else len(records)), turn


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
    """Summarises the source's history for `context="compress"` (its callers find one, or
    raise `FunctionNotConfiguredError`)."""
    settings: dict[str, Any] | None = None
    """Orchestration settings of the child (skills allow-list, profile), written with it."""
    at_turn: int | None = None
    """Start from the end of this user turn of the source (1-based; negative from the end)
    instead of its whole history; the context mode then applies to that part."""
    unique_label: bool = False
    """Refuse (`DuplicateLabelError`) a label another child of the source already has."""

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
        at_turn: object = None,
        unique_label: bool = False,
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
        turn = check_at_turn(at_turn)
        if turn is not None and context == "none":
            raise InvalidInputError(
                f"at_turn={turn} cuts the history the child inherits, but context='none' "
                "inherits nothing: pass context='inherit' (or 'compress', or a function)."
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
            at_turn=turn,
            unique_label=bool(unique_label),
        )

    def child_prompt(self, source: SessionMeta, source_prompt: str | None) -> str | None:
        """The child's system prompt: the given one, else inherited (not from main unless asked)."""
        if self.system_prompt is not None:
            return self.system_prompt or None
        inherit = self.inherit_system_prompt
        if inherit is None:
            inherit = source.role != "main"
        return source_prompt if inherit else None


def check_active(meta: SessionMeta | None, session_id: str, operation: str) -> SessionMeta:
    """`meta`, refused when missing or archived (`SessionArchivedError` names `operation`)."""
    if meta is None:
        raise SessionNotFoundError(session_id)
    if meta.status == "archived":
        raise SessionArchivedError(session_id, operation)
    return meta


def _child_records(req: ForkRequest, selected: object) -> list[BaseMessage]:
    if not isinstance(selected, list) or not all(isinstance(m, BaseMessage) for m in selected):
        raise InvalidInputError("A fork context function must return a list of messages.")
    records = sanitize_history(selected)
    if callable(req.context):  # made by a function, not read from L3: may need mending
        records = [storable_message(m) for m in records]
    if req.prompt:
        records.append(AIMessage(content=req.prompt))
    return [m.model_copy() for m in records]


def _inherit_flow(req: ForkRequest, child_id: str) -> Flow[int | None]:
    """Give the child the source's records up to `at_turn`: copied as stored rows when
    nothing needs rewriting, else sanitised and appended. Returns the turn it ends at."""
    shared: list[BaseMessage]
    shared = yield Storage(MainStorage.shared_records, req.source_id)
    end, turn = turn_cut(shared, req.at_turn, req.source_id)
    prefix = shared[:end]
    if prefix and is_clean(prefix):
        yield Storage(MainStorage.copy_records, req.source_id, child_id, count=end)
    elif prefix:  # some records must go: write the others again, each keeping its turn
        keep = {id(m) for m in sanitize_history(prefix)}
        turns: list[tuple[str, int]] = yield Storage(MainStorage.list_record_turns, req.source_id)
        clean = [
            with_turn(m.model_copy(), *t)
            for m, t in zip(prefix, turns, strict=False)
            if id(m) in keep
        ]
        if clean:
            yield Storage(MainStorage.append_records, child_id, clean)
    return turn or None


def _checks_flow(req: ForkRequest) -> Flow[tuple[SessionMeta, bool]]:
    """The source (refused when missing or archived) and whether the child gets a node (its
    source has one); refused outside the tree, or for a label a sibling has with
    `unique_label`.

    Raises:
        NodeNotFoundError: the storage keeps a tree (it has a main session) and the source
            has no node in it.
    """
    meta = yield Storage(MainStorage.get_session, req.source_id)
    source = check_active(meta, req.source_id, "a fork")
    with_node = (yield Storage(MainStorage.get_node, req.source_id)) is not None
    if not with_node and (yield Storage(MainStorage.get_main_session)) is not None:
        raise NodeNotFoundError(
            req.source_id,
            message=f"Session {req.source_id!r} has no topology node in this tree, so a fork of "
            "it would be a session outside the tree: fork a session of the tree (the main "
            "session or one made by a fork), or give it a node first with "
            "put_node(TopologyNode(...)).",
        )
    if with_node and req.unique_label:
        children: list[TopologyNode] = yield Storage(MainStorage.get_children, req.source_id)
        wanted = req.label.strip().casefold()
        taken = next((c for c in children if c.label.strip().casefold() == wanted), None)
        if taken is not None:
            raise DuplicateLabelError(req.source_id, req.label, taken.id)
    return source, with_node


def _write_flow(
    req: ForkRequest,
    records: list[BaseMessage],
    compression: Compression | None = None,
    at_turn: int | None = None,
) -> Flow[SessionMeta]:
    """The writes of a fork, run in one transaction, with its checks made again there.

    `records` (and `compression`, `at_turn`) are what a context or compress function's result
    made before the transaction (just the opening line when no function runs); the child's
    meta and system prompt are made here, from the source as this transaction reads it, so a
    fork without a function takes one transaction and no read before it."""
    source, with_node = yield from _checks_flow(req)
    source_prompt = yield Storage(MainStorage.get_system_prompt, req.source_id)
    meta = SessionMeta(
        id=req.id or new_id(), label=req.label, tags=req.tags, metadata=req.metadata or {}
    )
    if (yield Storage(MainStorage.get_session, meta.id)) is not None:
        raise DuplicateSessionError(meta.id)
    yield Storage(MainStorage.put_session, meta)
    if system_prompt := req.child_prompt(source, source_prompt):
        yield Storage(MainStorage.put_system_prompt, meta.id, system_prompt)
    if req.context == "inherit":
        at_turn = yield from _inherit_flow(req, meta.id)
    if records:
        yield Storage(MainStorage.append_records, meta.id, records)
    if compression is not None:
        yield Storage(MainStorage.put_compression, meta.id, compression)
    if req.settings:
        yield Storage(MainStorage.put_settings, meta.id, req.settings)
    yield Storage(MainStorage.put_lineage, meta.id, req.source_id, at_turn)
    if with_node:
        yield Storage(
            MainStorage.put_node,
            TopologyNode(id=meta.id, parent_id=req.source_id, label=meta.label),
        )
    return meta


def fork_session(storage: SessionStorage, req: ForkRequest) -> SessionMeta:
    """Create the child of `req.source_id` and its TopologyNode atomically; return its meta.

    Nothing is written when anything fails: the source is missing, archived or (in a tree)
    has no node, the id is taken, or a context / compress function raises. Without a
    function (`context="none"` / `"inherit"`) the checks run in the fork's one write
    transaction, so on SQLite a refused fork waits for another writer's lock as a fork does.
    """
    return run(_fork_flow(req), storage)


async def afork_session(storage: SessionStorage, req: ForkRequest) -> SessionMeta:
    """Async twin of `fork_session`."""
    return await arun(_fork_flow(req), storage)


def _fork_flow(req: ForkRequest) -> Flow[SessionMeta]:
    selected: object = []
    compression, turn = None, 0
    if req.context not in ("none", "inherit"):  # else no function runs: one transaction
        # refuse early, before the function runs (and again in the write's transaction)
        yield from _checks_flow(req)
        # the source's L3 (copies), up to at_turn, for the function
        records: list[BaseMessage] = yield Storage(MainStorage.list_records, req.source_id)
        end, turn = turn_cut(records, req.at_turn, req.source_id)
        records = records[:end]
        what = "context" if callable(req.context) else "compress"
        with failing_as(
            lambda exc: FunctionCallError(
                f"The fork's {what} function failed: {type(exc).__name__}: {exc}"
            )
        ):
            if callable(req.context):
                selected = yield Call(call_sync, call_async, (req.context, list(records)))
            else:  # "compress": every caller gives it the function (or refuses, having none)
                older = sanitize_history(records)
                result = yield Call(call_sync, call_async, (req.compress_fn, None, older))
                if not isinstance(result, str) or not result.strip():
                    raise FunctionCallError(
                        f"The compress function returned {result!r:.60}, expected a "
                        "non-empty summary."
                    )
                compression = Compression(summary=storable(result), through=0)
    child = _child_records(req, selected)
    meta: SessionMeta = yield Atomic(_write_flow(req, child, compression, turn or None))
    return meta
