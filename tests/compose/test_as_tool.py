"""`StelloAgent.as_tool` inside `langchain.agents.create_agent`: answers, interrupts that
pause the outer run and resume through it, and inner tokens and events streamed outward."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.types import Command, interrupt

from stello_graph import MainSession, StelloAgent, build_stello_graph
from stello_graph.checkpoints import InMemoryMainStorage
from stello_graph.errors import InvalidInputError
from stello_graph.testing import ScriptedChatModel


@tool
def approve(action: str) -> str:
    """Ask a human to approve an action."""
    return f"{action}: {interrupt({'approve': action})}"


@pytest.fixture
def agent() -> Iterator[StelloAgent]:
    inner = ScriptedChatModel(
        [ScriptedChatModel.tool_call("approve", {"action": "deploy"}), "Deployed, as approved."]
    )
    with StelloAgent(model=inner, storage=InMemoryMainStorage(), tools=[approve]) as found:
        yield found


def outer_model() -> ScriptedChatModel:
    return ScriptedChatModel(
        [ScriptedChatModel.tool_call("ask_ops", {"question": "Deploy it?"}), "Done."]
    )


def config() -> Any:
    return {"configurable": {"thread_id": "outer"}}


def test_an_interrupt_inside_the_turn_pauses_and_resumes_the_outer_run(
    agent: StelloAgent,
) -> None:
    ops = agent.fork(agent.main_session_id, "Ops")
    outer = create_agent(outer_model(), [agent.as_tool(ops.id)], checkpointer=InMemorySaver())
    first = outer.invoke({"messages": [HumanMessage("Ship?")]}, config())
    [waiting] = first["__interrupt__"]
    assert waiting.value == {"approve": "deploy"}
    assert agent.storage.list_records(ops.id) == []  # nothing committed while it waits

    out = outer.invoke(Command(resume="yes"), config())
    answer = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [m.content for m in answer] == ["Deployed, as approved."]
    assert out["messages"][-1].content == "Done."
    records = agent.storage.list_records(ops.id)
    assert [m.type for m in records] == ["human", "ai", "tool", "ai"]
    assert records[2].content == "deploy: yes"


async def test_async_outer_run_resumes_the_turn(agent: StelloAgent) -> None:
    ops = await agent.afork(agent.main_session_id, "Ops")
    outer = create_agent(outer_model(), [agent.as_tool(ops.id)], checkpointer=InMemorySaver())
    first = await outer.ainvoke({"messages": [HumanMessage("Ship?")]}, config())
    assert first["__interrupt__"]
    out = await outer.ainvoke(Command(resume="no"), config())
    assert out["messages"][-1].content == "Done."
    assert (await agent.storage.alist_records(ops.id))[2].content == "deploy: no"


def test_inner_tokens_and_events_stream_through_the_outer_run(agent: StelloAgent) -> None:
    ops = agent.fork(agent.main_session_id, "Ops")
    outer = create_agent(outer_model(), [agent.as_tool(ops.id)], checkpointer=InMemorySaver())
    list(outer.stream({"messages": [HumanMessage("Ship?")]}, config()))
    seen: list[Any] = list(
        outer.stream(
            Command(resume="yes"), config(), stream_mode=["messages", "custom"], subgraphs=True
        )
    )
    inner = [(ns, mode, item) for ns, mode, item in seen if ns]  # from the stello subgraph
    tokens = "".join(
        str(item[0].content) for _, mode, item in inner if mode == "messages" and isinstance(
            item[0], AIMessage
        )
    )  # fmt: skip
    assert "Deployed, as approved." in tokens
    events = [item["event"] for _, mode, item in inner if mode == "custom"]
    assert "tool_result" in events and "turn_committed" in events


def test_outside_a_graph_the_tool_is_a_turn(agent: StelloAgent) -> None:
    ops = agent.fork(agent.main_session_id, "Ops")
    ask = agent.as_tool(ops.id)
    assert ask.name == "ask_ops"
    assert set(ask.args) == {"question"}  # the run's config is injected, not an argument
    with pytest.raises(InvalidInputError, match="resume"):
        ask.invoke({"question": "Deploy it?"})
    assert agent.resume(ops.id, "ok").content == "Deployed, as approved."


def _tokens(seen: list[Any]) -> list[str]:
    return [str(chunk.content) for chunk, _ in seen if isinstance(chunk, AIMessageChunk)]


def test_inner_tokens_reach_a_messages_stream_with_subgraphs_true() -> None:
    """LangGraph's `messages` stream leaves out a subgraph's model tokens unless the run asks
    for them with `subgraphs=True`; the guide shows that one line, and this is it."""
    inner = ScriptedChatModel(default="inner words here")
    with StelloAgent(model=inner, storage=InMemoryMainStorage()) as found:
        ops = found.fork(found.main_session_id, "Ops")
        tools = [found.as_tool(ops.id)]
        outer = create_agent(outer_model(), tools, checkpointer=InMemorySaver())
        ask: Any = {"messages": [HumanMessage("Ship?")]}
        plain = list(outer.stream(ask, config(), stream_mode="messages"))
        assert "inner" not in "".join(_tokens(plain))  # the answer arrives whole, as the result
        again: Any = {"configurable": {"thread_id": "again"}}
        outer = create_agent(outer_model(), tools, checkpointer=InMemorySaver())
        seen = list(outer.stream(ask, again, stream_mode="messages", subgraphs=True))
    tokens = _tokens([item for ns, item in seen if ns])  # from the stello turn inside the tool
    assert tokens[:3] == ["inner", " words", " here"]


def test_a_stello_subgraphs_tokens_reach_a_messages_stream_with_subgraphs_true() -> None:
    storage = InMemoryMainStorage()
    MainSession.create(storage)
    graph = build_stello_graph(ScriptedChatModel(default="sub graph words"), storage)
    parent = StateGraph(MessagesState)
    parent.add_node("stello", graph.compile(name="stello"))
    parent.add_edge(START, "stello")
    app = parent.compile(checkpointer=InMemorySaver())
    ask: Any = {"messages": [HumanMessage("Hi")]}
    plain = list(app.stream(ask, {"configurable": {"thread_id": "a"}}, stream_mode="messages"))
    assert _tokens(plain) == []  # only the parent's state update: the reply, whole
    seen = list(
        app.stream(
            ask, {"configurable": {"thread_id": "b"}}, stream_mode="messages", subgraphs=True
        )
    )
    tokens = _tokens([item for ns, item in seen if ns])
    assert "".join(tokens) == "sub graph words" and len(tokens) > 1
