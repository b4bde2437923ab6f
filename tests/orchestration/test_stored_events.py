"""An agent stores the events that change its tree; other agents and processes follow them."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from stello_graph import Schedule, StelloAgent
from stello_graph._event_log import EventRecorder
from stello_graph.checkpoints import InMemoryMainStorage, SqliteMainStorage
from stello_graph.events import STORED_EVENT_TYPES, StelloEvent, StoredEvents
from stello_graph.models import IntegrationResult
from stello_graph.testing import ScriptedChatModel
from tests.orchestration.conftest import AgentFactory


def _integrate(children: Any, synthesis: Any) -> IntegrationResult:
    return IntegrationResult(
        synthesis="all of it", insights={child.session_id: "look there" for child in children}
    )


def _kinds(agent: StelloAgent) -> list[str]:
    return [event.type for event in agent.follow_events().poll(limit=1000)]


def test_the_tree_changing_events_are_stored_in_order(make_agent: AgentFactory) -> None:
    agent = make_agent(
        model=ScriptedChatModel(default="ok"),
        consolidate_fn=lambda l2, records: "summary",
        integrate_fn=_integrate,
    )
    child = agent.fork(agent.main_session_id, "Child")
    agent.turn(child.id, "hello")  # a turn's own events stay in the process
    agent.consolidate(child.id)
    agent.integrate()
    agent.turn(child.id, "again")  # delivers the insight
    agent.archive(child.id)
    assert agent.drain(10)
    assert _kinds(agent) == [
        "session_forked",
        "consolidated",
        "integrated",
        "insight_pushed",
        "insight_delivered",
        "session_archived",
    ]
    events = agent.follow_events().poll()
    forked, consolidated = events[0], events[1]
    assert forked.session_id == child.id and forked.data["label"] == "Child"
    assert consolidated.data["l2"] == "summary"
    assert [e.cursor for e in events] == sorted({e.cursor for e in events})
    assert {e.type for e in events} <= STORED_EVENT_TYPES


def test_a_background_failure_is_stored(make_agent: AgentFactory) -> None:
    def broken(l2: Any, records: Any) -> str:
        raise RuntimeError("the summariser is down")

    agent = make_agent(
        model=ScriptedChatModel(default="ok"),
        consolidate_fn=broken,
        schedule=Schedule(consolidate_every_n_turns=1, retry_attempts=1),
    )
    child = agent.fork(agent.main_session_id, "Child")
    agent.turn(child.id, "hello")
    assert agent.drain(10)
    (failure,) = [e for e in agent.follow_events().poll() if e.type == "background_error"]
    assert failure.session_id == child.id
    assert "the summariser is down" in failure.data["message"]
    assert failure.data["kind"] == "consolidate"


async def test_async_work_is_stored_too(make_agent: AgentFactory) -> None:
    agent = make_agent(
        model=ScriptedChatModel(default="ok"),
        consolidate_fn=lambda l2, records: "summary",
        integrate_fn=_integrate,
    )
    child = await agent.afork(agent.main_session_id, "Child")
    await agent.aturn(child.id, "hello")
    await agent.aconsolidate(child.id)
    await agent.aintegrate()
    assert await agent.adrain(10)
    found = [e.type async for e in agent.follow_events(interval=0.01).afollow(idle_timeout=0.05)]
    assert found == ["session_forked", "consolidated", "integrated", "insight_pushed"]


def test_a_second_agent_on_the_file_follows_the_first(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.db")
    model = ScriptedChatModel(default="ok")
    with (
        StelloAgent(storage=path, model=model, consolidate_fn=lambda l2, r: "l2") as writer,
        StelloAgent(storage=path, model=model) as reader,
    ):
        follower = reader.follow_events()
        child = writer.fork(writer.main_session_id, "Elsewhere")
        writer.turn(child.id, "hi")
        writer.consolidate(child.id)
        writer.drain(10)
        seen = follower.poll()
        assert [(e.type, e.session_id) for e in seen] == [
            ("session_forked", child.id),
            ("consolidated", child.id),
        ]
        writer.archive(child.id)
        writer.drain(10)
        assert [e.type for e in follower.poll()] == ["session_archived"]
        assert follower.poll() == []


_WRITER = textwrap.dedent(
    """
    import sys
    from stello_graph import StelloAgent
    from stello_graph.testing import ScriptedChatModel

    with StelloAgent(
        storage=sys.argv[1],
        model=ScriptedChatModel(default="ok"),
        consolidate_fn=lambda l2, records: "from another process",
    ) as agent:
        for label in ("One", "Two"):
            child = agent.fork(agent.main_session_id, label)
            agent.turn(child.id, "hi")
            agent.consolidate(child.id)
    """
)


async def test_a_listener_follows_another_process(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    SqliteMainStorage(path).close()  # the file exists before both sides open it
    with SqliteMainStorage(path) as storage:
        follower = StoredEvents(storage, interval=0.02)
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _WRITER, str(path), stderr=subprocess.PIPE
        )
        try:
            seen: list[tuple[str, Any]] = []

            async def follow() -> None:
                async for event in follower.afollow():
                    seen.append((event.type, event.data.get("label") or event.data.get("l2")))
                    if len(seen) == 4:
                        return

            await asyncio.wait_for(follow(), timeout=60)
        finally:
            _, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
        assert process.returncode == 0, stderr.decode()
        assert seen == [
            ("session_forked", "One"),
            ("consolidated", "from another process"),
            ("session_forked", "Two"),
            ("consolidated", "from another process"),
        ]


async def test_events_from_the_loop_are_queued_in_order_and_flushed() -> None:
    storage = InMemoryMainStorage()
    recorder = EventRecorder(storage)
    for index in range(250):  # more than one batch
        recorder.record(StelloEvent(type="consolidated", session_id=f"s{index}"))
    recorder.record(StelloEvent(type="turn_started", session_id="s0"))  # not a stored kind
    assert await recorder.aflush(10)
    events = storage.events_after(0, limit=1000)
    assert [e.session_id for e in events] == [f"s{index}" for index in range(250)]
    recorder.close()
    recorder.record(StelloEvent(type="consolidated", session_id="late"))  # closed: dropped
    assert len(storage.events_after(0, limit=1000)) == 250


def test_an_event_that_cannot_be_stored_is_counted_not_raised(tmp_path: Path) -> None:
    storage = SqliteMainStorage(tmp_path / "closed.db")
    storage.close()
    recorder = EventRecorder(storage)
    recorder.record(StelloEvent(type="consolidated", session_id="s1"))
    recorder.record(StelloEvent(type="integrated", data={"odd": {1, 2}}))  # not JSON: as str
    assert recorder.failed == 2
    with InMemoryMainStorage() as memory:
        EventRecorder(memory).record(StelloEvent(type="integrated", data={"odd": {1}}))
        (stored,) = memory.events_after(0)
        assert stored.data == {"odd": "{1}"}
