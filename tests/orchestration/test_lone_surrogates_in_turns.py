"""A graph turn whose model reply or tool result holds a lone surrogate is committed with
U+FFFD in its place: the user did not send that text, so the turn must not fail as if they
had; a user message with one is still an `InvalidInputError`."""

from __future__ import annotations

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool

from stello_graph import InvalidInputError, StelloAgent
from stello_graph.testing import ScriptedChatModel
from tests.orchestration.conftest import AgentFactory

BAD = "half \ud800 of a pair"
FIXED = "half \ufffd of a pair"


@tool
def broken(q: str) -> str:
    """A tool whose output holds a lone surrogate."""
    return f"{q}: {BAD}"


async def _turn(agent: StelloAgent, mode: str, sid: str, text: str) -> str:
    if mode == "sync":
        return agent.turn(sid, text).content
    return (await agent.aturn(sid, text)).content


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_turn_with_lone_surrogates_from_model_and_tool_commits(
    make_agent: AgentFactory, mode: str
) -> None:
    model = ScriptedChatModel([ScriptedChatModel.tool_call("broken", {"q": "x"}), BAD])
    agent = make_agent(model=model, tools=[broken])
    sid = agent.fork(agent.main_session_id, "S").id
    assert await _turn(agent, mode, sid, "go") == FIXED
    records = agent.session(sid).messages()
    (result,) = [m for m in records if isinstance(m, ToolMessage)]
    assert result.text == f"x: {FIXED}"
    assert records[-1].text == FIXED
    assert agent.storage.get_turn_count(sid) == 1


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_user_message_with_a_lone_surrogate_is_refused(
    make_agent: AgentFactory, mode: str
) -> None:
    agent = make_agent(model=ScriptedChatModel(default="ok"))
    sid = agent.fork(agent.main_session_id, "S").id
    with pytest.raises(InvalidInputError, match="surrogate"):
        await _turn(agent, mode, sid, BAD)
    assert agent.session(sid).messages() == []
