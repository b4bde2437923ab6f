"""Tree integration is all or nothing: a failure at any level writes no synthesis, no subtree
synthesis and no insight, like a failed flat integration.

Every level still sees the subtree syntheses the level below just made (passed along in
memory, since nothing is written before the end).
"""

from __future__ import annotations

import pytest

from stello_graph import ChildL2, IntegrationError, IntegrationResult, StelloAgent
from stello_graph.testing import ScriptedChatModel
from tests.orchestration.conftest import AgentFactory
from tests.orchestration.test_tree import okr

UNDER = "\n\nWhat the sessions under it found: "


class Integrator:
    """Names each node's synthesis after the run (`tag`); fails at the node `fail_at`."""

    def __init__(self, tag: str, fail_at: str | None = None) -> None:
        self.names: dict[str, str] = {}
        self.tag, self.fail_at = tag, fail_at
        self.seen: dict[str, list[str]] = {}

    def bind(self, ids: dict[str, str]) -> dict[str, str]:
        """Name the sessions of the tree `ids` (made once the agent is); return `ids`."""
        self.names = {v: k for k, v in ids.items()}
        return ids

    def rerun(self, tag: str, fail_at: str | None = None) -> None:
        """Act as a new run's function: named `tag`, failing at `fail_at`, nothing seen."""
        self.tag, self.fail_at, self.seen = tag, fail_at, {}

    def __call__(self, children: list[ChildL2], current: str | None) -> IntegrationResult:
        first = self.names[children[0].session_id]
        node = "O" if first.startswith("KR") else f"KR{first[1]}"
        self.seen[node] = [c.l2 for c in children]
        if node == self.fail_at:
            raise RuntimeError(f"integration of {node} is down")
        return IntegrationResult(
            synthesis=f"{self.tag} summary of {node}",
            insights={c.session_id: f"{self.tag} {node} -> {self.names[c.session_id]}"
                      for c in children},
        )  # fmt: skip


def snapshot(agent: StelloAgent, ids: dict[str, str]) -> dict[str, object]:
    s = agent.storage
    found: dict[str, object] = {"synthesis": s.get_memory(ids["O"])}
    for name, sid in ids.items():
        if name != "O":
            found[f"subtree {name}"] = s.get_subtree_synthesis(sid)
            found[f"insight {name}"] = s.get_insight(sid)
    return found


async def integrate_tree(agent: StelloAgent, mode: str) -> object:
    if mode == "sync":
        return agent.integrate(mode="tree")
    return await agent.aintegrate(mode="tree")


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("fail_at", ["O", "KR2"])
async def test_failed_tree_integration_writes_nothing(
    make_agent: AgentFactory, mode: str, fail_at: str
) -> None:
    integrator = Integrator("first")
    agent = make_agent(model=ScriptedChatModel(default="r"), integrate_fn=integrator)
    ids = integrator.bind(okr(agent))
    await integrate_tree(agent, mode)
    before = snapshot(agent, ids)
    assert before["synthesis"] == "first summary of O"
    assert before["subtree KR1"] == "first summary of KR1"
    assert before["insight T1a"] == "first KR1 -> T1a"

    events: list[str] = []
    agent.subscribe(lambda e: events.append(e.type))
    integrator.rerun("second", fail_at=fail_at)
    with pytest.raises(IntegrationError, match="is down"):
        await integrate_tree(agent, mode)
    assert snapshot(agent, ids) == before
    assert "integrated" not in events and "insight_pushed" not in events


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_each_level_sees_the_new_syntheses_below(make_agent: AgentFactory, mode: str) -> None:
    recorder = Integrator("first")
    agent = make_agent(model=ScriptedChatModel(default="r"), integrate_fn=recorder)
    ids = recorder.bind(okr(agent))
    await integrate_tree(agent, mode)
    recorder.rerun("second")
    await integrate_tree(agent, mode)
    assert recorder.seen["O"] == [
        f"L2 of KR1{UNDER}second summary of KR1",
        f"L2 of KR2{UNDER}second summary of KR2",
        "L2 of KR3",
    ]
    after = snapshot(agent, ids)
    assert after["synthesis"] == "second summary of O"
    assert after["subtree KR2"] == "second summary of KR2"
    assert after["insight KR1"] == "second O -> KR1"
    assert after["insight T2a"] == "second KR2 -> T2a"
