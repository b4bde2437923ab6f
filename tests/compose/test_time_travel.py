"""Time travel on a stello thread is refused with `TimeTravelError`, history stays readable,
and continuing the latest checkpoint works."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command, interrupt

from stello_graph import MainSession, TimeTravelError, build_stello_graph
from stello_graph.checkpoints import InMemoryMainStorage
from stello_graph.testing import ScriptedChatModel

THREAD: Any = {"configurable": {"thread_id": "t"}}


@tool
def approve(action: str) -> str:
    """Ask a human to approve an action."""
    return f"{action}: {interrupt(action)}"


def graph_and_storage(model: ScriptedChatModel) -> tuple[Any, InMemoryMainStorage, str]:
    storage = InMemoryMainStorage()
    main = MainSession.create(storage)
    builder = build_stello_graph(model, storage, tools=[approve])
    return builder.compile(checkpointer=InMemorySaver()), storage, main.id


def two_turns() -> tuple[Any, InMemoryMainStorage, str]:
    graph, storage, main = graph_and_storage(ScriptedChatModel(["one", "two", "three"]))
    graph.invoke({"session_id": main, "input": "first"}, THREAD)
    graph.invoke({"session_id": main, "input": "second"}, THREAD)
    return graph, storage, main


def test_replaying_an_earlier_turn_is_refused() -> None:
    graph, storage, main = two_turns()
    history = list(graph.get_state_history(THREAD))  # reading the history is fine
    mid_turn = next(s for s in reversed(history) if s.next == ("model",))
    with pytest.raises(TimeTravelError, match="at_turn"):
        graph.invoke(None, mid_turn.config)
    with pytest.raises(TimeTravelError):
        list(graph.stream(None, history[-1].config))
    assert [m.content for m in storage.list_records(main)] == ["first", "one", "second", "two"]


async def test_async_replay_and_state_edits_are_refused() -> None:
    graph, storage, main = two_turns()
    history = [s async for s in graph.aget_state_history(THREAD)]
    with pytest.raises(TimeTravelError):
        await graph.ainvoke(None, history[2].config)
    with pytest.raises(TimeTravelError, match="update_state"):
        await graph.aupdate_state(THREAD, {"content": "edited"})
    with pytest.raises(TimeTravelError, match="update_state"):
        graph.update_state(THREAD, {"content": "edited"})
    assert storage.count_records(main) == 4


def test_continuing_the_latest_checkpoint_is_not_time_travel() -> None:
    model = ScriptedChatModel([ScriptedChatModel.tool_call("approve", {"action": "go"}), "ok"])
    graph, storage, main = graph_and_storage(model)
    graph.invoke({"session_id": main, "input": "please"}, THREAD)
    latest = graph.get_state(THREAD)
    assert latest.interrupts
    out = graph.invoke(Command(resume="yes"), latest.config)  # names the latest checkpoint
    assert out["content"] == "ok"
    assert storage.list_records(main)[2].content == "go: yes"
