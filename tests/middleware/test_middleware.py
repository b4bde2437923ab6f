"""`StelloMiddleware` under LangChain v1's `create_agent`: a session per thread (or per
`StelloContext`), stello's context shown to the model, the run committed to L3 at its end;
and the failures of history-deleting middleware (langchain#38867, #38352, #33856,
deepagents#2874) do not happen."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain_core.messages import AIMessage, BaseMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from stello_graph import (
    ChildL2,
    CompressionPolicy,
    IntegrationResult,
    InvalidInputError,
    MainSession,
    ModelNotConfiguredError,
    Schedule,
    Session,
    SessionNotFoundError,
    StelloContext,
    StelloMiddleware,
    StorageError,
)
from stello_graph.checkpoints import InMemoryMainStorage
from stello_graph.storage import MainStorage
from stello_graph.testing import ScriptedChatModel


@tool
def lookup(query: str) -> str:
    """Look something up."""
    return f"found {query}"


def _agent(
    model: ScriptedChatModel, stello: StelloMiddleware, saver: InMemorySaver | None = None
) -> Any:
    return create_agent(
        model,
        [lookup],
        system_prompt="You are terse.",
        middleware=[stello],
        checkpointer=saver or InMemorySaver(),
        context_schema=StelloContext,
    )


def _ask(agent: Any, thread: str, text: str, **kwargs: Any) -> dict[str, Any]:
    out: dict[str, Any] = agent.invoke(
        {"messages": [{"role": "user", "content": text}]},
        {"configurable": {"thread_id": thread}},
        **kwargs,
    )
    return out


def _texts(messages: list[BaseMessage]) -> list[str]:
    return [m.text for m in messages]


def _child(stello: StelloMiddleware, session_id: str) -> Session:
    found = stello.session(session_id)
    assert isinstance(found, Session)
    return found


def _l3(stello: StelloMiddleware, session_id: str) -> list[str]:
    return _texts(stello.session(session_id).messages())


@pytest.fixture
def storage(main_storage: MainStorage) -> MainStorage:
    """Each backend (PostgreSQL too, when the suite has one)."""
    return main_storage


def test_each_thread_is_its_own_session_and_continues_it(storage: MainStorage) -> None:
    model = ScriptedChatModel(respond=lambda messages: f"re: {messages[-1].text}")
    stello = StelloMiddleware(storage=storage)
    agent = _agent(model, stello)
    one = _ask(agent, "t1", "Plan a trip to Lisbon")
    two = _ask(agent, "t2", "Fix my bike")
    assert one["stello_session_id"] != two["stello_session_id"]
    second_thread_prompt = _texts(model.prompts[1])
    assert not any("Lisbon" in text for text in second_thread_prompt)
    again = _ask(agent, "t1", "And hotels?")
    assert again["stello_session_id"] == one["stello_session_id"]
    seen = _texts(model.prompts[2])
    assert seen[1:] == ["Plan a trip to Lisbon", "re: Plan a trip to Lisbon", "And hotels?"]
    assert not any("bike" in text for text in seen)
    sid = one["stello_session_id"]
    assert _l3(stello, sid) == [*seen[1:], "re: And hotels?"]
    meta = storage.get_session(sid)
    assert meta is not None and meta.label == "Plan a trip to Lisbon"
    node = storage.get_node(sid)
    assert node is not None and node.parent_id == storage.get_main_session().id  # type: ignore[union-attr]


def test_a_run_with_tools_commits_its_whole_tool_round(storage: MainStorage) -> None:
    model = ScriptedChatModel([ScriptedChatModel.tool_call("lookup", {"query": "x"}), "done"])
    stello = StelloMiddleware(storage=storage)
    out = _ask(_agent(model, stello), "t1", "Look up x")
    records = stello.session(out["stello_session_id"]).messages()
    assert [type(m).__name__ for m in records] == [
        "HumanMessage", "AIMessage", "ToolMessage", "AIMessage"
    ]  # fmt: skip
    assert records[2].text == "found x"


def test_stello_context_selects_the_session(storage: MainStorage) -> None:
    model = ScriptedChatModel(respond=lambda messages: f"re: {messages[-1].text}")
    stello = StelloMiddleware(storage=storage)
    agent = _agent(model, stello)
    sid = _ask(agent, "t1", "Budget is 100")["stello_session_id"]
    context: StelloContext = {"session_id": sid}
    out = _ask(agent, "other-thread", "What is the budget?", context=context)
    assert out["stello_session_id"] == sid
    assert "Budget is 100" in _texts(model.prompts[-1])
    assert _l3(stello, sid)[-2:] == ["What is the budget?", "re: What is the budget?"]


def test_stello_context_names_a_tree_of_the_file(tmp_path: Path) -> None:
    model = ScriptedChatModel(default="ok")
    stello = StelloMiddleware(storage=tmp_path / "ideas.db")
    agent = _agent(model, stello)
    out = _ask(agent, "t1", "Hello", context={"tree_id": "work"})
    sid = out["stello_session_id"]
    assert _texts(stello.session(sid, "work").messages()) == ["Hello", "ok"]
    with pytest.raises(SessionNotFoundError):
        stello.session(sid)  # not a session of the default tree
    again = _ask(agent, "t1", "Still here?")  # the thread stays on its tree
    assert again["stello_session_id"] == sid
    assert len(stello.session(sid, "work").messages()) == 4
    moved = _ask(agent, "t1", "Elsewhere", context={"tree_id": "default"})
    assert moved["stello_session_id"] != sid
    assert _l3(stello, moved["stello_session_id"]) == ["Elsewhere", "ok"]
    with pytest.raises(InvalidInputError, match="session_id"):
        _ask(agent, "t2", "Hello", context={"session_id": ""})
    stello.close()


def test_a_failed_model_call_commits_nothing_and_keeps_the_insight(storage: MainStorage) -> None:
    """langchain#38867: a failed call deleted the conversation; here nothing is lost."""
    model = ScriptedChatModel(["first", RuntimeError("provider down")], default="second")
    stello = StelloMiddleware(storage=storage)
    agent = _agent(model, stello)
    sid = _ask(agent, "t1", "Hi")["stello_session_id"]
    _child(stello, sid).set_insight("Mention the deadline.")
    with pytest.raises(RuntimeError, match="provider down"):
        _ask(agent, "t1", "Status?")
    assert _l3(stello, sid) == ["Hi", "first"]
    assert storage.get_insight(sid) == "Mention the deadline."
    _ask(agent, "t1", "Status now?")
    system = model.prompts[-1][0]
    assert isinstance(system, SystemMessage) and "Mention the deadline." in system.text
    assert storage.get_insight(sid) is None  # consumed by the run that showed it
    # the failed run's message stays in the thread and is committed with the next run
    assert _l3(stello, sid) == ["Hi", "first", "Status?", "Status now?", "second"]


