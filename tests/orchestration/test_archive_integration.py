"""A scheduled consolidation on archive brings the archived branch's final L2 to integration.

The branch is archived at once; its consolidation runs afterwards in the background, and the
integration that consolidation triggers includes the branch's new L2 (later integrations,
which read only active sessions, do not). No insight goes to the archived branch.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from langchain_core.messages import BaseMessage

from stello_graph import IntegrationResult, Schedule, StelloAgent
from stello_graph.models import ChildL2
from stello_graph.testing import ScriptedChatModel
from tests.orchestration.conftest import AgentFactory


class Recorder:
    """An integrate function that records its inputs and addresses an insight to each."""

    def __init__(self) -> None:
        self.inputs: list[dict[str, str]] = []

    def __call__(self, children: list[ChildL2], current: str | None) -> IntegrationResult:
        self.inputs.append({c.session_id: c.l2 for c in children})
        return IntegrationResult(
            synthesis=f"synthesis {len(self.inputs)}",
            insights={c.session_id: f"insight for {c.label}" for c in children},
        )


def summary(current: str | None, records: list[BaseMessage]) -> str:
    return "final: " + " / ".join(m.text for m in records)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_archived_branch_final_l2_reaches_integration(
    make_agent: AgentFactory, mode: str
) -> None:
    integrate = Recorder()
    agent = make_agent(
        model=ScriptedChatModel(default="r"),
        consolidate_fn=summary,
        integrate_fn=integrate,
        schedule=Schedule(consolidate_on_archive=True, integrate_after_consolidate=True),
    )
    done = agent.fork(agent.main_session_id, "Done").id
    other = agent.fork(agent.main_session_id, "Other").id
    agent.turn(other, "still going")
    agent.consolidate(other)
    agent.turn(done, "the conclusion")

    if mode == "sync":
        agent.archive(done)
        assert agent.drain(10)
    else:
        await agent.aarchive(done)
        assert await agent.adrain(10)

    assert agent.failures() == []
    assert agent.storage.get_memory(done) == "final: the conclusion / r"
    assert integrate.inputs == [
        {other: "final: still going / r", done: "final: the conclusion / r"}
    ]
    assert agent.main.synthesis() == "synthesis 1"
    assert agent.storage.get_insight(other) == "insight for Other"
    assert agent.storage.get_insight(done) is None  # an archived branch takes no insight

    agent.integrate()  # a later integration reads the active sessions only
    assert integrate.inputs[-1] == {other: "final: still going / r"}


def test_archived_branch_alone_is_integrated(make_agent: AgentFactory) -> None:
    integrate = Recorder()
    agent = make_agent(
        model=ScriptedChatModel(default="r"),
        consolidate_fn=summary,
        integrate_fn=integrate,
        schedule=Schedule(consolidate_on_archive=True, integrate_after_consolidate=True),
    )
    only = agent.fork(agent.main_session_id, "Only").id
    agent.turn(only, "all there is")
    agent.archive(only)
    assert agent.drain(10)
    assert agent.failures() == []
    assert integrate.inputs == [{only: "final: all there is / r"}]
    assert agent.main.synthesis() == "synthesis 1"


def test_a_final_l2_waiting_for_integration_outlives_the_agent(tmp_path: Path) -> None:
    """The note that an archived branch's final L2 awaits an integration is kept with the
    tree: an integration that failed leaves it for an agent opened later."""

    def failing(children: list[ChildL2], current: str | None) -> IntegrationResult:
        raise RuntimeError("integration is down")

    db = tmp_path / "stello.db"
    schedule = Schedule(
        consolidate_on_archive=True, integrate_after_consolidate=True, retry_attempts=1
    )
    with StelloAgent(
        model=ScriptedChatModel(default="r"),
        storage=db,
        consolidate_fn=summary,
        integrate_fn=failing,
        schedule=schedule,
    ) as first:
        done = first.fork(first.main_session_id, "Done").id
        other = first.fork(first.main_session_id, "Other").id
        first.turn(other, "still going")
        first.consolidate(other)
        first.turn(done, "the conclusion")
        first.archive(done)
        assert first.drain(10)
        assert first.failures()  # the integration after the archive failed
    integrate = Recorder()
    with StelloAgent(
        model=ScriptedChatModel(default="r"), storage=db, integrate_fn=integrate
    ) as later:
        later.integrate()
        assert done in integrate.inputs[-1]  # the archived branch's final L2 came along
        later.integrate()
        assert done not in integrate.inputs[-1] and other in integrate.inputs[-1]  # once
