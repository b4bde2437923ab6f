"""`consolidate_many` / `aconsolidate_many`: many sessions, model calls overlapping."""

from __future__ import annotations

import threading
from typing import Literal

import pytest
from langchain_core.messages import BaseMessage

from stello_graph import (
    ConsolidationError,
    InvalidInputError,
    Session,
    SessionArchivedError,
    StelloAgent,
    StelloEvent,
)
from stello_graph.testing import ScriptedChatModel
from tests.orchestration.conftest import AgentFactory

Mode = Literal["sync", "async"]


async def consolidate_many(
    agent: StelloAgent, mode: Mode, ids: list[str], concurrency: int
) -> dict[str, str | None]:
    if mode == "sync":
        return agent.consolidate_many(ids, concurrency=concurrency)
    return await agent.aconsolidate_many(ids, concurrency=concurrency)


def memory(agent: StelloAgent, sid: str) -> str | None:
    session = agent.session(sid)
    assert isinstance(session, Session)
    return session.memory()


def branches(agent: StelloAgent, count: int) -> list[str]:
    ids = []
    for n in range(count):
        sid = agent.fork(agent.main_session_id, f"Topic {n}").id
        agent.turn(sid, f"about topic {n}")
        ids.append(sid)
    return ids


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_runs_up_to_concurrency_at_once(make_agent: AgentFactory, mode: Mode) -> None:
    # Three calls can only pass the barrier together: the batch must run three at a time.
    barrier = threading.Barrier(3, timeout=10)
    lock, running, peak = threading.Lock(), [0], [0]

    def summary(current: str | None, records: list[BaseMessage]) -> str:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        barrier.wait()
        with lock:
            running[0] -= 1
        return f"L2 of {records[0].text}"

    agent = make_agent(model=ScriptedChatModel(default="ok"), consolidate_fn=summary)
    ids = branches(agent, 6)
    events: list[StelloEvent] = []
    agent.subscribe(events.append)
    result = await consolidate_many(agent, mode, [*ids, ids[0]], 3)
    assert list(result) == ids  # in the order given, duplicates once
    assert result == {sid: f"L2 of about topic {n}" for n, sid in enumerate(ids)}
    assert peak[0] == 3
    consolidated = {e.session_id: e.data["l2"] for e in events if e.type == "consolidated"}
    assert consolidated == result
    assert [memory(agent, sid) for sid in ids] == list(result.values())


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_every_session_is_attempted_then_the_first_failure_raised(
    make_agent: AgentFactory, mode: Mode
) -> None:
    def summary(current: str | None, records: list[BaseMessage]) -> str:
        if "topic 1" in records[0].text or "topic 3" in records[0].text:
            raise RuntimeError("model down")
        return "L2"

    agent = make_agent(model=ScriptedChatModel(default="ok"), consolidate_fn=summary)
    ids = branches(agent, 5)
    with pytest.raises(ConsolidationError, match="model down") as caught:
        await consolidate_many(agent, mode, ids, 2)
    assert ids[1] in str(caught.value)
    assert caught.value.__notes__[-1] == "1 other session(s) of the batch failed."
    assert [memory(agent, sid) for sid in ids] == ["L2", None, "L2", None, "L2"]


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_archived_session_fails_its_batch_alone(make_agent: AgentFactory, mode: Mode) -> None:
    agent = make_agent(model=ScriptedChatModel(default="ok"), consolidate_fn=lambda c, r: "L2")
    ids = branches(agent, 2)
    agent.archive(ids[0])
    with pytest.raises(SessionArchivedError):
        await consolidate_many(agent, mode, ids, 4)
    assert memory(agent, ids[1]) == "L2"


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(
    ("ids", "concurrency", "message"),
    [
        (["a"], 0, "concurrency must be a positive int, got 0"),
        (["a"], True, "concurrency must be a positive int, got True"),
        ("abc", 2, "an iterable of ids, not one str"),
        (["ok", ""], 2, "session id"),
    ],
)
async def test_bad_batches_are_refused_before_any_work(
    make_agent: AgentFactory, mode: Mode, ids: list[str], concurrency: int, message: str
) -> None:
    calls: list[str] = []
    agent = make_agent(
        model=ScriptedChatModel(default="ok"), consolidate_fn=lambda c, r: calls.append("x")
    )
    with pytest.raises(InvalidInputError, match=message):
        await consolidate_many(agent, mode, ids, concurrency)
    assert calls == []


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_empty_batch(make_agent: AgentFactory, mode: Mode) -> None:
    agent = make_agent(model=ScriptedChatModel(default="ok"))
    assert await consolidate_many(agent, mode, [], 4) == {}
