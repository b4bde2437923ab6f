"""What is stored is what applies: every turn uses the session's stored allow-list, system
prompt and status, whoever changed them (another agent on the same storage, another process).

Two agents share one storage (the same in-memory storage, or two `SqliteMainStorage`
connections on one file); agent B changes a session, agent A runs the next turn.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from stello_graph import SessionArchivedError, StelloAgent
from stello_graph.skills import Skill
from stello_graph.testing import ScriptedCall, ScriptedChatModel
from tests.orchestration.conftest import AgentFactory

SKILLS = [
    Skill(name="haiku", description="Write haiku", content="HAIKU RULES: 5-7-5."),
    Skill(name="sql", description="Write SQL", content="SQL RULES: use CTEs."),
]


def activate(name: str) -> AIMessage:
    return ScriptedChatModel.tool_call("activate_skill", {"name": name})


def offered_skills(call: ScriptedCall) -> list[str]:
    """The skill names the model could pass to `activate_skill` in this call."""
    for schema in call.kwargs.get("tools") or []:
        function = schema["function"]
        if function["name"] == "activate_skill":
            prop = function["parameters"]["properties"]["name"]
            return list(prop.get("enum", [prop.get("const")]))
    return []


def last_tool_result(agent: StelloAgent, session_id: str) -> ToolMessage:
    found = [m for m in agent.session(session_id).messages() if isinstance(m, ToolMessage)]
    return found[-1]


async def run_turn(agent: StelloAgent, mode: str, session_id: str, text: str) -> None:
    if mode == "sync":
        agent.turn(session_id, text)
    else:
        await agent.aturn(session_id, text)


def two_agents(make_agent: AgentFactory, model: ScriptedChatModel) -> tuple[Any, Any]:
    a = make_agent(model=model, skills=SKILLS)
    b = make_agent(model=ScriptedChatModel(default="b"), skills=SKILLS)
    return a, b


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_skill_revoked_by_another_agent_is_not_offered(
    make_agent: AgentFactory, mode: str
) -> None:
    model = ScriptedChatModel(default="r")
    a, b = two_agents(make_agent, model)
    child = a.fork(a.main_session_id, "C", skills=["haiku", "sql"])
    await run_turn(a, mode, child.id, "hi")  # A now holds the session's object
    assert offered_skills(model.calls[-1]) == ["haiku", "sql"]

    b.set_skills(child.id, ["haiku"])
    model.extend([activate("sql"), "done"])
    await run_turn(a, mode, child.id, "use sql")
    assert offered_skills(model.calls[-2]) == ["haiku"]
    refused = last_tool_result(a, child.id)
    assert refused.status == "error"
    assert "SQL RULES" not in str(refused.content)

    b.set_skills(child.id, [])
    await run_turn(a, mode, child.id, "plain")
    assert "activate_skill" not in model.calls[-1].tools


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_skill_revoked_during_a_turn_cannot_be_activated(
    make_agent: AgentFactory, mode: str
) -> None:
    model = ScriptedChatModel(default="r")
    a, b = two_agents(make_agent, model)
    child = a.fork(a.main_session_id, "C", skills=["haiku", "sql"])

    def revoke_then_call(_: list[BaseMessage]) -> AIMessage:
        b.set_skills(child.id, ["haiku"])  # after A's turn was assembled with both skills
        return activate("sql")

    model.extend([revoke_then_call, "done"])
    await run_turn(a, mode, child.id, "use sql")
    assert offered_skills(model.calls[0]) == ["haiku", "sql"]
    refused = last_tool_result(a, child.id)
    assert refused.status == "error"
    assert "not available" in str(refused.content)
    assert "SQL RULES" not in str(refused.content)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_system_prompt_and_status_set_by_another_agent_apply(
    make_agent: AgentFactory, mode: str
) -> None:
    model = ScriptedChatModel(default="r")
    a, b = two_agents(make_agent, model)
    child = a.fork(a.main_session_id, "C", system_prompt="OLD PROMPT")
    await run_turn(a, mode, child.id, "hi")
    assert "OLD PROMPT" in model.calls[-1].messages[0].text

    b.session(child.id).set_system_prompt("NEW PROMPT")
    await run_turn(a, mode, child.id, "again")
    system = model.calls[-1].messages[0].text
    assert "NEW PROMPT" in system and "OLD PROMPT" not in system

    b.archive(child.id)
    calls = model.call_count
    with pytest.raises(SessionArchivedError):
        await run_turn(a, mode, child.id, "after archive")
    assert model.call_count == calls
