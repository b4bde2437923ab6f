"""Removing sessions leaves none of their text in the stored event log: their events keep
their cursors (a follower's cursor stays valid) and lose their details."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from stello_graph import StelloAgent
from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.events import StoredEvent
from stello_graph.inspector import PollingEventSource
from stello_graph.models import ChildL2, IntegrationResult, SessionMeta, TopologyNode
from stello_graph.testing import ScriptedChatModel
from tests._postgres import POSTGRES
from tests.conftest import Api

REMOVED = {"removed": True}


async def test_removed_sessions_events_keep_their_cursors_without_details(api: Api) -> None:
    for sid, parent in (("main", None), ("a", "main"), ("b", "a"), ("c", "main")):
        await api("put_session", SessionMeta(id=sid, label=sid, role="standard"))
        await api("put_node", TopologyNode(id=sid, parent_id=parent, label=sid))
    kept = await api("append_event", "consolidated", "c", {"l2": "c's text"})
    await api("append_event", "session_forked", "a", {"label": "a's label"})
    await api("append_event", "insight_pushed", "b", {"insight": "b's insight"})
    await api("append_event", "integrated", None, {"synthesis": "whole"})
    last = await api("append_event", "consolidated", "b", {"l2": "b's text"})
    assert await api("remove_node", "a", cascade=True) == ["a", "b"]
    events: list[StoredEvent] = await api("events_after", 0)
    assert [(e.cursor, e.type, e.session_id, e.data) for e in events[1:-1]] == [
        (kept + 1, "session_forked", "a", REMOVED),
        (kept + 2, "insight_pushed", "b", REMOVED),
        (kept + 3, "integrated", None, {"synthesis": "whole"}),
    ]
    assert (events[0].data, events[-1].cursor, events[-1].data) == (
        {"l2": "c's text"},
        last,
        REMOVED,
    )
    # the newest event was a removed session's: the next one still comes after it
    assert await api("append_event", "consolidated", "c") > last


async def test_a_removal_rolled_back_keeps_the_events(api: Api) -> None:
    await api("put_session", SessionMeta(id="a", label="a"))
    await api("put_node", TopologyNode(id="a", label="a"))
    await api("append_event", "consolidated", "a", {"l2": "kept"})

    async def undone() -> None:
        async with api.transaction():
            await api("remove_node", "a")
            raise RuntimeError("undo")

    with pytest.raises(RuntimeError):
        await undone()
    assert [e.data for e in await api("events_after", 0)] == [{"l2": "kept"}]


# -- an agent's events: forks, consolidations, insights of a subtree, then its removal ------
def _integrate(children: list[ChildL2], current: str | None) -> IntegrationResult:
    return IntegrationResult(
        synthesis="whole",  # the parent's own text: it stays with the parent
        insights={c.session_id: f"insight for {c.label}" for c in children},
    )


def _stored_payloads(database: Path | str) -> list[str]:
    """Every stored event's details, read from the database itself."""
    sql = "SELECT payload FROM stello_events"
    if isinstance(database, Path):
        with sqlite3.connect(database) as conn:
            return [row[0] for row in conn.execute(sql)]
    import psycopg

    with psycopg.connect(database) as conn:
        return [row[0] for row in conn.execute(sql)]


@pytest.fixture(params=["sqlite", *(["postgres"] if POSTGRES.wanted else [])])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    if request.param == "postgres":
        return POSTGRES.dsn_for(tmp_path)
    return tmp_path / "tree.db"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_no_text_of_a_removed_subtree_stays_in_the_event_log(
    database: Path | str, mode: str
) -> None:
    agent = StelloAgent(
        model=ScriptedChatModel(respond=lambda messages: f"re:{messages[-1].text}"),
        storage=database,
        consolidate_fn=lambda l2, records: " / ".join(r.text for r in records),
        integrate_fn=_integrate,
    )
    with agent:
        source = PollingEventSource(agent.storage)  # the inspector's `/api/events`
        source.events_after(0)
        kept = agent.fork(agent.main_session_id, "kept-label").id
        gone = agent.fork(agent.main_session_id, "gone-label").id
        below = agent.fork(gone, "below-label").id
        texts: dict[str, list[str]] = {kept: ["kept-label"], gone: ["gone-label"]}
        texts[below] = ["below-label"]
        for sid in (kept, gone, below):
            said = f"secret-{sid[:8]}"
            agent.turn(sid, said)
            agent.consolidate(sid)
            texts[sid].append(said)
        agent.integrate("tree")  # insights pushed into both subtrees
        agent.turn(below, "delivers its insight")
        follower = agent.follow_events()
        before = [e.as_dict() for e in follower.poll()]
        shown, _ = source.events_after(0)
        removed = texts[gone] + texts[below]
        assert all(any(t in str(before) for t in texts[sid]) for sid in texts)  # there, first
        assert any(t in str(shown) for t in removed)
        if mode == "sync":
            assert agent.remove(gone, cascade=True) == [gone, below]
        else:
            assert asyncio.run(agent.aremove(gone, cascade=True)) == [gone, below]
        stored = " ".join(_stored_payloads(database))
        assert [t for t in removed if t in stored] == []
        assert all(t in stored for t in texts[kept])
        again = str([e.as_dict() for e in agent.follow_events().poll()])
        assert [t for t in removed if t in again] == []
        assert all(t in again for t in texts[kept])
        assert follower.poll() == []  # nothing new: the blanked events keep their cursors
        served, _ = source.events_after(0)
        assert [t for t in removed if t in str(served)] == []
        assert [e["type"] for e in served if e["session_id"] == gone] == ["session_removed"]
        assert agent.fork(agent.main_session_id, "after").id  # the log goes on after them
        assert [e.type for e in follower.poll()] == ["session_forked"]


class _SlowLog(SqliteMainStorage):
    """A storage whose event-log writer thread starts each batch late."""

    def transaction(self, *, savepoints: bool = True) -> AbstractContextManager[None]:
        if threading.current_thread().name == "stello-event-log":
            time.sleep(0.3)
        return super().transaction(savepoints=savepoints)


def test_events_queued_before_a_removal_are_blanked_too(tmp_path: Path) -> None:
    db = tmp_path / "tree.db"
    with (
        _SlowLog(db) as slow,
        StelloAgent(model=ScriptedChatModel(default="ok"), storage=slow) as agent,
    ):
        child = agent.fork(agent.main_session_id, "queued-label").id

        async def fork_then_remove() -> Any:
            await agent.afork(child, "grandchild-label")  # on the loop: its event is queued
            return await agent.aremove(child, cascade=True)

        assert len(asyncio.run(fork_then_remove())) == 2
        assert agent.drain(5)
        stored = " ".join(_stored_payloads(db))
        assert "queued-label" not in stored and "grandchild-label" not in stored
