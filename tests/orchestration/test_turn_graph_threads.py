"""The turn graph and the whole graph share their threads: the whole graph continues a
turn the turn graph began, and a run that crashed right after its input (before its START
step) is resumed; the agent's own savers hold a run's first steps, with or without a START
step (a thread an earlier version began has none).
"""

from __future__ import annotations

from typing import Any

from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import StateGraph

from stello_graph import StelloAgent
from stello_graph.checkpoints import InMemoryMainStorage
from stello_graph.checkpoints._threaded_saver import HELD_CHECKPOINTS, HeldRuns
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


def _put(held: HeldRuns, parent: str | None, checkpoint: str, new: dict[str, Any]) -> bool:
    conf: dict[str, Any] = {"thread_id": "t", "checkpoint_ns": ""}
    if parent is not None:
        conf["checkpoint_id"] = parent
    source: Any = "input" if parent is None else "loop"
    found = held.hold_put({"configurable": conf}, checkpoint, {"source": source}, new, "op",
                          enabled=True)  # fmt: skip
    return found is not None


def _writes(held: HeldRuns, after: str) -> bool:
    config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": after}}
    return held.hold_writes(config, "writes")


def test_a_run_without_a_start_step_is_held_up_to_its_first_node_step() -> None:
    held = HeldRuns()
    assert _put(held, None, "1", {"input": 1, "branch:to:model": 1})
    assert _writes(held, "1")  # the model step's results
    assert _put(held, "1", "2", {"pending": 2})
    assert not _writes(held, "2")  # a tool round's results: written
    assert not _put(held, "2", "3", {"pending": 3})
    assert held["t"].size == HELD_CHECKPOINTS - 1


def test_a_run_with_a_start_step_is_held_up_to_its_first_node_step() -> None:
    held = HeldRuns()
    assert _put(held, None, "1", {"__start__": 1})
    assert _writes(held, "1")  # the START step's
    assert _put(held, "1", "2", {"input": 2, "branch:to:model": 2})
    assert _writes(held, "2")  # the first node's
    assert _put(held, "2", "3", {"pending": 3})
    assert not _writes(held, "3")
    assert not _put(held, "3", "4", {"pending": 4})
