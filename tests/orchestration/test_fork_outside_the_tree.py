"""The agent's fork and the model's `create_session` tool refuse to fork a session that has
no TopologyNode (one made with `Session.create` on the agent's storage): the child would be
a session without a node, which the agent can never show nor remove."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import ToolMessage

from stello_graph import NodeNotFoundError, Session, StelloAgent
from stello_graph.testing import ScriptedChatModel
from tests.orchestration.conftest import AgentFactory


async def _fork(agent: StelloAgent, mode: str, source: str, label: str, **options: Any) -> None:
    if mode == "sync":
        agent.fork(source, label, **options)
    else:
        await agent.afork(source, label, **options)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_agent_fork_of_a_session_without_a_node_is_refused(
    make_agent: AgentFactory, mode: str
) -> None:
    agent = make_agent(model=ScriptedChatModel(default="ok"))
    outside = Session.create(agent.storage, label="Outside")
    sessions = len(agent.storage.list_sessions())
    with pytest.raises(NodeNotFoundError, match=repr(outside.id)):
        await _fork(agent, mode, outside.id, "Child", id="child")
    assert len(agent.storage.list_sessions()) == sessions
    assert agent.storage.get_session("child") is None


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_create_session_from_a_session_without_a_node_is_refused(
    make_agent: AgentFactory, mode: str
) -> None:
    model = ScriptedChatModel(
        [ScriptedChatModel.tool_call("create_session", {"label": "Deep dive"}), "Could not."]
    )
    agent = make_agent(model=model)
    outside = Session.create(agent.storage, label="Outside")
    sessions = len(agent.storage.list_sessions())
    if mode == "sync":
        result = agent.turn(outside.id, "open a branch")
    else:
        result = await agent.aturn(outside.id, "open a branch")
    assert result.content == "Could not."
    (error,) = [m for m in agent.session(outside.id).messages() if isinstance(m, ToolMessage)]
    assert error.status == "error"
    assert "no topology node" in str(error.content)
    assert len(agent.storage.list_sessions()) == sessions  # no child without a node