def _summarise(previous: str | None, records: list[BaseMessage]) -> str:
    return f"SUMMARY of {len(records)} records"


def test_compressed_prompts_keep_the_system_prompt_and_whole_tool_groups(
    storage: MainStorage,
) -> None:
    """#38352 (orphan ToolMessage after a cut) and #33856 (system message lost)."""

    def respond(messages: list[BaseMessage]) -> Any:
        if isinstance(messages[-1], ToolMessage):
            return "answer " + "y" * 300
        return ScriptedChatModel.tool_call("lookup", {"query": "q" * 300})

    model = ScriptedChatModel(respond=respond)
    policy = CompressionPolicy(context_window=1000, threshold=0.5, keep_recent=0.3,
                               compress_fn=_summarise)  # fmt: skip
    stello = StelloMiddleware(storage=storage, compression=policy)
    agent = _agent(model, stello)
    for i in range(6):
        _ask(agent, "t1", f"question {i} " + "x" * 300)
    assert any("SUMMARY of" in p[0].text for p in model.prompts)  # the prompt was cut
    for prompt in model.prompts:
        assert isinstance(prompt[0], SystemMessage) and prompt[0].text.startswith("You are terse.")
        assert not isinstance(prompt[1], ToolMessage)
        called = {c["id"] for m in prompt if isinstance(m, AIMessage) for c in m.tool_calls}
        assert all(m.tool_call_id in called for m in prompt if isinstance(m, ToolMessage))
    assert len(stello.session(_sid(agent, "t1")).messages()) == 6 * 4


