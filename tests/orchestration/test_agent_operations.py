"""The agent's operations: one path each, no checkpoint rows, and an async twin for every
member that reads or writes storage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver

from stello_graph import ChildL2, IntegrationResult, StelloAgent
from stello_graph.checkpoints import InMemoryMainStorage
from stello_graph.errors import InvalidInputError, SessionNotFoundError
from stello_graph.profiles import ForkProfile
from stello_graph.schedule import Schedule
from stello_graph.skills import Skill
from stello_graph.testing import ScriptedChatModel
from tests.orchestration.conftest import AgentFactory

SKILLS = [Skill(name="haiku", description="Write haiku", content="5-7-5.")]


def integrate(children: list[ChildL2], current: str | None) -> IntegrationResult:
    return IntegrationResult(synthesis=f"{len(children)} branches")


async def test_operations_write_no_checkpoint_rows(make_agent: AgentFactory) -> None:
    saver = InMemorySaver()
    agent = make_agent(
        model=ScriptedChatModel(default="r"),
        checkpointer=saver,
        consolidate_fn=lambda l2, records: f"{len(records)} records",
        integrate_fn=integrate,
    )
    child = agent.fork(agent.main_session_id, "A")
    grandchild = await agent.afork(child.id, "A1")
    assert agent.consolidate(child.id) is None  # no records yet: no L2
    agent.storage.put_memory(grandchild.id, "L2 of A1")
    agent.storage.put_memory(child.id, "L2 of A")
    assert agent.integrate().synthesis == "2 branches"  # flat: every L2
    assert (await agent.aintegrate("tree")).calls == 2
    assert agent.consolidate_many([child.id]) == {child.id: "L2 of A"}  # nothing new
    assert list(saver.list(None)) == []  # no operation ran as a checkpointed graph run
    agent.turn(child.id, "hi")
    threads = {t.config["configurable"]["thread_id"] for t in saver.list(None)}
    assert threads == {agent.config(child.id)["configurable"]["thread_id"]}  # the turn's only


def test_the_graph_and_the_agent_run_the_same_fork(make_agent: AgentFactory) -> None:
    agent = make_agent(model=ScriptedChatModel(default="r"))
    out = agent.graph.invoke(
        {"op": "fork", "session_id": agent.main_session_id, "fork": {"label": "G"}},
        agent.config("ops"),
    )
    node = agent.fork(agent.main_session_id, "A", tags=["t"], prompt="Hello")
    assert [n.label for n in agent.children(agent.main_session_id)] == ["G", "A"]
    assert out["forked"]["parent_id"] == node.parent_id
    with pytest.raises(InvalidInputError, match="Unknown fork option"):
        agent.fork(agent.main_session_id, "B", colour="red")  # type: ignore[call-arg]


async def test_async_twins_of_the_io_members(tmp_path: Path) -> None:
    async with StelloAgent(
        model=ScriptedChatModel(default="r"),
        storage=str(tmp_path / "twins.db"),
        skills=SKILLS,
        schedule=Schedule(consolidate_every_n_turns=1),
        consolidate_fn=lambda l2, records: 1 / 0,  # type: ignore[arg-type]
    ) as agent:
        child = await agent.afork(agent.main_session_id, "A")
        assert (await agent.asession(child.id)).id == child.id
        assert await agent.askills_of(child.id) == agent.skills_of(child.id) == ["haiku"]
        await agent.aset_skills(child.id, [])
        assert await agent.askills_of(child.id) == []
        with pytest.raises(SessionNotFoundError):
            await agent.askills_of("nobody")
        await agent.aregister_profile(ForkProfile(name="critic", system_prompt="Be sharp."))
        await agent.aturn(child.id, "hi")
        assert await agent.adrain(5)
        failures = await agent.afailures(child.id)
        assert [f.kind for f in failures] == [f.kind for f in agent.failures(child.id)]
        assert failures and failures[0].error_type == "ConsolidationError"
        assert await agent.aclear_failures(child.id) == len(failures)
        assert await agent.afailures() == []


def test_the_config_is_read_only_through_the_agent(make_agent: AgentFactory) -> None:
    agent = make_agent(model=ScriptedChatModel(default="r"), max_tool_rounds=2)
    assert agent.settings.max_tool_rounds == 2
    with pytest.raises(AttributeError):
        agent.settings.max_tool_rounds = 3  # type: ignore[misc]


def test_closing_twice_is_safe() -> None:
    agent = StelloAgent(model=ScriptedChatModel(default="r"), storage=InMemoryMainStorage())
    agent.close()
    agent.close()


async def test_aclose(tmp_path: Path) -> None:
    agent = StelloAgent(model=ScriptedChatModel(default="r"), storage=str(tmp_path / "a.db"))
    await agent.aturn(agent.main_session_id, "hi")
    await agent.aclose()
    reopened: Any = StelloAgent(
        model=ScriptedChatModel(default="r"), storage=str(tmp_path / "a.db")
    )
    assert len(reopened.main.messages()) == 2
    reopened.close()
