"""Branching through the agent: forks at a turn from every front door (`fork` / `afork`,
the graph's fork op, the model's `create_session`), lineage over several generations and
how the tree shows it, and labels kept unique among siblings when asked."""

from __future__ import annotations

import pytest
from langchain_core.messages import ToolMessage

from stello_graph import DuplicateLabelError, ForkPoint, StelloAgent, TurnOutOfRangeError
from stello_graph.errors import SessionNotFoundError
from stello_graph.testing import ScriptedChatModel
from tests.orchestration.conftest import AgentFactory


def _talk(agent: StelloAgent, session_id: str, *questions: str) -> None:
    for question in questions:
        agent.turn(session_id, question)


def _questions(agent: StelloAgent, session_id: str) -> list[str]:
    return [str(m.content) for m in agent.session(session_id).messages() if m.type == "human"]


def test_lineage_over_several_generations(make_agent: AgentFactory) -> None:
    agent = make_agent(model=ScriptedChatModel(default="ok"))
    root = agent.fork(agent.main_session_id, "Root")
    _talk(agent, root.id, "r1", "r2", "r3")
    child = agent.fork(root.id, "Child", context="inherit", at_turn=2)
    _talk(agent, child.id, "c3", "c4")
    grandchild = agent.fork(child.id, "Grandchild", context="inherit", at_turn=-1)
    great = agent.fork(grandchild.id, "Great", context="inherit", at_turn=3)
    assert _questions(agent, great.id) == ["r1", "r2", "c3"]
    assert agent.lineage(great.id) == [
        ForkPoint(great.id, grandchild.id, 3),
        ForkPoint(grandchild.id, child.id, 4),
        ForkPoint(child.id, root.id, 2),
        ForkPoint(root.id, agent.main_session_id, None),
    ]
    assert agent.lineage(agent.main_session_id) == []
    # a move rearranges the tree, not where the session came from
    agent.move(great.id, agent.main_session_id)
    assert agent.lineage(great.id)[0] == ForkPoint(great.id, grandchild.id, 3)
    with pytest.raises(SessionNotFoundError):
        agent.lineage("nobody")


def test_lineage_keeps_a_removed_source_and_stops_there(make_agent: AgentFactory) -> None:
    agent = make_agent(model=ScriptedChatModel(default="ok"))
    root = agent.fork(agent.main_session_id, "Root")
    _talk(agent, root.id, "r1")
    child = agent.fork(root.id, "Child", context="inherit")
    agent.move(child.id, agent.main_session_id)
    agent.remove(root.id)
    assert agent.lineage(child.id) == [ForkPoint(child.id, root.id, 1)]
    assert f"<- forked from {root.id} (removed) at turn 1" in str(agent.tree())


def test_the_tree_shows_where_forks_came_from(make_agent: AgentFactory) -> None:
    agent = make_agent(model=ScriptedChatModel(default="ok"))
    ideas = agent.fork(agent.main_session_id, "Ideas")
    _talk(agent, ideas.id, "a", "b")
    tea = agent.fork(ideas.id, "Tea", context="inherit", at_turn=1)
    plain = agent.fork(ideas.id, "Plain")
    tree = agent.tree()
    lines = {line.strip(" │├└─"): line for line in str(tree).splitlines()}
    assert any(f"Tea  ({tea.id})  <- forked from 'Ideas' at turn 1" in k for k in lines)
    assert any(k.endswith(f"Plain  ({plain.id})") for k in lines)  # nothing the tree lacks
    nodes = {n["id"]: n for n in tree.to_dict()["nodes"]}
    assert (nodes[tea.id]["forked_from"], nodes[tea.id]["forked_at_turn"]) == (ideas.id, 1)
    assert nodes[agent.main_session_id]["forked_from"] is None


async def test_async_fork_at_a_turn_and_lineage(make_agent: AgentFactory) -> None:
    agent = make_agent(model=ScriptedChatModel(default="ok"))
    source = await agent.afork(agent.main_session_id, "Source")
    for question in ("one", "two", "three"):
        await agent.aturn(source.id, question)
    child = await agent.afork(source.id, "Child", context="inherit", at_turn=-2)
    assert _questions(agent, child.id) == ["one", "two"]
    assert await agent.alineage(child.id) == [
        ForkPoint(child.id, source.id, 2),
        ForkPoint(source.id, agent.main_session_id, None),
    ]
    assert (await agent.atree()).lineage[child.id] == ForkPoint(child.id, source.id, 2)
    with pytest.raises(TurnOutOfRangeError):
        await agent.afork(source.id, "Far", context="inherit", at_turn=4)


def test_the_graph_fork_op_takes_at_turn(make_agent: AgentFactory) -> None:
    agent = make_agent(model=ScriptedChatModel(default="ok"))
    source = agent.fork(agent.main_session_id, "Source")
    _talk(agent, source.id, "one", "two")
    spec = {"label": "G", "context": "inherit", "at_turn": 1}
    out = agent.graph.invoke({"op": "fork", "session_id": source.id, "fork": spec},
                             agent.config("ops"))  # fmt: skip
    child_id = out["forked"]["session_id"]
    assert _questions(agent, child_id) == ["one"]
    assert agent.lineage(child_id)[0] == ForkPoint(child_id, source.id, 1)


def test_the_model_forks_at_an_earlier_turn(make_agent: AgentFactory) -> None:
    call = ScriptedChatModel.tool_call(
        "create_session", {"label": "Back to one", "context": "inherit", "at_turn": 1}
    )
    model = ScriptedChatModel(["first", "second", call, "forked"], default="ok")
    agent = make_agent(model=model)
    source = agent.fork(agent.main_session_id, "Source")
    _talk(agent, source.id, "one", "two", "fork it")
    (child,) = agent.children(source.id)
    assert child.label == "Back to one" and _questions(agent, child.id) == ["one"]
    assert agent.lineage(child.id)[0] == ForkPoint(child.id, source.id, 1)


def test_labels_unique_among_siblings_when_asked(make_agent: AgentFactory) -> None:
    call = ScriptedChatModel.tool_call("create_session", {"label": " pricing "})
    model = ScriptedChatModel(["ok", call, "done"], default="ok")
    agent = make_agent(model=model, unique_labels=True)
    source = agent.fork(agent.main_session_id, "Source")
    first = agent.fork(source.id, "Pricing")
    before = len(agent.storage.list_sessions())
    with pytest.raises(DuplicateLabelError, match=first.id) as caught:
        agent.fork(source.id, "PRICING")
    assert (caught.value.parent_id, caught.value.sibling_id) == (source.id, first.id)
    assert len(agent.storage.list_sessions()) == before
    agent.fork(agent.main_session_id, "Pricing")  # another parent: not a sibling
    before_calls = model.call_count
    with pytest.raises(DuplicateLabelError):  # refused before the model summarises anything
        agent.fork(source.id, "Pricing", context="compress")
    assert model.call_count == before_calls
    # the model is told, and no duplicate is made
    _talk(agent, source.id, "hello", "make a pricing branch")
    assert [n.label for n in agent.children(source.id)] == ["Pricing"]
    results = [m for m in model.prompts[-1] if isinstance(m, ToolMessage)]
    assert "DuplicateLabelError" in str(results[-1].content)


def test_labels_may_repeat_by_default(make_agent: AgentFactory) -> None:
    agent = make_agent(model=ScriptedChatModel(default="ok"))
    agent.fork(agent.main_session_id, "Same")
    agent.fork(agent.main_session_id, "Same")
    assert [n.label for n in agent.children(agent.main_session_id)] == ["Same", "Same"]
