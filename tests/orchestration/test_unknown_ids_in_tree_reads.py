"""Reads of the tree name a missing node or session instead of answering for it."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from stello_graph import NodeNotFoundError, Session, SessionNotFoundError, StelloAgent
from stello_graph.testing import ScriptedChatModel
from tests.orchestration.conftest import AgentFactory

READS: dict[str, Callable[[StelloAgent, str], Any]] = {
    "children": lambda a, sid: a.children(sid),
    "achildren": lambda a, sid: a.achildren(sid),
    "ancestors": lambda a, sid: a.ancestors(sid),
    "aancestors": lambda a, sid: a.aancestors(sid),
    "siblings": lambda a, sid: a.siblings(sid),
    "asiblings": lambda a, sid: a.asiblings(sid),
}


async def settle(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


@pytest.mark.parametrize("read", READS.values(), ids=READS.keys())
async def test_tree_reads_of_an_unknown_id_raise(
    make_agent: AgentFactory, read: Callable[[StelloAgent, str], Any]
) -> None:
    agent = make_agent(model=ScriptedChatModel(default="ok"))
    with pytest.raises(NodeNotFoundError, match="'nope' does not exist"):
        await settle(read(agent, "nope"))


@pytest.mark.parametrize("read", READS.values(), ids=READS.keys())
async def test_tree_reads_of_a_session_without_a_node_raise(
    make_agent: AgentFactory, read: Callable[[StelloAgent, str], Any]
) -> None:
    agent = make_agent(model=ScriptedChatModel(default="ok"))
    loose = Session.create(agent.storage, label="Loose", id="loose")  # no TopologyNode
    with pytest.raises(NodeNotFoundError, match="'loose' does not exist"):
        await settle(read(agent, loose.id))


@pytest.mark.parametrize("read", READS.values(), ids=READS.keys())
async def test_tree_reads_of_known_ids_still_answer(
    make_agent: AgentFactory, read: Callable[[StelloAgent, str], Any]
) -> None:
    agent = make_agent(model=ScriptedChatModel(default="ok"))
    leaf = agent.fork(agent.main_session_id, "Leaf")
    assert await settle(read(agent, agent.main_session_id)) in ([], [leaf])
    assert await settle(read(agent, leaf.id)) in ([], [agent.tree().root])


def test_skills_of_an_unknown_session_raises(make_agent: AgentFactory) -> None:
    agent = make_agent(model=ScriptedChatModel(default="ok"))
    with pytest.raises(SessionNotFoundError, match="'nope' does not exist"):
        agent.skills_of("nope")
    loose = Session.create(agent.storage, label="Loose")  # a session without a node
    assert agent.skills_of(loose.id) == []
