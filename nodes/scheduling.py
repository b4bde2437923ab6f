"""What the `Schedule` triggers, and the background jobs it runs.

Triggers only queue jobs on the `Scheduler` (worker threads); they never wait for them, so a
turn is never slowed down by the consolidation or integration it triggers.

Due work is derived from stored state, so it survives a restart and is seen by every worker
on the tree (`recover` scans for it when the scheduler starts, then every
`Schedule.recover_every` seconds):

* a session is due for consolidation when its own user turns since its L2's cursor reach
  `consolidate_every_n_turns` (`SessionDigest.turns` / `stale_turns`), or when it is archived
  with turns its L2 does not cover yet (with `consolidate_on_archive`);
* the tree is due for integration when a consolidation asked for one
  (`integrate_after_consolidate`) that has not run yet, when an archived session's final L2
  awaits one, or when the tree's user turns since the last scheduled integration reach
  `integrate_every_n_turns`. Those requests and cursors are the tree global
  `stello:scheduled_integration`.

A job runs under its claim (`stello_graph._claims`), and checks once claimed that it is still
due, so two workers that found the same work due run it once.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from stello_graph._failures import JobKind
from stello_graph._flow import Call, Flow, Storage, arun, run
from stello_graph.errors import (
    IntegrationSupersededError,
    InvalidInputError,
    NothingToIntegrateError,
)
from stello_graph.events import emit
from stello_graph.main_session import MainSession
from stello_graph.models import IntegrationResult, SessionMeta
from stello_graph.nodes._store import (
    DeleteIf,
    StoreWrite,
    awrite_store,
    current_store,
    job_store,
    write_store,
)
from stello_graph.nodes._store import namespace as store_namespace
from stello_graph.schedule import Job
from stello_graph.session import Session
from stello_graph.storage import MainStorage

TREE_TURNS_KEY = "stello:tree_turns"
"""The tree's user turns, counted when the schedule integrates every N of them (kept by
the commit node, `stello_graph.nodes.turn`)."""

if TYPE_CHECKING:
    from stello_graph.nodes.deps import StelloDeps

__all__ = [
    "aconsolidate_now",
    "aforget_insight",
    "after_turn",
    "aintegrate_flat",
    "aon_switch",
    "aunpublish",
    "consolidate_now",
    "forget_insight",
    "integrate_flat",
    "integrate_now",
    "on_archive",
    "on_switch",
    "published",
    "recover",
    "unpublish",
]

INTEGRATION_KEY = "stello:scheduled_integration"
"""The tree global of scheduled integrations: `requested` (integrations asked for by
consolidations), `done` (how many of those requests ran) and `tree_turns` (the tree's turn
count when the last scheduled integration started)."""


_PUBLISHED = ("l2", "synthesis", "subtree", "insights")
"""What is published to the store under a session's id."""


def _unpublished(deps: StelloDeps, session_id: str) -> list[StoreWrite]:
    return [(store_namespace(deps, kind), session_id, None) for kind in _PUBLISHED]


def unpublish(deps: StelloDeps, session_id: str) -> None:
    """Delete from the store what was published of a (removed) session."""
    write_store(deps, _unpublished(deps, session_id), session_id)


async def aunpublish(deps: StelloDeps, session_id: str) -> None:
    """Async twin of `unpublish`."""
    await awrite_store(deps, _unpublished(deps, session_id), session_id)


def _forgotten(deps: StelloDeps, session_id: str, insight: str) -> list[StoreWrite]:
    return [(store_namespace(deps, "insights"), session_id, DeleteIf("insight", insight))]


def forget_insight(deps: StelloDeps, session_id: str, insight: str | None) -> None:
    """A turn consumed `insight`: delete it from the store, unless a newer one replaced it
    meanwhile."""
    if insight:
        write_store(deps, _forgotten(deps, session_id, insight), session_id)


async def aforget_insight(deps: StelloDeps, session_id: str, insight: str | None) -> None:
    """Async twin of `forget_insight` (a sync-only store runs in a worker thread)."""
    if insight:
        await awrite_store(deps, _forgotten(deps, session_id, insight), session_id)


def published(
    deps: StelloDeps, namespace: tuple[str, ...], key: str, value: dict[str, object]
) -> StoreWrite:
    """The store write that mirrors a memory write to the LangGraph store (`nodes._store`)."""
    return (store_namespace(deps, *namespace), key, dict(value))


def consolidate_now(deps: StelloDeps, session_id: str, *, archived_ok: bool = False) -> str | None:
    """Consolidate one session with the deps' function; emit and publish the new L2."""
    return run(_consolidate(deps, session_id, archived_ok), deps.storage)


