"""Whole flows through the public API: brainstorm, scheduler, checkpointers, composition."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Hashable
from pathlib import Path
from typing import Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.store.memory import InMemoryStore

from stello_graph import (
    ChildL2,
    IntegrationResult,
    InvalidInputError,
    MainSession,
    Schedule,
    StelloAgent,
    StelloEvent,
    build_stello_graph,
)
from stello_graph.checkpoints import InMemoryMainStorage, SqliteMainStorage
from stello_graph.testing import ScriptedChatModel
from tests.orchestration.conftest import AgentFactory


def user_texts(prompt: list[BaseMessage]) -> list[str]:
    return [m.text for m in prompt if isinstance(m, HumanMessage)]


def test_flat_brainstorm(make_agent: AgentFactory) -> None:
    """Main + three model-created children, consolidate, integrate, insights once each."""
    labels = ["Pricing", "Onboarding", "Growth"]
    model = ScriptedChatModel(
        [
            ScriptedChatModel.tool_calls([("create_session", {"label": x}) for x in labels]),
            "Three branches are open.",
        ],
        default="branch thoughts",
    )

    def summarise(current: str | None, records: list[BaseMessage]) -> str:
        return f"L2: {records[0].text}"

    def integrate(children: list[ChildL2], current: str | None) -> IntegrationResult:
        return IntegrationResult(
            synthesis=" | ".join(c.l2 for c in children),
            insights={c.session_id: f"insight for {c.label}" for c in children},
        )

    agent = make_agent(model=model, consolidate_fn=summarise, integrate_fn=integrate)
    main_id = agent.main_session_id
    assert agent.turn(main_id, "Let's plan the launch").content == "Three branches are open."
    children = agent.storage.get_children(main_id)
    assert sorted(c.label for c in children) == sorted(labels)  # parallel forks: any order
    for child in children:
        agent.turn(child.id, f"think about {child.label}")
        assert agent.consolidate(child.id) == f"L2: think about {child.label}"
    result = agent.integrate()
    assert result.synthesis.count("L2:") == 3
    assert set(result.insights) == {c.id for c in children}
    assert "L2:" in agent.main.synthesis()  # type: ignore[operator]
    for child in children:
        agent.turn(child.id, "next")
        system = model.prompts[-1][0]
        assert isinstance(system, SystemMessage)
        assert f"insight for {child.label}" in system.text
        agent.turn(child.id, "and again")
        assert f"insight for {child.label}" not in model.prompts[-1][0].text
    # the main session's next prompt carries the synthesis
    agent.turn(main_id, "summary?")
    assert "L2: think about Growth" in model.prompts[-1][0].text
    assert agent.tree().depth(children[0].id) == 1


def test_scheduler_fires_on_exactly_the_nth_turn(make_agent: AgentFactory) -> None:
    started = threading.Event()
    release = threading.Event()
    calls: list[list[str]] = []

    def slow_summary(current: str | None, records: list[BaseMessage]) -> str:
        calls.append([m.text for m in records])
        started.set()
        release.wait(5)
        return f"summary {len(calls)}"

    agent = make_agent(
        model=ScriptedChatModel(default="r"),
        consolidate_fn=slow_summary,
        schedule=Schedule(consolidate_every_n_turns=3),
    )
    sid = agent.fork(agent.main_session_id, "B").id
    agent.turn(sid, "t1")
    agent.turn(sid, "t2")
    assert calls == []
    begin = time.perf_counter()
    agent.turn(sid, "t3")  # triggers consolidation in the background...
    turn_time = time.perf_counter() - begin
    assert started.wait(5)
    assert agent.storage.get_memory(sid) is None  # ...which is still running
    assert turn_time < 2.5  # the turn did not wait for the 5 s the job could take
    release.set()
    assert agent.drain(5)
    assert calls == [["t1", "r", "t2", "r", "t3", "r"]]
    agent.turn(sid, "t4")
    agent.turn(sid, "t5")
    agent.drain(5)
    assert len(calls) == 1
    agent.turn(sid, "t6")
    agent.drain(5)
    assert calls[1] == ["t4", "r", "t5", "r", "t6", "r"]
    assert agent.storage.get_memory(sid) == "summary 2"


def test_integrate_after_consolidate_and_failures_kept(make_agent: AgentFactory) -> None:
    events: list[StelloEvent] = []
    integrations: list[int] = []

    def integrate(children: list[ChildL2], current: str | None) -> IntegrationResult:
        integrations.append(len(children))
        return IntegrationResult(synthesis="s")

    def summary(current: str | None, records: list[BaseMessage]) -> str:
        if "fail" in records[0].text:
            raise RuntimeError("summariser down")
        return "ok summary"

    agent = make_agent(
        model=ScriptedChatModel(default="r"),
        consolidate_fn=summary,
        integrate_fn=integrate,
        schedule=Schedule(
            consolidate_every_n_turns=1, integrate_after_consolidate=True, retry_attempts=2,
            retry_backoff=0.01,
        ),
    )  # fmt: skip
    agent.subscribe(events.append)
    good = agent.fork(agent.main_session_id, "good").id
    bad = agent.fork(agent.main_session_id, "bad").id
    agent.turn(good, "fine")
    agent.turn(bad, "please fail")  # never raises into the turn
    assert agent.drain(10)
    assert integrations and integrations[-1] == 1
    (failure,) = agent.failures(bad)
    assert failure.kind == "consolidate" and failure.attempts == 2
    assert "summariser down" in failure.message
    assert agent.failures(good) == []
    assert any(e.type == "background_error" and e.session_id == bad for e in events)
    assert any(e.type == "consolidated" and e.session_id == good for e in events)


def test_consolidate_on_switch_and_archive(make_agent: AgentFactory) -> None:
    consolidated: list[str] = []

    def summary(current: str | None, records: list[BaseMessage]) -> str:
        consolidated.append(records[0].text)
        return "s"

    agent = make_agent(
        model=ScriptedChatModel(default="r"),
        consolidate_fn=summary,
        schedule=Schedule(consolidate_on_switch=True, consolidate_on_archive=True),
    )
    a = agent.fork(agent.main_session_id, "A").id
    b = agent.fork(agent.main_session_id, "B").id
    agent.turn(a, "in A")
    agent.turn(a, "still A")
    agent.drain(5)
    assert consolidated == []
    agent.turn(b, "now B")  # switching away from A consolidates A
    agent.drain(5)
    assert consolidated == ["in A"]
    agent.archive(b)
    agent.drain(5)
    assert consolidated == ["in A", "now B"]
    assert agent.storage.get_memory(b) == "s"


def test_integrate_every_n_tree_turns(make_agent: AgentFactory) -> None:
    integrations: list[str | None] = []

    def integrate(children: list[ChildL2], current: str | None) -> IntegrationResult:
        integrations.append(current)
        return IntegrationResult(synthesis=f"v{len(integrations)}")

    agent = make_agent(
        model=ScriptedChatModel(default="r"),
        consolidate_fn=lambda c, r: "l2",
        integrate_fn=integrate,
        schedule=Schedule(integrate_every_n_turns=2),
    )
    a = agent.fork(agent.main_session_id, "A").id
    agent.turn(a, "1")
    agent.consolidate(a)
    agent.turn(agent.main_session_id, "2")  # second turn of the tree
    agent.drain(5)
    assert integrations == [None]
    agent.turn(a, "3")
    agent.drain(5)
    assert integrations == [None]


@pytest.mark.parametrize("saver_kind", ["memory", "sqlite"])
def test_compiled_with_sync_checkpointers(saver_kind: str, tmp_path: Path) -> None:
    storage = SqliteMainStorage(tmp_path / "s.db")
    main = MainSession.create(storage)
    graph = build_stello_graph(ScriptedChatModel(default="hello"), storage)
    if saver_kind == "memory":
        compiled = graph.compile(checkpointer=InMemorySaver())
        out = compiled.invoke(
            {"session_id": main.id, "input": "hi"}, {"configurable": {"thread_id": "t"}}
        )
    else:
        with SqliteSaver.from_conn_string(str(tmp_path / "cp.db")) as saver:
            compiled = graph.compile(checkpointer=saver)
            out = compiled.invoke(
                {"session_id": main.id, "input": "hi"}, {"configurable": {"thread_id": "t"}}
            )
    assert out["content"] == "hello"
    assert [m.text for m in main.messages()] == ["hi", "hello"]
    storage.close()


async def test_compiled_with_async_sqlite_saver(tmp_path: Path) -> None:
    storage = SqliteMainStorage(tmp_path / "s.db")
    main = await MainSession.acreate(storage)
    graph = build_stello_graph(ScriptedChatModel(default="hello"), storage)
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "s.db")) as saver:
        compiled = graph.compile(checkpointer=saver)
        config: RunnableConfig = {"configurable": {"thread_id": main.id}}
        out = await compiled.ainvoke({"session_id": main.id, "input": "hi"}, config)
        assert out["content"] == "hello"
        state = await compiled.aget_state(config)
        assert state.values["content"] == "hello"
    assert [m.text for m in await main.amessages()] == ["hi", "hello"]
    storage.close()


async def test_default_sqlite_agent_serves_threads_and_asyncio(tmp_path: Path) -> None:
    agent = StelloAgent(model=ScriptedChatModel(default="r"), storage=str(tmp_path / "a.db"))
    sid = agent.main_session_id
    agent.turn(sid, "sync")
    await agent.aturn(sid, "async")
    assert [m.text for m in agent.session(sid).messages(role="user")] == ["sync", "async"]
    agent.close()
    # reopening loads the same tree
    again = StelloAgent(model=ScriptedChatModel(default="r"), storage=str(tmp_path / "a.db"))
    assert again.main_session_id == sid
    again.close()


def test_graph_as_a_subgraph(tmp_path: Path) -> None:
    storage = InMemoryMainStorage()
    main = MainSession.create(storage)
    stello = build_stello_graph(ScriptedChatModel(default="from stello"), storage).compile()

    class Outer(TypedDict, total=False):
        session_id: str
        input: str
        content: str
        shouted: str

    def shout(state: Outer) -> Outer:
        return {"shouted": state["content"].upper()}

    outer = StateGraph(Outer)
    outer.add_node("stello", stello)
    outer.add_node("shout", shout)
    outer.add_edge(START, "stello")
    outer.add_edge("stello", "shout")
    outer.add_edge("shout", END)
    app = outer.compile(checkpointer=InMemorySaver())
    out = app.invoke({"session_id": main.id, "input": "hi"}, {"configurable": {"thread_id": "x"}})
    assert out["shouted"] == "FROM STELLO"
    assert [m.text for m in main.messages()] == ["hi", "from stello"]


def test_session_as_a_tool_of_another_agent(make_agent: AgentFactory) -> None:
    agent = make_agent(model=ScriptedChatModel(default="Stello says: 42"))
    expert = agent.fork(agent.main_session_id, "Expert")
    ask = agent.as_tool(expert.id, name="ask_expert")
    outer_model = ScriptedChatModel(
        [ScriptedChatModel.tool_call("ask_expert", {"question": "meaning?"}), "It is 42."]
    )

    def call_model(state: MessagesState) -> dict[str, list[AIMessage]]:
        return {"messages": [outer_model.bind_tools([ask]).invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", call_model)
    graph.add_node("tools", ToolNode([ask]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    out = graph.compile().invoke({"messages": [HumanMessage(content="ask the expert")]})
    assert out["messages"][-1].content == "It is 42."
    assert out["messages"][2].content == "Stello says: 42"
    assert [m.text for m in agent.session(expert.id).messages()] == ["meaning?", "Stello says: 42"]


def test_memory_is_published_to_a_store(make_agent: AgentFactory) -> None:
    store = InMemoryStore()
    agent = make_agent(
        model=ScriptedChatModel(default="r"),
        store=store,
        consolidate_fn=lambda c, r: "the l2",
        integrate_fn=lambda children, cur: IntegrationResult(
            synthesis="the synthesis", insights={children[0].session_id: "the insight"}
        ),
    )
    b = agent.fork(agent.main_session_id, "B").id
    agent.turn(b, "x")
    agent.consolidate(b)
    agent.integrate()
    tree = agent.storage.tree_id
    assert store.get(("stello", tree, "l2"), b).value == {"l2": "the l2", "label": "B"}  # type: ignore[union-attr]
    synthesis = store.get(("stello", tree, "synthesis"), agent.main_session_id)
    assert synthesis is not None and synthesis.value == {"synthesis": "the synthesis"}
    insight = store.get(("stello", tree, "insights"), b)
    assert insight is not None and insight.value == {"insight": "the insight"}


def test_graph_ops_fork_consolidate_integrate() -> None:
    storage = InMemoryMainStorage()
    main = MainSession.create(storage)
    graph = build_stello_graph(
        ScriptedChatModel(default="r"),
        storage,
        consolidate_fn=lambda c, r: "l2",
        integrate_fn=lambda ch, cur: IntegrationResult(synthesis="syn"),
    ).compile()
    forked = graph.invoke({"op": "fork", "session_id": main.id, "fork": {"label": "Kid"}})
    kid = forked["forked"]["session_id"]
    assert storage.get_node(kid).parent_id == main.id  # type: ignore[union-attr]
    graph.invoke({"session_id": kid, "input": "hello"})
    assert graph.invoke({"op": "consolidate", "session_id": kid})["l2"] == "l2"
    assert graph.invoke({"op": "integrate"})["integration"]["synthesis"] == "syn"


def test_fork_options_and_events(make_agent: AgentFactory) -> None:
    events: list[dict[str, Any]] = []
    agent = make_agent(model=ScriptedChatModel(default="parent"))
    agent.subscribe(lambda e: events.append(e.as_dict()))
    other_model = ScriptedChatModel(default="child model")
    child = agent.fork(
        agent.main_session_id, "Child", system_prompt="Be brief.", prompt="Hi there.",
        tags=["t"], metadata={"k": 1}, model=other_model,
    )  # fmt: skip
    assert agent.turn(child.id, "hey").content == "child model"
    meta = agent.storage.get_session(child.id)
    assert meta is not None and meta.tags == ("t",) and meta.metadata == {"k": 1}
    texts = [m.text for m in agent.session(child.id).messages()]
    assert texts == ["Hi there.", "hey", "child model"]
    assert events[0]["event"] == "session_forked" and events[0]["label"] == "Child"
    assert json.dumps(events)  # events are JSON-serialisable


def test_nodes_wired_into_a_graph_of_your_own() -> None:
    from langgraph.graph import StateGraph

    from stello_graph import nodes
    from stello_graph.graph import StelloState

    storage = InMemoryMainStorage()
    main = MainSession.create(storage)
    deps = nodes.StelloDeps(storage=storage, model=ScriptedChatModel(default="mine"))
    graph: StateGraph[Any, Any, Any, Any] = StateGraph(StelloState)
    graph.add_node("assemble", nodes.make_assemble_node(deps))
    graph.add_node("model", nodes.make_model_node(deps))
    graph.add_node("tools", nodes.make_tools_node(deps))
    graph.add_node("commit", nodes.make_commit_node(deps))
    graph.add_edge(START, "assemble")  # a step of its own before the first model call
    graph.add_edge("assemble", "model")
    # `model` commits the turn when it needs no tools; `commit` after it stores nothing again
    ends: dict[Hashable, str] = {"tools": "tools", "__end__": "commit"}
    graph.add_conditional_edges("model", nodes.route_after_model, ends)
    graph.add_edge("tools", "model")
    graph.add_edge("commit", END)
    out = graph.compile().invoke({"session_id": main.id, "input": "hello"})
    assert out["content"] == "mine" and out["turn_count"] == 1
    assert [m.text for m in main.messages()] == ["hello", "mine"]


def test_open_sqlite_shares_one_file(tmp_path: Path) -> None:
    from stello_graph.checkpoints import open_sqlite

    storage, saver = open_sqlite(tmp_path / "app.db")
    agent = StelloAgent(
        model=ScriptedChatModel(default="r"), storage=storage, checkpointer=saver,
        prune_checkpoints=False,
    )  # fmt: skip
    agent.turn(agent.main_session_id, "hello")
    sql = "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')"
    tables = {row[0] for row in saver.conn.execute(sql)}
    assert {"checkpoints", "writes", "stello_sessions", "stello_records"} <= tables
    assert saver.get_tuple(agent.config(agent.main_session_id)) is not None
    agent.close()
    saver.close()
    storage.close()


def test_background_error_reaches_a_custom_stream(make_agent: AgentFactory) -> None:
    def failing(current: str | None, records: list[BaseMessage]) -> str:
        raise RuntimeError("summary failed")

    agent = make_agent(
        model=ScriptedChatModel(default="r"),
        consolidate_fn=failing,
        schedule=Schedule(consolidate_every_n_turns=1),
    )
    b = agent.fork(agent.main_session_id, "B").id
    agent.turn(b, "first")  # schedules a consolidation that fails in the background
    assert agent.drain(5)
    items = list(agent.stream(b, "second", stream_mode="custom"))
    assert items[0]["event"] == "background_error"  # the first turn's failure comes first
    assert items[0]["session_id"] == b
    assert "summary failed" in items[0]["message"]
    agent.drain(5)
    items += list(agent.stream(b, "third", stream_mode="custom"))
    agent.drain(5)
    items += list(agent.stream(b, "fourth", stream_mode="custom"))
    reported = [i for i in items if i["event"] == "background_error"]
    # every failure is reported exactly once (the fourth turn's may still be pending)
    assert len(agent.failures(b)) - 1 <= len(reported) <= len(agent.failures(b))


def test_agent_main_session_object_has_the_model(make_agent: AgentFactory) -> None:
    agent = make_agent(
        model=ScriptedChatModel(default="direct"),
        integrate_fn=lambda children, current: IntegrationResult(synthesis="s"),
    )
    assert agent.main.send("hello").content == "direct"
    child = agent.fork(agent.main_session_id, "c")
    agent.storage.put_memory(child.id, "l2")
    assert agent.main.integrate().synthesis == "s"


def test_agent_options_and_tool_names(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="chat model"):
        StelloAgent(model=None, storage=str(tmp_path / "never.db"))
    assert not (tmp_path / "never.db").exists()
    agent = StelloAgent(
        model=ScriptedChatModel(default="r"), storage=InMemoryMainStorage(), main_label="Objective"
    )
    assert agent.main.meta.label == "Objective"
    billing = agent.fork(agent.main_session_id, "Billing & Invoices")
    assert agent.as_tool(billing.id).name == "ask_billing_invoices"
    assert agent.as_tool(billing.id, name="billing").name == "billing"
    agent.close()


def test_a_bad_option_closes_the_storage_the_agent_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed: list[str] = []
    original = SqliteMainStorage.close

    def close(self: SqliteMainStorage) -> None:
        closed.append(str(self.path))
        original(self)

    monkeypatch.setattr(SqliteMainStorage, "close", close)
    path = tmp_path / "opened.db"
    with pytest.raises(InvalidInputError):  # a bad setting: refused before the file opens
        StelloAgent(model=ScriptedChatModel(default="r"), storage=str(path), max_tool_rounds=-1)
    assert closed == [] and not path.exists()
    with pytest.raises(InvalidInputError, match="lease_ttl"):  # refused once it is open
        StelloAgent(model=ScriptedChatModel(default="r"), storage=str(path), lease_ttl=-1)
    assert closed == [str(path)]