def _sid(agent: Any, thread: str) -> str:
    sid: str = agent.get_state({"configurable": {"thread_id": thread}}).values["stello_session_id"]
    return sid


def test_trim_state_keeps_the_checkpoint_flat(storage: MainStorage) -> None:
    """deepagents#2874: checkpoints grew with every run; L3 holds the history instead."""
    model = ScriptedChatModel(default="ok")
    stello = StelloMiddleware(storage=storage, trim_state=True)
    agent = _agent(model, stello)
    sizes = []
    for i in range(5):
        out = _ask(agent, "t1", f"message {i}")
        state = agent.get_state({"configurable": {"thread_id": "t1"}}).values
        sizes.append(len(state["messages"]))
        assert _texts(out["messages"]) == [f"message {i}", "ok"]
    assert sizes == [2] * 5
    assert len(_l3(stello, _sid(agent, "t1"))) == 10
    assert _texts(model.prompts[-1])[1:4] == ["message 0", "ok", "message 1"]


def test_without_trim_state_the_thread_keeps_the_whole_conversation(
    storage: MainStorage,
) -> None:
    model = ScriptedChatModel(default="ok")
    stello = StelloMiddleware(storage=storage)
    agent = _agent(model, stello)
    for i in range(3):
        out = _ask(agent, "t1", f"message {i}")
    assert len(out["messages"]) == 6
    assert len(_l3(stello, out["stello_session_id"])) == 6  # nothing committed twice


def test_async_runs_bind_threads_and_commit(storage: MainStorage) -> None:
    model = ScriptedChatModel([ScriptedChatModel.tool_call("lookup", {"query": "x"})],
                              respond=lambda messages: f"re: {messages[-1].text}")  # fmt: skip
    stello = StelloMiddleware(storage=storage, trim_state=True)
    agent = _agent(model, stello)

    async def ask(thread: str, text: str) -> dict[str, Any]:
        out: dict[str, Any] = await agent.ainvoke(
            {"messages": [{"role": "user", "content": text}]},
            {"configurable": {"thread_id": thread}},
        )
        return out

    async def main() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        return await ask("a", "one"), await ask("b", "two"), await ask("a", "three")

    first, other, again = asyncio.run(main())
    assert first["stello_session_id"] == again["stello_session_id"] != other["stello_session_id"]
    assert _l3(stello, first["stello_session_id"]) == [
        "one", "", "found x", "re: found x", "three", "re: three"
    ]  # fmt: skip
    assert not any(text == "one" for text in _texts(model.prompts[2]))


def test_a_model_given_by_name_is_built_or_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    built = StelloMiddleware(storage=InMemoryMainStorage(), model="openai:gpt-4o-mini")
    assert type(built._config.model).__name__ == "ChatOpenAI"
    with pytest.raises(InvalidInputError, match="nosuchprovider"):
        StelloMiddleware(storage=InMemoryMainStorage(), model="nosuchprovider:model")
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(ModelNotConfiguredError):
        StelloMiddleware(storage=InMemoryMainStorage(), model="openai:gpt-4o-mini")


def test_a_storage_of_another_tree_is_refused() -> None:
    stello = StelloMiddleware(storage=InMemoryMainStorage())
    agent = _agent(ScriptedChatModel(default="ok"), stello)
    with pytest.raises(InvalidInputError, match="'other'"):
        _ask(agent, "t1", "Hi", context={"tree_id": "other"})


