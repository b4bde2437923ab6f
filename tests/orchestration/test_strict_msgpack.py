"""Every checkpoint of a stello thread loads under LangGraph's strict msgpack mode
(`LANGGRAPH_STRICT_MSGPACK=true`), which loads only LangGraph's and LangChain's own classes:
stello writes LangChain messages and plain values, never a class of its own (a turn's
`messages` output was a `TurnRecords`, which strict mode blocked and the default mode warned
about, "will be blocked in a future version")."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import BaseMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde import _msgpack
from langgraph.types import Overwrite

from stello_graph import StelloAgent
from stello_graph.checkpoints import InMemoryMainStorage
from stello_graph.testing import ScriptedChatModel


@tool
def lookup(query: str) -> str:
    """Look a fact up."""
    return f"fact about {query}"


def loaded_messages(saver: InMemorySaver, config: Any) -> list[Any]:
    """Every write to `messages` kept with the thread's checkpoints, loaded in strict mode (a
    blocked class loads as the dict of its fields; the channels' values are `get_state`'s)."""
    return [
        value
        for kept in saver.list(config)
        for _, channel, value in kept.pending_writes or ()
        if channel == "messages"
    ]


def plain(value: Any) -> bool:
    """Whether `value` is a list of messages (or of the dicts a client sent), as it is or
    wrapped in LangGraph's `Overwrite`."""
    if isinstance(value, Overwrite):
        value = value.value
    return isinstance(value, list) and all(isinstance(m, BaseMessage | dict) for m in value)


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_every_checkpoint_loads_in_strict_mode(
    monkeypatch: pytest.MonkeyPatch, durability: str
) -> None:
    monkeypatch.setattr(_msgpack, "STRICT_MSGPACK_ENABLED", True)  # read by new serializers
    model = ScriptedChatModel(
        ["plain", ScriptedChatModel.tool_call("lookup", {"query": "x"}), "with a tool"]
    )
    saver = InMemorySaver()
    agent = StelloAgent(
        model=model,
        storage=InMemoryMainStorage(),
        checkpointer=saver,
        durability=durability,  # type: ignore[arg-type]
        tools=[lookup],
    )
    sid = agent.main_session_id
    agent.turn(sid, "one")
    agent.turn(sid, "two")
    history = list(agent.graph.get_state_history(agent.config(sid)))
    assert history
    for state in history:  # every checkpoint and every pending write, loaded back
        messages: Any = state.values.get("messages") or []
        assert all(isinstance(m, BaseMessage) for m in messages)
        for task in state.tasks:
            assert task.error is None or isinstance(task.error, Exception)
    last = history[0].values["messages"]
    assert [m.text for m in last][-2:] == ["fact about x", "with a tool"]
    assert all(plain(value) for value in loaded_messages(saver, agent.config(sid)))
    agent.close()


def test_a_messages_run_of_the_graph_loads_in_strict_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """As LangGraph Server runs it: the whole graph, `{"messages": [...]}` in, every
    checkpoint kept by the server's saver."""
    monkeypatch.setattr(_msgpack, "STRICT_MSGPACK_ENABLED", True)
    from stello_graph import build_stello_graph
    from stello_graph.main_session import MainSession

    storage = InMemoryMainStorage()
    MainSession.create(storage)
    saver = InMemorySaver()
    graph = build_stello_graph(ScriptedChatModel(default="hi"), storage).compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": "t1"}}
    for text in ("one", "two"):
        graph.invoke({"messages": [{"role": "user", "content": text}]}, config)
    history = list(graph.get_state_history(config))
    for state in history:  # the thread's conversation, the input added as messages
        assert all(isinstance(m, BaseMessage) for m in state.values.get("messages") or [])
    assert [m.text for m in history[0].values["messages"]] == ["one", "hi", "two", "hi"]
    found = loaded_messages(saver, config)
    assert found and all(plain(value) for value in found)
