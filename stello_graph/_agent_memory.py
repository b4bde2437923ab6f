"""`StelloAgent`'s memory operations: consolidate, integrate, profiles and skills.

Each runs the same operation function as the graph's node for it (`stello_graph.nodes.ops`,
`stello_graph.nodes.tree`), without a graph run: no checkpoint rows, no second graph.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, overload

from stello_graph._event_log import EventRecorder
from stello_graph._events_mux import EventMux
from stello_graph._flow import Atomic, Flow, Storage, arun, run
from stello_graph._validate import check_id
from stello_graph.errors import (
    InvalidInputError,
    SessionNotFoundError,
)
from stello_graph.models import (
    IntegrationResult,
    SessionMeta,
    TreeIntegration,
)
from stello_graph.nodes.deps import StelloRuntime
from stello_graph.nodes.forking import SKILLS_KEY
from stello_graph.nodes.ops import arun_integrate, run_integrate
from stello_graph.nodes.scheduling import (
    aconsolidate_now,
    consolidate_now,
)
from stello_graph.nodes.tree import arun_tree, run_tree
from stello_graph.profiles import ForkProfile
from stello_graph.skills import check_allow_list
from stello_graph.storage import MainStorage

__all__ = ["IntegrationMode"]


IntegrationMode = Literal["flat", "tree"]


def _check_mode(mode: object) -> IntegrationMode:
    if mode not in ("flat", "tree"):
        raise InvalidInputError(f"mode must be 'flat' or 'tree', got {mode!r}.")
    return mode


def _integration(raw: Mapping[str, Any]) -> IntegrationResult | TreeIntegration:
    fields = {k: v for k, v in raw.items() if k != "mode"}
    if raw.get("mode") == "tree":
        return TreeIntegration.model_validate(fields)
    return IntegrationResult.model_validate(fields)


def _batch(session_ids: Iterable[str], concurrency: object) -> Flow[tuple[list[str], int]]:
    """The distinct ids of a batch, in order, and its concurrency, both checked: an id that
    can never be consolidated (no session, the main session) is refused before any session is.

    An archived session is not refused here: like a failing consolidate function, it fails
    on its own, and the rest of the batch is still consolidated."""
    if isinstance(session_ids, str):
        raise InvalidInputError("session_ids must be an iterable of ids, not one str.")
    if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
        raise InvalidInputError(f"concurrency must be a positive int, got {concurrency!r}.")
    ids = list(dict.fromkeys(check_id(sid) for sid in session_ids))
    for sid in ids:
        meta: SessionMeta | None = yield Storage(MainStorage.get_session, sid)
        if meta is None:
            raise SessionNotFoundError(sid)
        if meta.role == "main":
            raise InvalidInputError(
                f"Session {sid!r} is the main session: it integrates; it does not consolidate. "
                "Leave it out of session_ids."
            )
    return ids, concurrency


def _batch_result(ids: list[str], outcomes: list[Any]) -> dict[str, str | None]:
    """The L2 of each id, or the first failure raised (a note counts the others)."""
    failures = [o for o in outcomes if isinstance(o, BaseException)]
    if failures:
        if len(failures) > 1:
            failures[0].add_note(f"{len(failures) - 1} other session(s) of the batch failed.")
        raise failures[0]
    return dict(zip(ids, outcomes, strict=True))


class _Memory:
    """Consolidation, integration, profiles and skills of a `StelloAgent` (a part of it)."""

    storage: MainStorage
    _runtime: StelloRuntime
    _mux: EventMux
    _recorder: EventRecorder

    def consolidate(self, session_id: str) -> str | None:
        """Consolidate one session now (L3 -> L2); return its L2.

        The same operation as the graph's `consolidate` node and each of `consolidate_many`.
        """
        sid = check_id(session_id)
        with self._mux.quiet():
            l2 = consolidate_now(self._runtime, sid)
        self._recorder.settle()
        return l2

    async def aconsolidate(self, session_id: str) -> str | None:
        """Async twin of `consolidate`."""
        sid = check_id(session_id)
        with self._mux.quiet():
            return await aconsolidate_now(self._runtime, sid)

    def consolidate_many(
        self, session_ids: Iterable[str], *, concurrency: int = 8
    ) -> dict[str, str | None]:
        """Consolidate several sessions, up to `concurrency` at a time (their model calls
        overlap, so 100 sessions take about `100 / concurrency` model latencies).

        Like scheduled consolidations, each runs outside the graph (a graph run per session
        would cost more than the rest of its work) and emits a `consolidated` event. Every
        session is attempted, each in its own transaction. Returns each one's L2, in
        the order given (duplicates once).

        Raises:
            InvalidInputError: a bad id or `concurrency`, or the main session's id;
                checked for every id before any session is consolidated, so nothing was.
            SessionNotFoundError: an id of no session; checked likewise, nothing was
                consolidated.
            StelloError: the first failure (an archived session, a consolidate function
                that failed, ...), in the order given, once all sessions were attempted
                (the others' L2 are stored); a note counts the other failures.
        """
        ids, workers = run(_batch(session_ids, concurrency), self.storage)
        with ThreadPoolExecutor(min(workers, len(ids)) or 1, thread_name_prefix="stello") as pool:
            futures = [pool.submit(consolidate_now, self._runtime, sid) for sid in ids]
        return _batch_result(ids, [f.exception() or f.result() for f in futures])

    async def aconsolidate_many(
        self, session_ids: Iterable[str], *, concurrency: int = 8
    ) -> dict[str, str | None]:
        """Async twin of `consolidate_many`."""
        ids, workers = await arun(_batch(session_ids, concurrency), self.storage)
        gate = asyncio.Semaphore(workers)

        async def one(sid: str) -> str | None:
            async with gate:
                return await aconsolidate_now(self._runtime, sid)

        done = await asyncio.gather(*(one(sid) for sid in ids), return_exceptions=True)
        return _batch_result(ids, list(done))

    @overload
    def integrate(self, mode: Literal["flat"] = "flat") -> IntegrationResult: ...
    @overload
    def integrate(self, mode: Literal["tree"]) -> TreeIntegration: ...

    def integrate(self, mode: IntegrationMode = "flat") -> IntegrationResult | TreeIntegration:
        """Integrate now.

        `"flat"`: the main session reads the L2 of every active session and writes the
        synthesis and insights. `"tree"`: bottom-up, level by level; each internal node
        integrates only its direct children's L2 into a summary of its subtree (what its
        parent then sees for that branch) and pushes insights one level down; siblings of a
        level run in parallel. Returns a `TreeIntegration` with one result per node.

        Both modes are all or nothing: the results are written in one transaction at the end,
        so a failed integration (at any level, in tree mode) leaves everything as it was.
        """
        integrate = run_tree if _check_mode(mode) == "tree" else run_integrate
        with self._mux.quiet():
            done = _integration(integrate(self._runtime)["integration"])
        self._recorder.settle()
        return done

    @overload
    async def aintegrate(self, mode: Literal["flat"] = "flat") -> IntegrationResult: ...
    @overload
    async def aintegrate(self, mode: Literal["tree"]) -> TreeIntegration: ...

    async def aintegrate(
        self, mode: IntegrationMode = "flat"
    ) -> IntegrationResult | TreeIntegration:
        """Async twin of `integrate`."""
        integrate = arun_tree if _check_mode(mode) == "tree" else arun_integrate
        with self._mux.quiet():
            return _integration((await integrate(self._runtime))["integration"])

    # -- profiles and skills ----------------------------------------------------------------
    def register_profile(self, profile: ForkProfile) -> None:
        """Register (or replace) a fork profile; models see it in `create_session`."""
        self._runtime.register_profile(profile)

    async def aregister_profile(self, profile: ForkProfile) -> None:
        """Async twin of `register_profile` (profiles live in memory: nothing is awaited)."""
        self.register_profile(profile)

    def skills_of(self, session_id: str) -> list[str]:
        """The skills a session may activate (its allow-list resolved).

        Raises:
            SessionNotFoundError: there is no such session (the allow-list is the session's,
                so a session without a node has one too).
        """
        return run(self._skills_flow(check_id(session_id)), self.storage)

    async def askills_of(self, session_id: str) -> list[str]:
        """Async twin of `skills_of`."""
        return await arun(self._skills_flow(check_id(session_id)), self.storage)

    def _skills_flow(self, sid: str) -> Flow[list[str]]:
        if (yield Storage(MainStorage.get_session, sid)) is None:
            raise SessionNotFoundError(sid)
        allowed = (yield Storage(MainStorage.get_settings, sid)).get(SKILLS_KEY)
        return list(self._runtime.skill_map) if allowed is None else list(allowed)

    def set_skills(self, session_id: str, skills: Sequence[str] | None) -> None:
        """Replace a session's skills allow-list (`None`: every skill; `[]`: none)."""
        run(self._skills_write(session_id, skills), self.storage)

    async def aset_skills(self, session_id: str, skills: Sequence[str] | None) -> None:
        """Async twin of `set_skills`."""
        await arun(self._skills_write(session_id, skills), self.storage)

    def _skills_write(self, session_id: str, skills: Sequence[str] | None) -> Flow[None]:
        sid = check_id(session_id)
        allowed = (
            None if skills is None else check_allow_list(skills, list(self._runtime.skill_map))
        )
        yield Atomic(_settings_flow(sid, {SKILLS_KEY: allowed}))
        self._runtime.refresh(sid)


def _settings_flow(sid: str, changes: dict[str, Any]) -> Flow[None]:
    settings = yield Storage(MainStorage.get_settings, sid)
    yield Storage(MainStorage.put_settings, sid, {**settings, **changes})
