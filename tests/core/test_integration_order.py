"""Of overlapping integrations only one is stored, and an archived branch's final L2 pending
for an integration (`FINAL_L2S_KEY`) reaches a stored synthesis.

Two integrations overlap when one is called while another (scheduled, or in another process)
waits on its integrate function. The first to finish is stored; the other then finds that an
integration was stored since it began and stores nothing (`IntegrationSupersededError`)
instead of writing a synthesis made from the one it read over the newer one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from stello_graph import (
    ChildL2,
    IntegrationResult,
    IntegrationSupersededError,
    MainSession,
    NothingToIntegrateError,
    Session,
    StelloAgent,
)
from stello_graph.main_session import FINAL_L2S_KEY
from stello_graph.storage import MainStorage
from stello_graph.testing import ScriptedChatModel
from tests.conftest import Api


def joined(name: str) -> Callable[[list[ChildL2], str | None], IntegrationResult]:
    """An integrate function whose synthesis names it and lists the L2s it read."""

    def integrate(children: list[ChildL2], current: str | None) -> IntegrationResult:
        return IntegrationResult(
            synthesis=f"{name}: " + " + ".join(c.l2 for c in children),
            insights={c.session_id: f"from {name}" for c in children},
        )

    return integrate


class Held:
    """An integrate function that waits, once called, until it is let go."""

    def __init__(self, name: str) -> None:
        self.inner = joined(name)
        self.called, self.go = threading.Event(), threading.Event()

    def __call__(self, children: list[ChildL2], current: str | None) -> IntegrationResult:
        self.called.set()
        assert self.go.wait(30)
        return self.inner(children, current)


def archive_with_final_l2(storage: MainStorage, session: Session, l2: str) -> None:
    """What a scheduled consolidation on archive leaves: the final L2, and the note."""
    storage.put_memory(session.id, l2)
    session.archive()
    storage.put_global(FINAL_L2S_KEY, [session.id])


def tree(storage: MainStorage) -> tuple[MainSession, Session, Session]:
    main = MainSession.create(storage)
    live, leaving = Session.create(storage, label="Live"), Session.create(storage, label="Leaving")
    storage.put_memory(live.id, "live")
    storage.put_memory(leaving.id, "leaving")
    return main, live, leaving


def test_an_integration_that_finishes_after_another_was_stored_is_dropped(
    main_storage: MainStorage,
) -> None:
    """The case that lost a branch: the first integration read before the branch was
    archived, the second brought its final L2, was stored and cleared the note; the first
    one, stored last, put a synthesis without it back for good."""
    main, live, leaving = tree(main_storage)
    early = Held("early")
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(main.integrate, early)
        assert early.called.wait(30)
        archive_with_final_l2(main_storage, leaving, "leaving, final")
        later = main.integrate(joined("later"))
        early.go.set()
        with pytest.raises(IntegrationSupersededError) as caught:
            pending.result(30)
    assert caught.value.session_id == main.id
    assert later.synthesis == "later: live + leaving, final"
    assert main.synthesis() == later.synthesis
    assert main_storage.get_insight(live.id) == "from later"
    assert main_storage.get_global(FINAL_L2S_KEY) == []


def test_integrations_one_after_another_are_all_stored(main_storage: MainStorage) -> None:
    main, _, _ = tree(main_storage)
    late = Held("late")
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(main.integrate, late)
        assert late.called.wait(30)
        late.go.set()
        result = pending.result(30)
    assert main.synthesis() == result.synthesis == "late: live + leaving"
    after = main.integrate(joined("next"))  # began after it was stored: stored too
    assert main.synthesis() == after.synthesis


def test_a_dropped_integration_keeps_the_final_l2_it_read_pending(
    main_storage: MainStorage,
) -> None:
    """Both brought the archived branch (it was pending as each began); the one stored
    cleared the note; nothing is pending after."""
    main, _, leaving = tree(main_storage)
    archive_with_final_l2(main_storage, leaving, "leaving, final")
    early = Held("early")
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(main.integrate, early)
        assert early.called.wait(30)
        later = main.integrate(joined("later"))
        early.go.set()
        with pytest.raises(IntegrationSupersededError):
            pending.result(30)
    assert later.synthesis == "later: live + leaving, final"
    assert main.synthesis() == later.synthesis
    assert main_storage.get_global(FINAL_L2S_KEY) == []


async def test_a_called_integration_brings_the_pending_final_l2s(api: Api) -> None:
    main, live, leaving = tree(api.storage)
    archive_with_final_l2(api.storage, leaving, "leaving, final")
    fn = joined("called")
    result = main.integrate(fn) if api.mode == "sync" else await main.aintegrate(fn)
    assert result.synthesis == "called: live + leaving, final"
    assert result.insights == {live.id: "from called"}  # none to the archived branch
    assert api.storage.get_global(FINAL_L2S_KEY) == []
    again = main.integrate(fn) if api.mode == "sync" else await main.aintegrate(fn)
    assert again.synthesis == "called: live"


async def test_pending_notes_without_an_l2_are_forgotten(api: Api) -> None:
    main = MainSession.create(api.storage)
    bare = Session.create(api.storage, label="Bare")
    bare.archive()
    api.storage.put_global(FINAL_L2S_KEY, [bare.id])
    with pytest.raises(NothingToIntegrateError):
        main.integrate(joined("x")) if api.mode == "sync" else await main.aintegrate(joined("x"))
    assert api.storage.get_global(FINAL_L2S_KEY) == []


def test_a_failed_integration_keeps_the_note(main_storage: MainStorage) -> None:
    main, _, leaving = tree(main_storage)
    archive_with_final_l2(main_storage, leaving, "leaving, final")

    def broken(children: list[ChildL2], current: str | None) -> IntegrationResult:
        raise RuntimeError("model down")

    with pytest.raises(Exception, match="model down"):
        main.integrate(broken)
    assert main_storage.get_global(FINAL_L2S_KEY) == [leaving.id]
    assert main.synthesis() is None


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_tree_mode_brings_the_pending_final_l2s_and_keeps_the_order(
    tmp_path: Any, mode: str
) -> None:
    """Tree mode reads the count of stored integrations with its plan: the root reads the
    pending final L2s, and a tree run during which a flat one was stored is dropped."""
    early = Held("tree")
    agent = StelloAgent(model=ScriptedChatModel(), storage=tmp_path / "t.db", integrate_fn=early)
    try:
        storage = agent.storage
        live = agent.fork(agent.main_session_id, "Live").id
        leaving = agent.fork(agent.main_session_id, "Leaving").id
        storage.put_memory(live, "live")
        storage.put_memory(leaving, "leaving, final")
        agent.archive(leaving)
        storage.put_global(FINAL_L2S_KEY, [leaving])
        early.go.set()
        done = agent.integrate("tree") if mode == "sync" else await agent.aintegrate("tree")
        assert done.results[agent.main_session_id].synthesis == "tree: live + leaving, final"
        assert storage.get_global(FINAL_L2S_KEY) == []

        early.go.clear()
        early.called.clear()
        main = MainSession.load(storage)
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(agent.integrate, "tree")
            assert early.called.wait(30)
            flat = main.integrate(joined("flat"))
            early.go.set()
            with pytest.raises(IntegrationSupersededError):
                pending.result(30)
        assert main.synthesis() == flat.synthesis == "flat: live"
    finally:
        early.go.set()
        agent.close()
