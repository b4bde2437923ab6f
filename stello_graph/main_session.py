"""`MainSession`: the root of a topology, its global awareness layer.

The main session reads only its children's L2 (never their L3), integrates them into a
synthesis, and pushes targeted insights back to single children. It does not fork: children
are created by the orchestration layer (`StelloAgent.fork`), or as standalone `Session`s.

Example:
    >>> from stello_graph import IntegrationResult, Session
    >>> from stello_graph.checkpoints import InMemoryMainStorage
    >>> storage = InMemoryMainStorage()
    >>> main = MainSession.create(storage)
    >>> child = Session.create(storage, label="Pricing")
    >>> storage.put_memory(child.id, "Users want a free tier.")
    >>> result = main.integrate(
    ...     lambda children, current: IntegrationResult(
    ...         synthesis="Free tier matters.", insights={children[0].session_id: "Mind cost."}
    ...     )
    ... )
    >>> main.synthesis(), child.insight()
    ('Free tier matters.', 'Mind cost.')
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NoReturn

from typing_extensions import Unpack

from stello_graph._base import SessionBase
from stello_graph._calls import call_async, call_sync, failing_as
from stello_graph._context import synthesis_block
from stello_graph._flow import Atomic, Call, Flow, Storage, arun, run
from stello_graph._session_core import CoreOptions, chosen_fn
from stello_graph._text import storable
from stello_graph._turn_parts import ContextParts, check_loaded, new_meta
from stello_graph._validate import check_id
from stello_graph.errors import (
    IntegrationError,
    IntegrationSupersededError,
    InvalidInputError,
    MainSessionExistsError,
    MainSessionForkError,
    MainSessionNotFoundError,
    NothingToIntegrateError,
)
from stello_graph.memory import IntegrateFn
from stello_graph.models import ChildL2, IntegrationResult, SessionMeta, TopologyNode
from stello_graph.storage import MainStorage

__all__ = [
    "FINAL_L2S_KEY",
    "VERSION_KEY",
    "MainSession",
    "archived_l2s",
    "check_integration",
    "final_ids",
    "integration_read",
    "integration_stored",
]

FINAL_L2S_KEY = "stello:final_l2s"
"""The tree's global key listing archived sessions whose final L2 awaits an integration."""

VERSION_KEY = "stello:integration_version"
"""The tree's global key counting the integrations stored: an integration is stored only if
the count is still the one it read as it began (no other was stored meanwhile)."""


def final_ids(value: object) -> list[str]:
    """The session ids of a stored `FINAL_L2S_KEY` value (nothing else it may hold)."""
    return [x for x in value if isinstance(x, str)] if isinstance(value, list) else []


def _version(value: object) -> int:
    return value if type(value) is int else 0


def integration_read() -> Flow[tuple[int, list[str]]]:
    """What an integration reads before anything else: the count of stored integrations,
    and the archived sessions whose final L2 it brings (those pending now)."""
    version = _version((yield Storage(MainStorage.get_global, VERSION_KEY)))
    return version, final_ids((yield Storage(MainStorage.get_global, FINAL_L2S_KEY)))


def integration_stored(main_id: str, version: int, brought: Sequence[str]) -> Flow[None]:
    """In an integration's write transaction, first: refuse it when another integration
    was stored since it began (`version`: what `integration_read` found), else count it and
    forget the pending final L2s it `brought`.

    So of integrations that overlap (a called one and a scheduled one, or two processes)
    only one is stored: each stored one read the synthesis the one before it stored, and an
    archived branch's final L2 stays pending until a stored integration brought it. None is
    ever written over by one that never saw it.

    Raises:
        IntegrationSupersededError: another integration was stored meanwhile (nothing is
            written).
    """
    if _version((yield Storage(MainStorage.get_global, VERSION_KEY))) != version:
        raise IntegrationSupersededError(main_id)
    yield Storage(MainStorage.put_global, VERSION_KEY, version + 1)
    yield from forget_final(brought)


def forget_final(brought: Sequence[str]) -> Flow[None]:
    """Drop `brought` from the pending final L2s."""
    if brought:
        held = final_ids((yield Storage(MainStorage.get_global, FINAL_L2S_KEY)))
        yield Storage(MainStorage.put_global, FINAL_L2S_KEY, [x for x in held if x not in brought])


def archived_l2s(session_ids: Sequence[str]) -> Flow[list[ChildL2]]:
    """The L2 of those of `session_ids` that are archived standard sessions with one."""
    found = []
    for sid in dict.fromkeys(session_ids):
        meta = yield Storage(MainStorage.get_session, sid)
        l2 = yield Storage(MainStorage.get_memory, sid)
        if meta is not None and meta.role == "standard" and meta.status == "archived" and l2:
            found.append(ChildL2(session_id=meta.id, label=meta.label, l2=l2))
    return found


