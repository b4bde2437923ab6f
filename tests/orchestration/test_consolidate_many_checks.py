"""`consolidate_many` checks every id before it consolidates any."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from langchain_core.messages import BaseMessage

from stello_graph import (
    InvalidInputError,
    SessionArchivedError,
    SessionNotFoundError,
    StelloAgent,
    StelloError,
)
from stello_graph.testing import ScriptedChatModel
from tests.orchestration.conftest import AgentFactory


class Counting:
    """A consolidate function that records the sessions it was called for."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, current: str | None, records: list[BaseMessage]) -> str:
        self.calls += 1
        return f"L2 of {len(records)} records"


async def settle(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


@pytest.fixture
def world(make_agent: AgentFactory) -> tuple[StelloAgent, Counting, list[str]]:
    fn = Counting()
    agent = make_agent(model=ScriptedChatModel(default="ok"), consolidate_fn=fn)
    ids = [agent.fork(agent.main_session_id, label).id for label in ("A", "B", "Gone")]
    for sid in ids:
        agent.turn(sid, "hello")
    agent.archive(ids[2])
    return agent, fn, ids


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        ("main", InvalidInputError, "it does not consolidate"),
        ("nope", SessionNotFoundError, "'nope' does not exist"),
    ],
)
async def test_a_bad_id_anywhere_consolidates_nothing(
    world: tuple[StelloAgent, Counting, list[str]],
    mode: str,
    bad: str,
    error: type[StelloError],
    match: str,
) -> None:
    agent, fn, (a, b, _) = world
    bad_id = agent.main_session_id if bad == "main" else bad
    run = agent.consolidate_many if mode == "sync" else agent.aconsolidate_many
    with pytest.raises(error, match=match):
        await settle(run([a, b, bad_id]))
    assert fn.calls == 0
    assert agent.storage.get_memory(a) is None
    assert agent.storage.get_memory(b) is None


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_good_ids_are_all_consolidated(
    world: tuple[StelloAgent, Counting, list[str]], mode: str
) -> None:
    agent, fn, (a, b, _) = world
    run = agent.consolidate_many if mode == "sync" else agent.aconsolidate_many
    assert await settle(run([a, b, a])) == {a: "L2 of 2 records", b: "L2 of 2 records"}
    assert fn.calls == 2


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_an_archived_session_still_fails_alone(
    world: tuple[StelloAgent, Counting, list[str]], mode: str
) -> None:
    agent, fn, (a, b, gone) = world
    run = agent.consolidate_many if mode == "sync" else agent.aconsolidate_many
    with pytest.raises(SessionArchivedError, match="refuses consolidation"):
        await settle(run([gone, a, b]))
    assert fn.calls == 2
