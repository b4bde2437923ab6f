"""Time travel branches, never duplicates: a run from an earlier checkpoint of a stello
thread, an edit of its `messages`, or a parent graph replaying its own history goes on from
a fork of the session at the turn the conversation stood at; a checkpoint in the middle of
a turn is refused with `TimeTravelError` before anything is written."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.types import Command, interrupt

from stello_graph import MainSession, TimeTravelError, build_stello_graph
from stello_graph.checkpoints import InMemoryMainStorage
from stello_graph.testing import ScriptedChatModel

THREAD: Any = {"configurable": {"thread_id": "t"}}


@tool
def approve(action: str) -> str:
    """Ask a human to approve an action."""
    return f"{action}: {interrupt(action)}"


def echo() -> ScriptedChatModel:
    """A model that answers `re:<the user's last message>`."""
    return ScriptedChatModel(respond=lambda msgs: f"re:{msgs[-1].content}")


def graph_and_storage(model: ScriptedChatModel) -> tuple[Any, InMemoryMainStorage, str]:
    storage = InMemoryMainStorage()
    main = MainSession.create(storage)
    builder = build_stello_graph(model, storage, tools=[approve])
    return builder.compile(checkpointer=InMemorySaver()), storage, main.id


def texts(storage: InMemoryMainStorage, sid: str) -> list[str]:
    return [str(m.content) for m in storage.list_records(sid)]


def branches(storage: InMemoryMainStorage, source: str) -> list[Any]:
    """The sessions forked from `source` (a thread's own session is forked from main)."""
    found = [(m, storage.get_lineage(m.id)) for m in storage.list_sessions()]
    return [m for m, point in found if point is not None and point.source_id == source]


def ask(text: str) -> dict[str, Any]:
    return {"messages": [HumanMessage(text)]}


def input_of_turn(graph: Any, n: int, config: Any = THREAD) -> Any:
    """The input checkpoint of the thread's `n`-th run (1-based)."""
    inputs = [s for s in graph.get_state_history(config) if s.metadata["source"] == "input"]
    return list(reversed(inputs))[n - 1]


def end_of_turn(graph: Any, n: int, config: Any = THREAD) -> Any:
    """The last checkpoint of the thread's `n`-th run (nothing pending)."""
    ends = [s for s in graph.get_state_history(config) if not s.next]
    return list(reversed(ends))[n - 1]


def test_replaying_a_turn_goes_on_from_a_fork_at_the_turn_before_it() -> None:
    graph, storage, main = graph_and_storage(echo())
    for text in ("first", "second", "third"):
        graph.invoke({"session_id": main, "input": text}, THREAD)
    out = graph.invoke(None, input_of_turn(graph, 2).config)  # asks "second" again
    assert texts(storage, main) == ["first", "re:first", "second", "re:second", "third", "re:third"]
    [branch] = branches(storage, main)
    point = storage.get_lineage(branch.id)
    assert point is not None and point.at_turn == 1
    assert branch.label == "Main Session (from turn 1)"
    assert texts(storage, branch.id) == ["first", "re:first", "second", "re:second"]
    assert out["session_id"] == branch.id and out["content"] == "re:second"


def test_a_thread_replayed_from_an_earlier_turn_moves_to_the_branch() -> None:
    graph, storage, main = graph_and_storage(echo())
    for text in ("one", "two", "three"):
        graph.invoke(ask(text), THREAD)
    [thread_session] = branches(storage, main)
    sid = thread_session.id
    # Studio's edit of the second message: a run from the checkpoint before it
    edited = graph.invoke(ask("two, edited"), end_of_turn(graph, 1).config)
    assert texts(storage, sid) == ["one", "re:one", "two", "re:two", "three", "re:three"]
    [branch] = branches(storage, sid)
    assert texts(storage, branch.id) == ["one", "re:one", "two, edited", "re:two, edited"]
    conversation = [m.content for m in edited["messages"]]
    assert conversation == ["one", "re:one", "two, edited", "re:two, edited"]
    # the thread goes on on the branch: its latest checkpoint is the edited conversation's
    graph.invoke(ask("four"), THREAD)
    assert graph.get_state(THREAD).values["thread_session"] == branch.id
    assert texts(storage, branch.id)[-2:] == ["four", "re:four"]
    assert texts(storage, sid)[-1] == "re:three" and len(branches(storage, sid)) == 1


def test_a_run_at_the_latest_turn_does_not_fork() -> None:
    graph, storage, main = graph_and_storage(echo())
    graph.invoke(ask("one"), THREAD)
    graph.invoke(ask("two"), end_of_turn(graph, 1).config)  # the latest, named by its id
    graph.invoke(ask("three"), THREAD)
    [sid] = [m.id for m in branches(storage, main)]
    assert texts(storage, sid) == ["one", "re:one", "two", "re:two", "three", "re:three"]
    assert branches(storage, sid) == []


def test_a_checkpoint_in_the_middle_of_a_turn_is_refused_and_nothing_is_written() -> None:
    graph, storage, main = graph_and_storage(echo())
    graph.invoke({"session_id": main, "input": "first"}, THREAD)
    graph.invoke({"session_id": main, "input": "second"}, THREAD)
    mid_turn = next(s for s in graph.get_state_history(THREAD) if s.next == ("model",))
    with pytest.raises(TimeTravelError, match="at_turn"):
        graph.invoke(None, mid_turn.config)
    with pytest.raises(TimeTravelError, match="middle of a turn"):
        graph.update_state(mid_turn.config, {"messages": [HumanMessage("edited")]})
    assert texts(storage, main) == ["first", "re:first", "second", "re:second"]
    assert len(storage.list_sessions()) == 1


def test_editing_the_messages_branches_and_other_keys_are_refused() -> None:
    graph, storage, main = graph_and_storage(echo())
    graph.invoke(ask("one"), THREAD)
    graph.invoke(ask("two"), THREAD)
    [sid] = [m.id for m in branches(storage, main)]
    with pytest.raises(TimeTravelError, match="only `messages`"):
        graph.update_state(THREAD, {"content": "edited"})
    # LangGraph's fork: an edit at the end of the first turn, then a run from it
    config = graph.update_state(end_of_turn(graph, 1).config, {"messages": []})
    graph.invoke(ask("two, again"), config)
    [branch] = branches(storage, sid)
    assert texts(storage, branch.id) == ["one", "re:one", "two, again", "re:two, again"]
    assert texts(storage, sid) == ["one", "re:one", "two", "re:two"]


def build_parent(graph: Any) -> Any:
    parent = StateGraph(MessagesState)
    parent.add_node("stello", graph)
    parent.add_edge(START, "stello")
    return parent.compile(checkpointer=InMemorySaver())


def test_a_parent_graph_replaying_its_history_branches_and_follows_the_branch() -> None:
    storage = InMemoryMainStorage()
    main = MainSession.create(storage).id
    app = build_parent(build_stello_graph(echo(), storage).compile(name="stello"))
    for text in ("one", "two", "three"):
        app.invoke(ask(text), THREAD)
    before_two = next(
        s for s in app.get_state_history(THREAD)
        if s.next == ("stello",) and s.values["messages"][-1].content == "two"
    )  # fmt: skip
    app.invoke(None, before_two.config)  # replay: "two" asked again
    assert texts(storage, main) == ["one", "re:one", "two", "re:two", "three", "re:three"]
    [branch] = branches(storage, main)
    assert texts(storage, branch.id) == ["one", "re:one", "two", "re:two"]
    out = app.invoke(ask("four"), THREAD)  # the parent's state is on the branch now
    assert [m.content for m in out["messages"]][-2:] == ["four", "re:four"]
    assert texts(storage, branch.id)[-2:] == ["four", "re:four"]
    assert texts(storage, main)[-1] == "re:three"


async def test_async_replay_and_edit_branch() -> None:
    graph, storage, main = graph_and_storage(echo())
    for text in ("one", "two"):
        await graph.ainvoke(ask(text), THREAD)
    [sid] = [m.id for m in branches(storage, main)]
    ends = [s async for s in graph.aget_state_history(THREAD) if not s.next]
    await graph.ainvoke(ask("two, again"), ends[-1].config)
    config = await graph.aupdate_state(ends[-1].config, {"messages": []})
    await graph.ainvoke(ask("two, once more"), config)
    with pytest.raises(TimeTravelError):
        await graph.aupdate_state(THREAD, {"session_id": main})
    found = sorted(texts(storage, b.id)[2] for b in branches(storage, sid))
    assert found == ["two, again", "two, once more"]
    assert texts(storage, sid) == ["one", "re:one", "two", "re:two"]


def test_continuing_the_latest_checkpoint_is_not_time_travel() -> None:
    model = ScriptedChatModel([ScriptedChatModel.tool_call("approve", {"action": "go"}), "ok"])
    graph, storage, main = graph_and_storage(model)
    graph.invoke({"session_id": main, "input": "please"}, THREAD)
    latest = graph.get_state(THREAD)
    assert latest.interrupts
    out = graph.invoke(Command(resume="yes"), latest.config)  # names the latest checkpoint
    assert out["content"] == "ok"
    assert storage.list_records(main)[2].content == "go: yes"
    assert len(storage.list_sessions()) == 1


def boss_with(agent: Any) -> tuple[Any, Any]:
    """A parent agent graph (model, then a tool node) asking the main session through
    `as_tool` whatever the user says; its checkpointer keeps the parent's history."""
    from langgraph.prebuilt import ToolNode, tools_condition

    from stello_graph.testing import ScriptedChatModel as Scripted

    tool = agent.as_tool(agent.main_session_id, name="ask_main")
    boss = Scripted(
        respond=lambda msgs: (
            Scripted.tool_call("ask_main", {"question": msgs[-1].content})
            if msgs[-1].type == "human"
            else f"boss: {msgs[-1].content}"
        )
    )

    def think(state: MessagesState) -> dict[str, Any]:
        return {"messages": [boss.invoke(state["messages"])]}

    parent = StateGraph(MessagesState)
    parent.add_node("boss", think)
    parent.add_node("tools", ToolNode([tool]))
    parent.add_edge(START, "boss")
    parent.add_conditional_edges("boss", tools_condition)
    parent.add_edge("tools", "boss")
    return parent.compile(checkpointer=InMemorySaver()), tool


def before_call(app: Any, question: str) -> Any:
    return next(
        s for s in app.get_state_history(THREAD)
        if s.next == ("tools",)
        and s.values["messages"][-1].tool_calls[0]["args"]["question"] == question
    )  # fmt: skip


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_parent_replaying_an_as_tool_call_gets_the_stored_answer(mode: str) -> None:
    from stello_graph import StelloAgent

    with StelloAgent(model=echo(), storage=":memory:") as agent:
        app, _ = boss_with(agent)
        for text in ("one", "two", "three"):
            app.invoke(ask(text), THREAD)
        main = agent.main_session_id
        stored = ["one", "re:one", "two", "re:two", "three", "re:three"]
        assert [str(m.content) for m in agent.storage.list_records(main)] == stored
        replay = before_call(app, "two").config
        out = app.invoke(None, replay) if mode == "sync" else await app.ainvoke(None, replay)
        assert out["messages"][-1].content == "boss: re:two"  # the answer L3 holds
        assert [str(m.content) for m in agent.storage.list_records(main)] == stored


def test_a_tool_call_id_reused_for_another_question_asks_a_new_turn() -> None:
    from langchain_core.messages import ToolCall

    from stello_graph import StelloAgent

    with StelloAgent(model=echo(), storage=":memory:") as agent:
        _, tool = boss_with(agent)
        graph_config: Any = {"metadata": {"langgraph_node": "tools"}}
        for question in ("first", "second"):  # a provider that numbers its calls per run
            call = ToolCall(name="ask_main", args={"question": question}, id="call_0")
            tool.invoke({**call, "type": "tool_call"}, graph_config)
        texts_ = [str(m.content) for m in agent.storage.list_records(agent.main_session_id)]
        assert texts_ == ["first", "re:first", "second", "re:second"]


def test_a_conversation_whose_session_was_removed_goes_on_in_the_main_session() -> None:
    storage = InMemoryMainStorage()
    main = MainSession.create(storage).id
    app = build_parent(build_stello_graph(echo(), storage).compile(name="stello"))
    app.invoke(ask("one"), THREAD)
    app.invoke(ask("two"), THREAD)
    first = next(s for s in app.get_state_history(THREAD) if len(s.values["messages"]) == 2)
    app.invoke(ask("two, again"), first.config)  # the parent's conversation moves to a branch
    [branch] = branches(storage, main)
    storage.remove_node(branch.id, cascade=True)
    out = app.invoke(ask("three"), THREAD)
    assert out["messages"][-1].content == "re:three"
    assert texts(storage, main)[-2:] == ["three", "re:three"]


@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")  # langgraph-supervisor
def test_a_supervisor_replaying_a_workers_turn_branches() -> None:
    from langgraph_supervisor import create_supervisor

    storage = InMemoryMainStorage()
    main = MainSession.create(storage).id
    worker = build_stello_graph(echo(), storage).compile(name="stello")
    boss = ScriptedChatModel(
        respond=lambda msgs: (
            ScriptedChatModel.tool_call("transfer_to_stello", {})
            if msgs[-1].type == "human"
            else "ok"
        )
    )
    app = create_supervisor([worker], model=boss).compile(checkpointer=InMemorySaver())
    for text in ("one", "two", "three"):
        app.invoke(ask(text), THREAD)
    inputs = [
        s for s in app.get_state_history(THREAD) if (s.metadata or {}).get("source") == "input"
    ]
    app.invoke(None, list(reversed(inputs))[1].config)  # "two" asked again
    assert texts(storage, main) == ["one", "re:one", "two", "re:two", "three", "re:three"]
    [branch] = branches(storage, main)
    assert texts(storage, branch.id) == ["one", "re:one", "two", "re:two"]
    app.invoke(ask("four"), THREAD)  # the supervisor's conversation follows the branch
    assert texts(storage, branch.id)[-2:] == ["four", "re:four"]
