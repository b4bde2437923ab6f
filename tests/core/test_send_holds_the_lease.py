"""`Session.send` / `stream` (the core API, no graph) hold the session's lease too."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from langchain_core.messages import BaseMessage, SystemMessage

from stello_graph import LeaseLostError, Session, SessionBusyError
from stello_graph.checkpoints import InMemoryMainStorage, SqliteMainStorage
from stello_graph.lease import SessionLeases
from stello_graph.storage import MainStorage
from stello_graph.testing import ScriptedChatModel


def _respond(prompt: list[BaseMessage]) -> str:
    history = [m for m in prompt[:-1] if not isinstance(m, SystemMessage)]
    return f"saw={len(history)}"


def _sessions(storage: MainStorage, path: Path | None) -> tuple[Session, Session]:
    model = ScriptedChatModel(respond=_respond, latency=0.03)
    first = Session.create(storage, model=model, label="Shared")
    other = storage if path is None else SqliteMainStorage(path)  # a second connection
    return first, Session.load(first.id, other, model=model)


@pytest.fixture(params=["memory", "sqlite"])
def setup(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[MainStorage, Path | None]:
    if request.param == "memory":
        return InMemoryMainStorage(), None
    path = tmp_path / "s.db"
    return SqliteMainStorage(path), path


def test_sends_from_two_threads_are_serialised(setup: tuple[MainStorage, Path | None]) -> None:
    storage, path = setup
    sessions = _sessions(storage, path)

    def run(session: Session) -> None:
        for n in range(3):
            session.send(f"hello {n}")

    threads = [threading.Thread(target=run, args=(s,)) for s in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    replies = [m.text for m in storage.list_records(sessions[0].id, role="ai")]
    assert replies == [f"saw={2 * k}" for k in range(6)]


async def test_async_sends_and_streams_are_serialised(
    setup: tuple[MainStorage, Path | None],
) -> None:
    storage, path = setup
    first, second = _sessions(storage, path)

    async def stream(n: int) -> None:
        async for _ in second.astream(f"s{n}"):
            pass

    await asyncio.wait_for(
        asyncio.gather(*(first.asend(f"a{n}") for n in range(2)), *(stream(n) for n in range(2))),
        60,
    )
    replies = [m.text for m in storage.list_records(first.id, role="ai")]
    assert replies == [f"saw={2 * k}" for k in range(4)]


def test_a_stream_holds_the_lease_until_it_ends(setup: tuple[MainStorage, Path | None]) -> None:
    storage, _ = setup
    session = Session.create(storage, model=ScriptedChatModel(default="one two three"))
    stream = session.stream("hi")
    assert storage.get_lease(session.id) is None  # nothing is taken before it is read
    assert next(stream) == "one"
    assert storage.get_lease(session.id) is not None
    stream.close()
    assert storage.get_lease(session.id) is None
    assert storage.count_records(session.id) == 0


def test_send_inside_a_hold_of_its_session_fails_at_once() -> None:
    storage = InMemoryMainStorage()
    session = Session.create(storage, model=ScriptedChatModel(default="ok"))
    with SessionLeases(storage).hold(session.id), pytest.raises(SessionBusyError):
        session.send("hi")
    assert session.send("hi").content == "ok"


def test_a_send_that_lost_its_lease_stores_nothing() -> None:
    storage = InMemoryMainStorage()

    def steal(prompt: list[BaseMessage]) -> str:
        current = storage.get_lease(session.id)
        assert current is not None
        storage.acquire_lease(session.id, "thief/1/x", 30, replace=current.owner)
        return "late"

    session = Session.create(storage, model=ScriptedChatModel(respond=steal))
    with pytest.raises(LeaseLostError):
        session.send("hi")
    assert storage.count_records(session.id) == 0
