"""A checkpointed thread of the stello graph is one conversation: its first `messages` run
binds it to a session (a new child of the main session, or the one the run names), later
runs continue it, its state's `messages` holds the whole conversation, and a new thread
never sees another thread's. `StelloContext` (LangGraph v1's `context=`) names the session."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver

from stello_graph import MainSession, build_stello_graph
from stello_graph.checkpoints import InMemoryMainStorage
from stello_graph.testing import ScriptedChatModel

if TYPE_CHECKING:  # imported where it is tested, so each test fails on its own without it
    from stello_graph import StelloContext


def thread(name: str) -> Any:
    return {"configurable": {"thread_id": name}}


def ask(text: str) -> dict[str, Any]:
    return {"messages": [HumanMessage(text)]}


@pytest.fixture(params=["memory", "sqlite"])
def saver(request: pytest.FixtureRequest) -> Iterator[BaseCheckpointSaver[Any]]:
    if request.param == "memory":
        yield InMemorySaver()
        return
    conn = sqlite3.connect(":memory:", check_same_thread=False)
    try:
        yield SqliteSaver(conn)
    finally:
        conn.close()


def stello(saver: BaseCheckpointSaver[Any]) -> tuple[Any, ScriptedChatModel, Any, str]:
    model = ScriptedChatModel(respond=lambda messages: f"re: {messages[-1].text}")
    storage = InMemoryMainStorage()
    main = MainSession.create(storage).id
    graph = build_stello_graph(model, storage).compile(checkpointer=saver)
    return graph, model, storage, main


def texts(messages: Any) -> list[tuple[str, str]]:
    return [(m.type, m.text) for m in messages]


BOTH = [("human", "apple"), ("ai", "re: apple"), ("human", "banana"), ("ai", "re: banana")]


def test_a_threads_state_holds_its_whole_conversation(saver: BaseCheckpointSaver[Any]) -> None:
    graph, _, storage, main = stello(saver)
    first = graph.invoke(ask("apple"), thread("one"))
    second = graph.invoke(ask("banana"), thread("one"))
    assert texts(second["messages"]) == BOTH
    assert texts(graph.get_state(thread("one")).values["messages"]) == BOTH
    # the thread is one session, a child of the main session labelled from its first message
    sid = first["session_id"]
    assert second["session_id"] == sid != main
    node = storage.get_node(sid)
    assert node.parent_id == main and storage.get_session(sid).label == "apple"
    assert [m.text for m in storage.list_records(sid)] == [text for _, text in BOTH]
    assert storage.count_records(main) == 0


def test_a_new_thread_sees_none_of_another_threads_conversation(
    saver: BaseCheckpointSaver[Any],
) -> None:
    graph, model, _, _ = stello(saver)
    graph.invoke(ask("apple"), thread("one"))
    graph.invoke(ask("banana"), thread("one"))
    out = graph.invoke(ask("cherry"), thread("two"))
    prompt = " ".join(m.text for m in model.calls[-1].messages)
    assert "cherry" in prompt and "apple" not in prompt and "banana" not in prompt
    assert texts(out["messages"]) == [("human", "cherry"), ("ai", "re: cherry")]
    # reopening the first thread shows its whole conversation, in its state and its history
    assert texts(graph.get_state(thread("one")).values["messages"]) == BOTH
    history = list(graph.get_state_history(thread("one")))
    assert texts(history[0].values["messages"]) == BOTH
    # and it goes on where it was: the next prompt there holds the thread's own conversation
    graph.invoke(ask("date"), thread("one"))
    prompt = " ".join(m.text for m in model.calls[-1].messages)
    assert "apple" in prompt and "banana" in prompt and "cherry" not in prompt


def test_the_run_context_names_the_session(saver: BaseCheckpointSaver[Any]) -> None:
    graph, _, storage, main = stello(saver)
    child = graph.invoke({"op": "fork", "session_id": main, "fork": {"label": "A"}}, thread("f"))
    sid = child["forked"]["session_id"]
    context: StelloContext = {"session_id": sid}
    out = graph.invoke(ask("to the child"), thread("one"), context=context)
    assert out["session_id"] == sid and storage.count_records(sid) == 2
    # the thread is bound to it: its next run, naming nothing, continues it
    again = graph.invoke(ask("more"), thread("one"))
    assert again["session_id"] == sid and storage.count_records(sid) == 4
    assert storage.count_records(main) == 0
    # `configurable` still names it too
    conf = {"configurable": {"thread_id": "two", "session_id": main}}
    assert graph.invoke(ask("to main"), conf)["session_id"] == main


async def test_async_runs_keep_the_thread_too() -> None:
    graph, model, _, _ = stello(InMemorySaver())
    await graph.ainvoke(ask("apple"), thread("one"))
    await graph.ainvoke(ask("banana"), thread("one"))
    state = await graph.aget_state(thread("one"))
    assert texts(state.values["messages"]) == BOTH
    await graph.ainvoke(ask("cherry"), thread("two"))
    assert "apple" not in " ".join(m.text for m in model.calls[-1].messages)


def test_the_context_schema_is_published() -> None:
    from stello_graph import StelloContext

    assert StelloContext.__annotations__.keys() == {"tree_id", "session_id"}
    graph, _, _, _ = stello(InMemorySaver())
    schema = graph.get_context_jsonschema()
    assert schema is not None and {"tree_id", "session_id"} <= set(schema["properties"])
