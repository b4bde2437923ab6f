"""The graph's edge in `messages`: a `MessagesState` parent, a `langgraph_supervisor`
worker, runs that do not inherit the previous run's input, the `messages` stream, and the
input and output schemas (on Python 3.11 too)."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph_supervisor import create_supervisor

from stello_graph import MainSession, build_stello_graph
from stello_graph.checkpoints import InMemoryMainStorage
from stello_graph.errors import InvalidInputError, ModelCallError, SessionNotFoundError
from stello_graph.testing import ScriptedChatModel

THREAD: Any = {"configurable": {"thread_id": "t"}}


def stello(model: ScriptedChatModel, **settings: Any) -> tuple[Any, InMemoryMainStorage, str]:
    storage = InMemoryMainStorage()
    main = MainSession.create(storage)
    graph = build_stello_graph(model, storage, **settings).compile(name="stello")
    return graph, storage, main.id


def test_a_node_of_a_messages_state_graph() -> None:
    graph, storage, main = stello(ScriptedChatModel(["Hello from stello."]))
    parent = StateGraph(MessagesState)
    parent.add_node("stello", graph)
    parent.add_edge(START, "stello")
    app = parent.compile(checkpointer=InMemorySaver())
    out = app.invoke({"messages": [HumanMessage("Hi", id="u1")]}, THREAD)
    # the user message is merged with the parent's (same id), the reply added once
    assert [(m.type, m.content) for m in out["messages"]] == [
        ("human", "Hi"),
        ("ai", "Hello from stello."),
    ]
    assert out["messages"][0].id == "u1"
    assert [m.content for m in storage.list_records(main)] == ["Hi", "Hello from stello."]


@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")  # langgraph-supervisor
def test_a_supervisor_worker() -> None:
    worker, storage, main = stello(ScriptedChatModel(["The branch says: ship it."]))
    boss = ScriptedChatModel(
        [ScriptedChatModel.tool_call("transfer_to_stello", {}), "Shipping, then."]
    )
    app = create_supervisor([worker], model=boss).compile()
    out = app.invoke({"messages": [HumanMessage("Should we ship?")]})
    texts = [m.content for m in out["messages"] if isinstance(m, AIMessage)]
    assert "The branch says: ship it." in texts and texts[-1] == "Shipping, then."
    # the worker's turn got the user's question, not the supervisor's handoff messages
    assert storage.list_records(main)[0].content == "Should we ship?"


def test_messages_session_from_configurable() -> None:
    graph, storage, main = stello(ScriptedChatModel(default="ok"))
    child = graph.invoke({"op": "fork", "session_id": main, "fork": {"label": "A"}})["forked"]
    out = graph.invoke(
        {"messages": [HumanMessage("to the child")]},
        {"configurable": {"session_id": child["session_id"]}},
    )
    assert out["session_id"] == child["session_id"]
    assert storage.count_records(child["session_id"]) == 2 and storage.count_records(main) == 0


def test_the_next_run_does_not_inherit_the_input() -> None:
    storage = InMemoryMainStorage()
    main = MainSession.create(storage).id
    builder = build_stello_graph(
        ScriptedChatModel(default="ok"), storage, consolidate_fn=lambda l2, records: "L2"
    )
    graph = builder.compile(checkpointer=InMemorySaver())
    child = graph.invoke({"op": "fork", "session_id": main, "fork": {"label": "A"}}, THREAD)
    child_id = child["forked"]["session_id"]
    turn = graph.invoke({"session_id": child_id, "input": "x"}, THREAD)
    assert turn["session_id"] == child_id and "forked" not in turn
    with pytest.raises(InvalidInputError, match="session_id"):
        graph.invoke({"op": "consolidate"}, THREAD)  # not the child of the run before
    again = graph.invoke({"messages": [HumanMessage("y")]}, THREAD)
    # the thread's first `messages` run starts its own session, not the previous run's child
    assert again["session_id"] not in (main, child_id)
    node = storage.get_node(again["session_id"])
    assert node is not None and node.parent_id == main
    fork = graph.invoke({"op": "fork", "session_id": main, "fork": {"label": "B"}}, THREAD)
    assert "content" not in fork
    assert fork["messages"] == again["messages"]  # the thread's conversation, as it was


def test_a_failed_run_leaves_nothing_to_the_next() -> None:
    storage = InMemoryMainStorage()
    main = MainSession.create(storage).id
    model = ScriptedChatModel([RuntimeError("provider down"), "fine"])
    graph = build_stello_graph(model, storage).compile(checkpointer=InMemorySaver())
    child = graph.invoke({"op": "fork", "session_id": main, "fork": {"label": "A"}}, THREAD)
    with pytest.raises(ModelCallError):
        graph.invoke({"session_id": child["forked"]["session_id"], "input": "x"}, THREAD)
    out = graph.invoke({"messages": [HumanMessage("y")]}, THREAD, context={"session_id": main})
    assert out["session_id"] == main and out["content"] == "fine"
    fork = graph.invoke({"op": "fork", "session_id": main, "fork": {"label": "B"}}, THREAD)
    assert not fork.get("pending") and "content" not in fork


def test_a_bad_messages_input_is_refused() -> None:
    graph, _, _ = stello(ScriptedChatModel(default="ok"))
    with pytest.raises(InvalidInputError, match="user message"):
        graph.invoke({"messages": [AIMessage("only the assistant")]})
    with pytest.raises(InvalidInputError, match="list of messages"):
        graph.invoke({"messages": "hello"})
    with pytest.raises(InvalidInputError, match="not both"):
        graph.invoke({"session_id": "x", "input": "a", "messages": [HumanMessage("b")]})
    with pytest.raises(SessionNotFoundError):
        graph.invoke({"messages": [HumanMessage("x")]}, {"configurable": {"session_id": "nope"}})


async def test_the_messages_stream_carries_the_models_tokens_only() -> None:
    graph, _, _ = stello(ScriptedChatModel(["three little words"]))
    ask = {"messages": [HumanMessage("Hello")]}
    seen = [item async for item in graph.astream(ask, stream_mode="messages")]
    assert seen
    for message, metadata in seen:
        assert isinstance(message, AIMessageChunk), message  # no echo, no RemoveMessage
        assert metadata["langgraph_node"] == "model"
    assert "".join(str(m.content) for m, _ in seen) == "three little words"


def test_schemas() -> None:
    graph, _, _ = stello(ScriptedChatModel(default="ok"))
    inputs, outputs = graph.get_input_jsonschema(), graph.get_output_jsonschema()
    assert {"session_id", "input", "messages", "op", "fork"} <= set(inputs["properties"])
    assert {"content", "messages", "session_id", "forked"} <= set(outputs["properties"])
    with pytest.warns(Warning, match="beta"):  # Runnable.as_tool is a beta API
        as_tool = graph.as_tool(name="stello", description="Ask stello.")
    assert {"session_id", "input", "messages"} <= set(as_tool.args)