def check_integration(
    result: object,
    children: Sequence[ChildL2],
    main_id: str,
) -> IntegrationResult:
    """Validate an integrate function's answer and keep only insights for the given children."""
    if isinstance(result, Mapping):
        try:
            result = IntegrationResult.model_validate(dict(result))
        except ValueError as exc:
            raise IntegrationError(
                f"The integrate function returned an invalid mapping: {exc}", session_id=main_id
            ) from None
    if not isinstance(result, IntegrationResult):
        raise IntegrationError(
            f"The integrate function returned {type(result).__name__}, "
            "expected IntegrationResult(synthesis=..., insights={...}).",
            session_id=main_id,
        )
    if not result.synthesis.strip():
        raise IntegrationError("The integrate function returned an empty synthesis.")
    allowed = {c.session_id for c in children}
    insights = {
        sid: storable(text)
        for sid, text in result.insights.items()
        if sid in allowed and text.strip()
    }
    return IntegrationResult(synthesis=storable(result.synthesis), insights=insights)


def _archived_ids(value: Iterable[str]) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise InvalidInputError(
            f"include_archived must be a list of session ids, got {value!r:.80}."
        )
    return [check_id(sid) for sid in value]  # `archived_l2s` reads each once


class MainOptions(CoreOptions, total=False):
    """How a `MainSession` object runs (nothing of it is stored): the options of `create`
    and `load`.

    Attributes:
        model: the chat model of its turns, or its name (`"openai:gpt-4o-mini"`, built by
            LangChain's `init_chat_model` before anything is stored).
        tools: the tools bound to that model.
        integrate_fn: how `integrate` makes the synthesis and insights (`llm_integrator`).
        compression: when and how a long history is summarised in prompts.
    """

    integrate_fn: IntegrateFn | None


def _load_flow(storage: MainStorage, session_id: str | None) -> Flow[SessionMeta]:
    if session_id is None:
        found = yield Storage(MainStorage.get_main_session)
        if found is None:
            raise MainSessionNotFoundError(storage.tree_id)
        session_id = found.id
    else:
        found = yield Storage(MainStorage.get_session, check_id(session_id))
    return check_loaded(found, session_id, "main")


