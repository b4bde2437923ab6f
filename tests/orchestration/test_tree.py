"""Tree topology: navigation, move, remove, and layer-by-layer integration (an OKR tree)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from langchain_core.messages import BaseMessage

from stello_graph import (
    ChildL2,
    IntegrationResult,
    InvalidInputError,
    NodeHasChildrenError,
    NodeNotFoundError,
    StelloAgent,
    TopologyCycleError,
)
from stello_graph.memory import llm_integrator
from stello_graph.models import TreeIntegration
from stello_graph.testing import ScriptedChatModel
from tests.orchestration.conftest import AgentFactory


def okr(agent: StelloAgent) -> dict[str, str]:
    """Objective (main) -> KR1 (tasks T1a, T1b), KR2 (task T2a), KR3 (no tasks); L2 for all."""
    ids = {"O": agent.main_session_id}
    for kr in ("KR1", "KR2", "KR3"):
        ids[kr] = agent.fork(ids["O"], kr).id
    for task, kr in (("T1a", "KR1"), ("T1b", "KR1"), ("T2a", "KR2")):
        ids[task] = agent.fork(ids[kr], task).id
    for name, sid in ids.items():
        if name != "O":
            agent.storage.put_memory(sid, f"L2 of {name}")
    return ids


class Recorder:
    """An integrate function that records what each node was shown."""

    def __init__(self, delay: float = 0.0) -> None:
        self.names: dict[str, str] = {}
        self.seen: dict[str, list[str]] = {}
        self.delay, self.active, self.max_active = delay, 0, 0
        self.lock = threading.Lock()

    def __call__(self, children: list[ChildL2], current: str | None) -> IntegrationResult:
        with self.lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        time.sleep(self.delay)
        with self.lock:
            self.active -= 1
        names = [self.names[c.session_id] for c in children]
        node = self.parent_of(names)
        self.seen[node] = [c.l2 for c in children]
        insights = {c.session_id: f"{node} -> {self.names[c.session_id]}" for c in children}
        insights["ghost"] = "dropped"
        return IntegrationResult(synthesis=f"summary of {node}", insights=insights)

    def bind(self, ids: dict[str, str]) -> dict[str, str]:
        """Name the sessions of the tree `ids` (made once the agent is); return `ids`."""
        self.names = {v: k for k, v in ids.items()}
        return ids

    @staticmethod
    def parent_of(names: list[str]) -> str:
        first = names[0]
        return "O" if first.startswith("KR") else f"KR{first[1]}"


def test_navigation(make_agent: AgentFactory) -> None:
    agent = make_agent(model=ScriptedChatModel(default="r"))
    ids = okr(agent)
    assert [n.label for n in agent.children(ids["O"])] == ["KR1", "KR2", "KR3"]
    assert [n.label for n in agent.children(ids["KR1"])] == ["T1a", "T1b"]
    assert [n.id for n in agent.ancestors(ids["T1b"])] == [ids["KR1"], ids["O"]]
    assert [n.label for n in agent.siblings(ids["KR2"])] == ["KR1", "KR3"]
    assert agent.siblings(ids["O"]) == []
    tree = agent.tree()
    assert tree.depth(ids["T2a"]) == 2
    assert [n.label for n in tree] == ["Main Session", "KR1", "T1a", "T1b", "KR2", "T2a", "KR3"]
    with pytest.raises(NodeNotFoundError):
        agent.siblings("nope")


def test_move_and_cycles(make_agent: AgentFactory) -> None:
    agent = make_agent(model=ScriptedChatModel(default="r"))
    ids = okr(agent)
    moved = agent.move(ids["KR1"], ids["KR2"])
    assert moved.parent_id == ids["KR2"]
    assert [n.label for n in agent.children(ids["KR2"])] == ["KR1", "T2a"]
    assert [n.id for n in agent.ancestors(ids["T1a"])] == [ids["KR1"], ids["KR2"], ids["O"]]
    before = agent.storage.get_tree()
    with pytest.raises(TopologyCycleError):
        agent.move(ids["KR2"], ids["T1a"])  # under its own grandchild
    with pytest.raises(TopologyCycleError):
        agent.move(ids["KR2"], ids["KR2"])
    with pytest.raises(InvalidInputError, match="cannot move"):
        agent.move(ids["O"], ids["KR3"])
    with pytest.raises(NodeNotFoundError):
        agent.move(ids["KR3"], "nowhere")
    assert agent.storage.get_tree() == before


def test_remove_subtree(make_agent: AgentFactory) -> None:
    agent = make_agent(model=ScriptedChatModel(default="r"))
    ids = okr(agent)
    agent.turn(ids["T1a"], "hello")
    with pytest.raises(NodeHasChildrenError):
        agent.remove(ids["KR1"])
    assert agent.storage.get_session(ids["T1a"]) is not None
    removed = agent.remove(ids["KR1"], cascade=True)
    assert set(removed) == {ids["KR1"], ids["T1a"], ids["T1b"]}
    for name in ("KR1", "T1a", "T1b"):
        assert agent.storage.get_session(ids[name]) is None
        assert agent.storage.get_node(ids[name]) is None
        assert agent.storage.list_records(ids[name]) == []
    assert [n.label for n in agent.children(ids["O"])] == ["KR2", "KR3"]
    with pytest.raises(InvalidInputError, match="cannot be removed"):
        agent.remove(ids["O"], cascade=True)


def test_tree_integration_sees_only_direct_children(make_agent: AgentFactory) -> None:
    recorder = Recorder()
    agent = make_agent(model=ScriptedChatModel(default="r"), integrate_fn=recorder)
    ids = recorder.bind(okr(agent))
    result = agent.integrate(mode="tree")
    assert isinstance(result, TreeIntegration)
    # one call per internal node whose children have L2: KR1, KR2, then the objective
    assert result.calls == 3
    assert result.levels == 2
    assert recorder.seen["KR1"] == ["L2 of T1a", "L2 of T1b"]
    assert recorder.seen["KR2"] == ["L2 of T2a"]
    # the objective sees each KR's own L2 and its subtree summary (KR3 has no subtree)
    under = "\n\nWhat the sessions under it found: "
    assert recorder.seen["O"] == [
        f"L2 of KR1{under}summary of KR1",
        f"L2 of KR2{under}summary of KR2",
        "L2 of KR3",
    ]
    assert result.synthesis == "summary of O"
    assert agent.main.synthesis() == "summary of O"
    assert agent.storage.get_subtree_synthesis(ids["KR1"]) == "summary of KR1"
    # insights go one level down only, to the node's own children
    assert agent.storage.get_insight(ids["T1a"]) == "KR1 -> T1a"
    assert agent.storage.get_insight(ids["T2a"]) == "KR2 -> T2a"
    assert agent.storage.get_insight(ids["KR1"]) == "O -> KR1"
    assert "ghost" not in result.insights
    assert set(result.results) == {ids["KR1"], ids["KR2"], ids["O"]}


def test_tree_integration_prompts_stay_in_their_subtree(make_agent: AgentFactory) -> None:
    def answer(messages: list[BaseMessage]) -> str:
        body = messages[-1].text
        kids = [line.split('"')[1] for line in body.splitlines() if line.startswith("<branch")]
        return json.dumps({"synthesis": f"synthesis over {len(kids)}", "insights": {}})

    model = ScriptedChatModel(respond=answer)
    agent = make_agent(model=ScriptedChatModel(default="r"), integrate_fn=llm_integrator(model))
    ids = okr(agent)
    agent.turn(ids["T1a"], "SECRET L3 OF T1a")  # L3 must never reach any integration
    agent.integrate(mode="tree")
    assert model.call_count == 3
    kr1 = next(p[-1].text for p in model.prompts if "L2 of T1a" in p[-1].text)
    assert "L2 of T1b" in kr1 and "L2 of T2a" not in kr1 and "L2 of KR1" not in kr1
    assert "L2 of KR2" not in kr1
    top = next(p[-1].text for p in model.prompts if ids["KR3"] in p[-1].text)
    assert "L2 of T1a" not in top and "L2 of T2a" not in top
    assert "synthesis over 2" in top and "synthesis over 1" in top
    assert all("SECRET" not in p[-1].text for p in model.prompts)


def test_siblings_integrate_in_parallel(make_agent: AgentFactory) -> None:
    recorder = Recorder(delay=0.3)
    agent = make_agent(model=ScriptedChatModel(default="r"), integrate_fn=recorder)
    recorder.bind(okr(agent))
    agent.integrate(mode="tree")
    assert recorder.max_active == 2  # KR1 and KR2 together; the objective after them


def test_archived_subtree_takes_no_part(make_agent: AgentFactory) -> None:
    recorder = Recorder()
    agent = make_agent(model=ScriptedChatModel(default="r"), integrate_fn=recorder)
    ids = recorder.bind(okr(agent))
    agent.archive(ids["KR1"])
    result = agent.integrate(mode="tree")
    assert set(recorder.seen) == {"KR2", "O"}
    under = "\n\nWhat the sessions under it found: "
    assert recorder.seen["O"] == [f"L2 of KR2{under}summary of KR2", "L2 of KR3"]
    assert agent.storage.get_insight(ids["T1a"]) is None
    assert result.calls == 2


async def test_async_tree_integration_and_deeper_trees(make_agent: AgentFactory) -> None:
    seen: list[list[str]] = []

    async def integrate(children: list[ChildL2], current: str | None) -> IntegrationResult:
        seen.append([c.l2 for c in children])
        return IntegrationResult(synthesis=f"up({children[0].l2})")

    agent = make_agent(model=ScriptedChatModel(default="r"), integrate_fn=integrate)
    chain = [agent.main_session_id]
    for depth in range(1, 6):
        chain.append((await agent.afork(chain[-1], f"D{depth}")).id)
    await agent.storage.aput_memory(chain[-1], "deepest")
    result = await agent.aintegrate(mode="tree")
    assert isinstance(result, TreeIntegration)
    assert result.calls == 5 and result.levels == 5
    assert seen[0] == ["deepest"]
    assert result.synthesis == "up(up(up(up(up(deepest)))))"


def test_flat_mode_still_reads_every_l2(make_agent: AgentFactory) -> None:
    shown: list[Any] = []

    def integrate(children: list[ChildL2], current: str | None) -> IntegrationResult:
        shown.extend(c.l2 for c in children)
        return IntegrationResult(synthesis="flat")

    agent = make_agent(model=ScriptedChatModel(default="r"), integrate_fn=integrate)
    okr(agent)
    result = agent.integrate()
    assert isinstance(result, IntegrationResult)
    assert len(shown) == 6
    with pytest.raises(InvalidInputError, match="mode"):
        agent.integrate(mode="sideways")  # type: ignore[call-overload]