def test_a_tree_that_fails_to_open_closes_the_storage_it_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import stello_graph.agent as agent_module

    opened: list[MainStorage] = []
    real = agent_module._open_storage

    def spy(storage: Any, tree: str) -> MainStorage:
        opened.append(real(storage, tree))
        return opened[-1]

    def no_main(*_: Any) -> str:
        raise RuntimeError("no main session")

    monkeypatch.setattr(agent_module, "_open_storage", spy)
    monkeypatch.setattr(agent_module, "_main_id", no_main)
    with pytest.raises(RuntimeError, match="no main session"):
        StelloMiddleware(storage=tmp_path / "ideas.db")  # opens its tree at once
    assert len(opened) == 1
    with pytest.raises(StorageError, match="closed"):
        opened[0].get_session("anything")


def test_the_schedule_consolidates_and_a_failure_deletes_nothing(storage: MainStorage) -> None:
    seen: list[list[str]] = []

    def consolidate(current: str | None, records: list[BaseMessage]) -> str:
        seen.append(_texts(records))
        if len(seen) == 2:
            raise RuntimeError("summariser down")
        return f"L2 of {len(records)} records"

    schedule = Schedule(consolidate_every_n_turns=2, recover_every=None)
    with StelloMiddleware(storage=storage, schedule=schedule, consolidate_fn=consolidate) as stello:
        agent = _agent(ScriptedChatModel(default="ok"), stello)
        for i in range(4):
            sid = _ask(agent, "t1", f"message {i}")["stello_session_id"]
            assert stello.drain(10)
            if i == 1:
                assert _child(stello, sid).memory() == "L2 of 4 records"
        assert seen[0] == ["message 0", "ok", "message 1", "ok"]
        [failure] = stello.failures()
        assert failure.session_id == sid and "summariser down" in failure.message
        assert len(_l3(stello, sid)) == 8
        assert _child(stello, sid).memory() == "L2 of 4 records"


def test_an_interrupted_run_commits_at_its_resumed_end(storage: MainStorage) -> None:
    model = ScriptedChatModel([ScriptedChatModel.tool_call("lookup", {"query": "x"}), "done"])
    stello = StelloMiddleware(storage=storage, trim_state=True)
    approval = HumanInTheLoopMiddleware(interrupt_on={"lookup": True})
    agent = create_agent(
        model, [lookup], middleware=[stello, approval], checkpointer=InMemorySaver()
    )
    config: Any = {"configurable": {"thread_id": "t1"}}
    paused = agent.invoke({"messages": [{"role": "user", "content": "Look up x"}]}, config)
    assert paused["__interrupt__"]
    sid = paused["stello_session_id"]
    assert _l3(stello, sid) == []  # nothing committed while the run waits
    _child(stello, sid).set_insight("Be quick.")
    done = agent.invoke(Command(resume={"decisions": [{"type": "approve"}]}), config)
    assert done["messages"][-1].text == "done"
    assert _l3(stello, sid) == ["Look up x", "", "found x", "done"]
    assert storage.get_insight(sid) == "Be quick."  # the run showed none: a newer one is kept


def test_the_model_forks_a_branch_with_create_session(storage: MainStorage) -> None:
    model = ScriptedChatModel(
        [
            "noted",
            ScriptedChatModel.tool_call(
                "create_session", {"label": "Pricing", "context": "inherit"}
            ),
            ScriptedChatModel.tool_call("create_session", {"label": "X", "profile": "nope"}),
            "branched",
        ]
    )
    stello = StelloMiddleware(storage=storage)
    agent = _agent(model, stello)
    sid = _ask(agent, "t1", "We sell seats")["stello_session_id"]
    out = _ask(agent, "t1", "Open a branch on pricing")
    [created, refused] = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    [child] = storage.get_children(sid)
    assert child.label == "Pricing" and child.id in created.text
    assert _l3(stello, child.id) == ["We sell seats", "noted"]  # the run itself is not in L3 yet
    assert refused.text.startswith("Error: UnknownProfileError")
    assert _l3(stello, sid)[-1] == "branched"
    assert "create_session" in [t.name for t in stello.tools]
    assert StelloMiddleware(storage=storage, builtin_tools=()).tools == []


