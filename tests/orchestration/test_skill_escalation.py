"""A session the model forks gets at most its parent's skills; the developer is not limited."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from langchain_core.messages import ToolMessage

from stello_graph import StelloAgent
from stello_graph.profiles import ForkProfile
from stello_graph.skills import Skill
from stello_graph.testing import ScriptedChatModel
from tests.orchestration.conftest import AgentFactory

SKILLS = [
    Skill(name="a", description="Skill a", content="A"),
    Skill(name="b", description="Skill b", content="B"),
]
PROFILES = [ForkProfile(name="wide", skills=["a", "b"])]


def create(**args: Any) -> Any:
    return ScriptedChatModel.tool_call("create_session", {"label": "Sub", **args})


def last_tool_result(agent: StelloAgent, session_id: str) -> ToolMessage:
    found = [m for m in agent.session(session_id).messages() if isinstance(m, ToolMessage)]
    return found[-1]


@pytest.mark.parametrize(
    "args",
    [{"skills": ["b"]}, {"skills": ["a", "b"]}, {"profile": "wide"}],
    ids=["other-skill", "more-skills", "profile-with-more"],
)
async def test_model_cannot_give_a_child_skills_its_parent_lacks(
    make_agent: AgentFactory, args: dict[str, Any]
) -> None:
    agent = make_agent(
        model=ScriptedChatModel([create(**args), "refused", create(**args), "refused"]),
        skills=SKILLS,
        profiles=PROFILES,
    )
    limited = agent.fork(agent.main_session_id, "Limited", skills=["a"]).id
    before = [m.id for m in agent.storage.list_sessions()]
    for turn in (agent.turn, agent.aturn):
        result: Any = turn(limited, "fork with more skills")
        if inspect.isawaitable(result):
            result = await result
        assert result.content == "refused"
        error = last_tool_result(agent, limited)
        assert error.status == "error"
        assert "at most its parent's skills ['a']" in str(error.content)
        assert "'b'" in str(error.content)
    assert agent.children(limited) == []
    assert [m.id for m in agent.storage.list_sessions()] == before


@pytest.mark.parametrize(
    ("args", "expected"),
    [({}, ["a"]), ({"skills": ["a"]}, ["a"]), ({"skills": []}, [])],
    ids=["inherited", "same", "none"],
)
def test_model_can_give_a_child_its_parents_skills_or_fewer(
    make_agent: AgentFactory, args: dict[str, Any], expected: list[str]
) -> None:
    agent = make_agent(model=ScriptedChatModel([create(**args), "made"]), skills=SKILLS)
    limited = agent.fork(agent.main_session_id, "Limited", skills=["a"]).id
    agent.turn(limited, "fork")
    (child,) = agent.children(limited)
    assert agent.skills_of(child.id) == expected


def test_a_parent_with_every_skill_lets_the_model_choose(make_agent: AgentFactory) -> None:
    agent = make_agent(model=ScriptedChatModel([create(skills=["b"]), "made"]), skills=SKILLS)
    agent.turn(agent.main_session_id, "fork")
    (child,) = agent.children(agent.main_session_id)
    assert agent.skills_of(child.id) == ["b"]


def test_the_developer_may_give_any_registered_skill(make_agent: AgentFactory) -> None:
    agent = make_agent(model=ScriptedChatModel(default="ok"), skills=SKILLS, profiles=PROFILES)
    limited = agent.fork(agent.main_session_id, "Limited", skills=["a"]).id
    assert agent.skills_of(agent.fork(limited, "More", skills=["a", "b"]).id) == ["a", "b"]
    assert agent.skills_of(agent.fork(limited, "Wide", profile="wide").id) == ["a", "b"]
