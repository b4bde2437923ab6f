"""The turn graph and the whole graph share their threads: the whole graph continues a
turn the turn graph began, and a run that crashed right after its input (before its START
step) is resumed.
"""

from __future__ import annotations

from typing import Any

from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import StateGraph

from stello_graph import StelloAgent
from stello_graph.checkpoints import InMemoryMainStorage
from stello_graph.graph import build_turn_graph
from stello_graph.testing import ScriptedChatModel
from tests.orchestration.conftest import lose_last_checkpoint


@tool
def lookup(query: str) -> str:
    """Look a fact up."""
    return f"fact about {query}"


def _agent(model: ScriptedChatModel, **kw: Any) -> StelloAgent:
    return StelloAgent(
        model=model,
        storage=InMemoryMainStorage(),
        checkpointer=InMemorySaver(),
        durability="sync",  # LangGraph's every checkpoint, as it makes them
        **kw,
    )


def _steps(agent: StelloAgent, sid: str) -> list[tuple[str, int]]:
    found: list[Any] = [
        state.metadata for state in agent.graph.get_state_history(agent.config(sid))
    ]
    return [(meta["source"], meta["step"]) for meta in found][::-1]


def _answering() -> tuple[ScriptedChatModel, StelloAgent, str, Any]:
    """A model with one answer, an agent that keeps its checkpoints, its main session and
    that session's thread config."""
    model = ScriptedChatModel(["the answer"])
    agent = _agent(model, prune_checkpoints=False)
    return model, agent, agent.main_session_id, agent.config(agent.main_session_id)


def _answered(model: ScriptedChatModel, agent: StelloAgent, sid: str) -> None:
    assert model.call_count == 1
    assert [m.text for m in agent.session(sid).messages()] == ["q", "the answer"]
    agent.close()


def test_the_whole_graph_continues_a_turn_the_turn_graph_began() -> None:
    model, agent, sid, config = _answering()
    agent._turn_graph.invoke({"session_id": sid, "input": "q"}, config, interrupt_before=["model"])
    assert agent.graph.get_state(config).next == ("model",)
    assert model.call_count == 0
    assert agent.graph.invoke(None, config)["content"] == "the answer"
    _answered(model, agent, sid)


def test_a_run_written_to_start_still_runs_its_start_step() -> None:
    model, agent, sid, config = _answering()
    # a run with its input on START and its START step done ...
    earlier = StateGraph.compile(build_turn_graph(agent._runtime), checkpointer=agent.checkpointer)
    earlier.invoke({"session_id": sid, "input": "q"}, config, interrupt_before=["model"])
    assert _steps(agent, sid) == [("input", -1), ("loop", 0)]
    lose_last_checkpoint(agent, sid)  # ... or not: a crash right after its input
    assert agent.graph.get_state(config).next == ("__start__",)
    assert agent.resume(sid).content == "the answer"
    _answered(model, agent, sid)