def test_the_schedule_integrates_the_threads_and_their_insights_reach_them(
    storage: MainStorage,
) -> None:
    def consolidate(current: str | None, records: list[BaseMessage]) -> str:
        return "about " + records[0].text

    def integrate(children: list[ChildL2], current: str | None) -> IntegrationResult:
        insights = {c.session_id: f"Link to {len(children) - 1} other thread(s)" for c in children}
        return IntegrationResult(synthesis=" + ".join(c.l2 for c in children), insights=insights)

    # one worker: the second run's consolidation is done before the integration it queued
    schedule = Schedule(
        consolidate_every_n_turns=1,
        integrate_every_n_turns=2,
        max_concurrency=1,
        recover_every=None,
    )
    model = ScriptedChatModel(default="ok")
    with StelloMiddleware(
        storage=storage, schedule=schedule, consolidate_fn=consolidate, integrate_fn=integrate
    ) as stello:
        agent = _agent(model, stello)
        _ask(agent, "t1", "Lisbon")
        assert stello.drain(10)
        _ask(agent, "t2", "Bikes")  # the tree's second run: integration
        assert stello.drain(10)
        main = stello.session(storage.get_main_session().id)  # type: ignore[union-attr]
        assert isinstance(main, MainSession)
        assert main.synthesis() == "about Lisbon + about Bikes"
        _ask(agent, "t1", "Hotels?")
        assert "Link to 1 other thread(s)" in model.prompts[-1][0].text
        assert not stello.failures()


def test_async_a_failed_run_commits_nothing_and_keeps_the_insight(storage: MainStorage) -> None:
    model = ScriptedChatModel(["first", RuntimeError("provider down")], default="second")
    stello = StelloMiddleware(storage=storage)
    agent = _agent(model, stello)

    async def ask(text: str) -> dict[str, Any]:
        out: dict[str, Any] = await agent.ainvoke(
            {"messages": [{"role": "user", "content": text}]},
            {"configurable": {"thread_id": "t1"}},
        )
        return out

    sid = asyncio.run(ask("Hi"))["stello_session_id"]
    _child(stello, sid).set_insight("Mention the deadline.")
    with pytest.raises(RuntimeError, match="provider down"):
        asyncio.run(ask("Status?"))
    assert _l3(stello, sid) == ["Hi", "first"]
    assert storage.get_insight(sid) == "Mention the deadline."
    asyncio.run(ask("Status now?"))
    assert "Mention the deadline." in model.prompts[-1][0].text
    assert storage.get_insight(sid) is None
    assert _l3(stello, sid) == ["Hi", "first", "Status?", "Status now?", "second"]


@tool
def flaky(query: str) -> str:
    """Fails."""
    raise RuntimeError("tool crashed")


def test_a_run_that_failed_in_a_tool_leaves_no_open_call_behind(storage: MainStorage) -> None:
    """The call the failed run left unanswered is neither sent (a provider 400) nor stored."""
    model = ScriptedChatModel([ScriptedChatModel.tool_call("flaky", {"query": "x"})], default="ok")
    stello = StelloMiddleware(storage=storage)
    agent = create_agent(model, [flaky], middleware=[stello], checkpointer=InMemorySaver())
    with pytest.raises(RuntimeError, match="tool crashed"):
        _ask(agent, "t1", "Try it")
    out = _ask(agent, "t1", "Never mind")
    prompt = model.prompts[-1]
    assert not any(isinstance(m, AIMessage) and m.tool_calls for m in prompt)
    assert _texts(prompt[1:]) == ["Try it", "Never mind"]
    assert _l3(stello, out["stello_session_id"]) == ["Try it", "Never mind", "ok"]