async def aconsolidate_now(deps: StelloDeps, session_id: str) -> str | None:
    """Async twin of `consolidate_now` (active sessions only)."""
    return await arun(_consolidate(deps, session_id, False), deps.storage)


def _consolidate(deps: StelloDeps, session_id: str, archived_ok: bool) -> Flow[str | None]:
    session = yield Call(deps.session, deps.asession, (session_id,))
    if not isinstance(session, Session):
        raise InvalidInputError("The main session integrates; it does not consolidate.")
    l2: str | None = yield Call(
        partial(session.consolidate, archived_ok=archived_ok),
        partial(session.aconsolidate, archived_ok=archived_ok),
        (deps.consolidate_fn,),
    )
    if l2 is not None:
        emit(deps.bus, "consolidated", session_id, l2=l2)
        meta: SessionMeta = yield Call(lambda: session.meta, session.ameta)
        writes = [published(deps, ("l2",), session_id, {"l2": l2, "label": meta.label})]
        yield Call(write_store, awrite_store, (deps, writes, session_id))
    return l2


def announce_integration(
    deps: StelloDeps,
    node_id: str,
    result: IntegrationResult,
    kind: str = "synthesis",
    *,
    tree: bool = False,
) -> list[StoreWrite]:
    """Emit an integration's events; return what it publishes to the store, each write keyed
    by the session it is for. `tree`: one node's result in a tree integration (its events
    say so, and who pushed each insight); `kind`: what its synthesis is published as."""
    mode: dict[str, Any] = {"mode": "tree"} if tree else {}
    by: dict[str, Any] = {"by": node_id} if tree else {}
    emit(deps.bus, "integrated", node_id, synthesis=result.synthesis,
         insights=len(result.insights), **mode)  # fmt: skip
    writes = [published(deps, (kind,), node_id, {"synthesis": result.synthesis})]
    for session_id, insight in result.insights.items():
        emit(deps.bus, "insight_pushed", session_id, insight=insight, **by)
        writes.append(published(deps, ("insights",), session_id, {"insight": insight}))
    return writes


def integrate_flat(deps: StelloDeps, main: MainSession) -> IntegrationResult:
    """Integrate the tree (flat) with the deps' function and announce it (sessions archived
    since the last integration bring their final L2 too: see `on_archive`)."""
    result = main.integrate(deps.integrate_function())
    write_store(deps, announce_integration(deps, main.id, result), main.id)
    return result


async def aintegrate_flat(deps: StelloDeps, main: MainSession) -> IntegrationResult:
    """Async twin of `integrate_flat`."""
    result = await main.aintegrate(deps.integrate_function())
    await awrite_store(deps, announce_integration(deps, main.id, result), main.id)
    return result


def integrate_now(deps: StelloDeps) -> IntegrationResult | None:
    """Integrate the tree (flat) with the deps' function; `None` if nothing has an L2 yet
    or another integration was stored while it ran (which stands for it)."""
    meta = deps.storage.get_main_session()
    if meta is None:
        return None
    main = deps.session(meta.id)
    assert isinstance(main, MainSession)
    try:
        return integrate_flat(deps, main)
    except NothingToIntegrateError:
        return None
    except IntegrationSupersededError:  # another one was stored meanwhile
        if deps.final_l2s():  # final L2s it brought and that one did not: for the next
            _queue_integration(deps)
        return None


def _integration_state(deps: StelloDeps) -> dict[str, int]:
    found: Any = deps.storage.get_global(INTEGRATION_KEY)
    found = found if isinstance(found, dict) else {}
    return {k: int(found.get(k) or 0) for k in ("requested", "done", "tree_turns")}


def _consolidate_job(
    deps: StelloDeps, session_id: str, archived_ok: bool = False, seen: int | None = None
) -> None:
    """Consolidate (claimed by the scheduler); `seen`: the L2 cursor the scan found due,
    skipped when another worker consolidated since."""
    if seen is not None and deps.storage.get_memory_through(session_id) != seen:
        return
    consolidate_now(deps, session_id, archived_ok=archived_ok)
    schedule = deps.schedule
    if schedule is not None and schedule.integrate_after_consolidate:
        if archived_ok:  # consolidated on archive: its final L2 goes to the integration
            deps.hold_final_l2(session_id)
        with deps.storage.transaction():  # stored, so that a restart still runs it
            state = _integration_state(deps)
            deps.storage.put_global(INTEGRATION_KEY, {**state, "requested": state["requested"] + 1})
        _queue_integration(deps)