class MainSession(SessionBase):
    """The root session of a tree. Create with `MainSession.create`, reopen with `load`."""

    role = "main"

    def __init__(
        self,
        meta: SessionMeta,
        storage: MainStorage,
        *,
        integrate_fn: IntegrateFn | None = None,
        **options: Unpack[CoreOptions],
    ) -> None:
        super().__init__(meta, storage, **options)
        self._main_storage = storage
        self._integrate_fn = integrate_fn

    @property
    def storage(self) -> MainStorage:
        return self._main_storage

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        storage: MainStorage,
        *,
        label: str = "Main Session",
        system_prompt: str | None = None,
        id: str | None = None,
        **options: Unpack[MainOptions],
    ) -> MainSession:
        """Create the tree's main session and its root TopologyNode, atomically; `options`
        are how the object runs (`MainOptions`).

        Raises:
            MainSessionExistsError: the tree already has a main session.
        """
        meta = new_meta("main", label, (), None, id)
        return run(cls._create_flow(storage, meta, system_prompt, dict(options)), storage)

    @classmethod
    async def acreate(
        cls,
        storage: MainStorage,
        *,
        label: str = "Main Session",
        system_prompt: str | None = None,
        id: str | None = None,
        **options: Unpack[MainOptions],
    ) -> MainSession:
        """Async twin of `create`."""
        meta = new_meta("main", label, (), None, id)
        return await arun(cls._create_flow(storage, meta, system_prompt, dict(options)), storage)

    def _store_flow(self, prompt: str | None) -> Flow[None]:
        """The main session and its root TopologyNode, in the tree that has none."""
        existing = yield Storage(MainStorage.get_main_session)
        if existing is not None:
            raise MainSessionExistsError(existing.id)
        yield from super()._store_flow(prompt)
        label = self._meta.label
        yield Storage(MainStorage.put_node, TopologyNode(id=self._id, parent_id=None, label=label))

    @classmethod
    def load(
        cls, storage: MainStorage, *, session_id: str | None = None, **options: Unpack[MainOptions]
    ) -> MainSession:
        """Open the tree's main session (or the main session with `session_id`).

        Raises:
            MainSessionNotFoundError: the tree has no main session.
            SessionNotFoundError: no session has `session_id`.
        """
        return cls(run(_load_flow(storage, session_id), storage), storage, **options)

    @classmethod
    async def aload(
        cls, storage: MainStorage, *, session_id: str | None = None, **options: Unpack[MainOptions]
    ) -> MainSession:
        """Async twin of `load`."""
        return cls(await arun(_load_flow(storage, session_id), storage), storage, **options)

    # -- context ----------------------------------------------------------------------------
    def _blocks(self, meta: SessionMeta, parts: ContextParts) -> list[str | None]:
        return [synthesis_block(parts.extra) if parts.extra else None]

    # -- synthesis and integration ----------------------------------------------------------
    def synthesis(self) -> str | None:
        """What the last integration produced."""
        return self._storage.get_memory(self._id)

    async def asynthesis(self) -> str | None:
        return await self._storage.aget_memory(self._id)

    def _fn_error(self, exc: Exception) -> IntegrationError:
        return IntegrationError(
            f"Integration failed: {type(exc).__name__}: {exc}", session_id=self._id
        )

    def integrate(
        self, fn: IntegrateFn | None = None, *, include_archived: Iterable[str] = ()
    ) -> IntegrationResult:
        """Integrate the L2 of the active children into a synthesis and insights.

        The synthesis and every insight are written in one transaction; insights addressed
        to sessions that were not among the inputs, or that were archived while the
        function ran, are dropped. Returns what was written.

        Archived sessions bring their L2 too when they are pending (`FINAL_L2S_KEY`: the
        final L2 of a branch a scheduled consolidation on archive wrote, which would
        otherwise never reach a synthesis) or named in `include_archived`. They get no
        insight; the ids of sessions that are not archived (or have no L2) are ignored.

        Of integrations that overlap (this one and a scheduled one, or one in another
        process), the first to finish is stored; one that finishes after another was stored
        since it began stores nothing (it read a synthesis that is no longer the stored one).

        Raises:
            NothingToIntegrateError: no child has an L2 to read.
            IntegrationSupersededError: another integration was stored since this one began.
            IntegrationError: the integrate function failed or returned garbage.
        """
        result: IntegrationResult = run(
            self._integrate_flow(fn, include_archived), self._main_storage
        )
        return result

    async def aintegrate(
        self, fn: IntegrateFn | None = None, *, include_archived: Iterable[str] = ()
    ) -> IntegrationResult:
        """Async twin of `integrate`."""
        flow = self._integrate_flow(fn, include_archived)
        result: IntegrationResult = await arun(flow, self._main_storage)
        return result

    def _integrate_flow(
        self, fn: IntegrateFn | None, include_archived: Iterable[str]
    ) -> Flow[IntegrationResult]:
        chosen = chosen_fn(
            fn,
            self._integrate_fn,
            "The main session has no integrate function: pass fn= or create it with "
            "integrate_fn= (e.g. llm_integrator(model)).",
        )
        extra, sid = _archived_ids(include_archived), self._id
        self._active((yield from self._meta_flow()), "integration")
        version, pending = yield from integration_read()
        active: list[ChildL2] = yield Storage(MainStorage.get_all_session_l2s)
        archived = yield from archived_l2s([*extra, *pending])
        if pending and not active and not archived:
            yield Atomic(forget_final(pending))  # none of them has an L2 to bring
        children = [*active, *archived]
        if not children:
            raise NothingToIntegrateError(
                "No active child session has an L2 yet: consolidate some sessions first."
            )
        with failing_as(self._fn_error):
            synthesis = yield Storage(MainStorage.get_memory, sid)
            raw = yield Call(call_sync, call_async, (chosen, list(children), synthesis))
        result = check_integration(raw, active, sid)  # no insight to an archived session
        written: dict[str, str] = yield Atomic(self._write_flow(result, version, pending))
        return IntegrationResult(synthesis=result.synthesis, insights=written)

    def _write_flow(
        self, result: IntegrationResult, version: int, brought: Sequence[str]
    ) -> Flow[dict[str, str]]:
        """The synthesis and the insights to sessions still active, in one transaction
        (unless another integration was stored meanwhile: `integration_stored`)."""
        yield from integration_stored(self._id, version, brought)
        yield Storage(MainStorage.put_memory, self._id, result.synthesis)
        written = {}
        for session_id, insight in result.insights.items():
            meta = yield Storage(MainStorage.get_session, session_id)
            if meta is not None and meta.status == "active":  # not removed nor archived
                yield Storage(MainStorage.put_insight, session_id, insight)
                written[session_id] = insight
        return written

    # -- refused ----------------------------------------------------------------------------
    def fork(self, *args: Any, **kwargs: Any) -> NoReturn:
        """The main session does not fork; use `StelloAgent.fork(main_id, ...)`."""
        raise MainSessionForkError(
            "The main session does not fork. Create children with StelloAgent.fork() "
            "(the orchestration layer) or Session.create()."
        )

    async def afork(self, *args: Any, **kwargs: Any) -> NoReturn:
        """The main session does not fork; use `StelloAgent.afork(main_id, ...)`."""
        self.fork()