def _integration_due(deps: StelloDeps, after: int | None) -> tuple[dict[str, int], int] | None:
    """The scheduled integrations' state and the tree's turn count, when an integration is
    due (`after`: the tree turn that asked for it); else `None`."""
    schedule = deps.schedule
    every = schedule.integrate_every_n_turns if schedule is not None else None
    state = _integration_state(deps)
    tree = int(deps.storage.get_global(TREE_TURNS_KEY) or 0)
    due = (
        state["requested"] > state["done"]
        or (after is not None and state["tree_turns"] < after)
        or (every is not None and tree - state["tree_turns"] >= every)
        or bool(deps.final_l2s())
    )
    return (state, tree) if due else None


def _integrate_job(deps: StelloDeps, after: int | None = None) -> None:
    """Integrate (claimed by the scheduler) if still due; then store what it covered."""
    if (due := _integration_due(deps, after)) is None:
        return  # another worker integrated since it was asked for
    state, tree = due
    integrate_now(deps)
    with deps.storage.transaction():
        now = _integration_state(deps)
        done = max(now["done"], state["requested"])
        deps.storage.put_global(
            INTEGRATION_KEY, {**now, "done": done, "tree_turns": max(now["tree_turns"], tree)}
        )


def _queue(deps: StelloDeps, kind: JobKind, session_id: str | None, job: Job) -> None:
    """Submit `job` to the scheduler, run with the store of the run that queues it (a worker
    thread has no run)."""
    if deps.scheduler is None:
        return
    store = current_store(deps)

    def in_store() -> object:
        with job_store(store):
            return job()

    deps.scheduler.submit(kind, session_id, in_store)


def _queue_consolidation(
    deps: StelloDeps, session_id: str, archived_ok: bool = False, seen: int | None = None
) -> None:
    job = partial(_consolidate_job, deps, session_id, archived_ok, seen)
    _queue(deps, "consolidate", session_id, job)


def _queue_integration(deps: StelloDeps, after: int | None = None) -> None:
    _queue(deps, "integrate", None, partial(_integrate_job, deps, after))


def after_turn(deps: StelloDeps, session_id: str, role: str, turns: int, tree_turns: int) -> None:
    """After a committed turn: consolidate / integrate on the schedule's exact turn counts."""
    schedule = deps.schedule
    if schedule is None:
        return
    every = schedule.consolidate_every_n_turns
    if every and role == "standard" and turns > 0 and turns % every == 0:
        _queue_consolidation(deps, session_id)
    every_tree = schedule.integrate_every_n_turns
    if every_tree and tree_turns > 0 and tree_turns % every_tree == 0:
        _queue_integration(deps, after=tree_turns)


def recover(deps: StelloDeps) -> None:
    """Queue the due work stored in the tree (see the module's docstring): what turns of
    other workers made due, and what a stopped process never ran. One read of the
    sessions' digests, then a point read per due session."""
    schedule = deps.schedule
    if schedule is None or deps.scheduler is None:
        return
    every = schedule.consolidate_every_n_turns
    for digest in deps.storage.list_session_digests():
        if digest.role != "standard":
            continue
        own = min(digest.turns, digest.stale_turns)  # a fork's inherited turns do not count
        archived = digest.status == "archived"
        if archived and schedule.consolidate_on_archive and own > 0:
            seen = deps.storage.get_memory_through(digest.id)
            _queue_consolidation(deps, digest.id, archived_ok=True, seen=seen)
        elif not archived and every is not None and own >= every:
            _queue_consolidation(deps, digest.id, seen=deps.storage.get_memory_through(digest.id))
    if _integration_due(deps, None) is not None:
        _queue_integration(deps)


def on_switch(deps: StelloDeps, previous: str | None, current: str) -> None:
    """The user moved from `previous` to `current`: consolidate `previous` if scheduled."""
    run(_switched(deps, previous, current), deps.storage)


async def aon_switch(deps: StelloDeps, previous: str | None, current: str) -> None:
    """Async twin of `on_switch` (its read never runs on the event loop)."""
    await arun(_switched(deps, previous, current), deps.storage)


def _switched(deps: StelloDeps, previous: str | None, current: str) -> Flow[None]:
    schedule = deps.schedule
    if schedule is None or not schedule.consolidate_on_switch or previous in (None, current):
        return
    meta: SessionMeta | None = yield Storage(MainStorage.get_session, previous)
    if meta is not None and meta.role == "standard" and meta.status == "active":
        _queue_consolidation(deps, meta.id)


def on_archive(deps: StelloDeps, session_id: str) -> None:
    """A session was archived: consolidate what it has not consolidated yet, if scheduled.

    The session is archived first (it refuses work at once); its consolidation runs in the
    background, and the integration that follows it (with `integrate_after_consolidate`)
    includes the session's final L2 although the session is no longer active.
    """
    schedule = deps.schedule
    if schedule is not None and schedule.consolidate_on_archive:
        _queue_consolidation(deps, session_id, archived_ok=True)
