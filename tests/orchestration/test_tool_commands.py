"""Tools that return a LangGraph `Command`, as tools are written for `create_agent` and
`langgraph-swarm`: `Command(update={"messages": [ToolMessage(...)]})` is the tool's result; a
handoff to the parent graph reaches it, the turn left unstored; every other form (other state
keys, a `goto`, a handoff with no parent graph) is refused by name, before anything of the turn
is stored."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from langgraph_swarm import create_handoff_tool, create_swarm

from stello_graph import MainSession, build_stello_graph
from stello_graph.checkpoints import InMemoryMainStorage
from stello_graph.errors import StelloUsageError
from stello_graph.testing import ScriptedChatModel
from tests.orchestration.conftest import AgentFactory


@tool
def remember(fact: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command[Any]:
    """Remember a fact (answers with a state update, as LangGraph tools do)."""
    return Command(update={"messages": [ToolMessage(f"noted: {fact}", tool_call_id=tool_call_id)]})


@tool
def shout(text: str) -> str:
    """Say it loud (an ordinary tool)."""
    return text.upper()


@tool
def set_mood(mood: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command[Any]:
    """Write a key of the graph's state besides the messages."""
    return Command(
        update={"mood": mood, "messages": [ToolMessage("set", tool_call_id=tool_call_id)]}
    )


@tool
def transfer_to_billing(tool_call_id: Annotated[str, InjectedToolCallId]) -> Command[Any]:
    """Hand the conversation to the billing agent (a langgraph-swarm handoff)."""
    done = ToolMessage("Transferred to billing", tool_call_id=tool_call_id)
    return Command(goto="billing", graph=Command.PARENT, update={"messages": [done]})


def _calls() -> ScriptedChatModel:
    both = ScriptedChatModel.tool_calls(
        [
            {"name": "remember", "args": {"fact": "tea at five"}, "id": "c1"},
            {"name": "shout", "args": {"text": "hi"}, "id": "c2"},
        ]
    )
    return ScriptedChatModel([both, "Noted."])


def test_a_commands_tool_message_is_the_tools_result(make_agent: AgentFactory) -> None:
    model = _calls()
    agent = make_agent(model=model, tools=[remember, shout])
    sid = agent.main_session_id
    assert agent.turn(sid, "Remember tea.").content == "Noted."
    shown = [(m.tool_call_id, m.content, m.status) for m in model.prompts[1]
             if isinstance(m, ToolMessage)]  # fmt: skip
    assert shown == [("c1", "noted: tea at five", "success"), ("c2", "HI", "success")]
    stored = agent.session(sid).messages()
    assert [m.type for m in stored] == ["human", "ai", "tool", "tool", "ai"]
    assert isinstance(stored[2], ToolMessage)
    assert (stored[2].tool_call_id, stored[2].content) == ("c1", "noted: tea at five")


async def test_async_turns_take_a_commands_tool_message(make_agent: AgentFactory) -> None:
    model = _calls()
    agent = make_agent(model=model, tools=[remember, shout])
    sid = agent.main_session_id
    await agent.aturn(sid, "Remember tea.")
    assert (await agent.asession(sid)).messages()[2].content == "noted: tea at five"


def test_a_command_answering_another_call_is_an_error_the_model_sees(
    make_agent: AgentFactory,
) -> None:
    @tool
    def stray() -> Command[Any]:
        """Answer a call that is not this one."""
        return Command(update={"messages": [ToolMessage("lost", tool_call_id="other")]})

    model = ScriptedChatModel([ScriptedChatModel.tool_call("stray", {}, id="c9"), "Sorry."])
    agent = make_agent(model=model, tools=[stray])
    agent.turn(agent.main_session_id, "Go.")
    [result] = [m for m in model.prompts[1] if isinstance(m, ToolMessage)]
    assert (result.tool_call_id, result.status) == ("c9", "error")
    assert "matching ToolMessage" in str(result.content)


def test_a_command_writing_other_state_is_refused_by_key(make_agent: AgentFactory) -> None:
    model = ScriptedChatModel([ScriptedChatModel.tool_call("set_mood", {"mood": "calm"}), "ok"])
    agent = make_agent(model=model, tools=[set_mood])
    sid = agent.main_session_id
    with pytest.raises(StelloUsageError, match=r"'mood'.*Command\(update=\{\"messages\""):
        agent.turn(sid, "Calm down.")
    assert agent.session(sid).messages() == []
    assert len(model.prompts) == 1  # the model never saw a result


def _swarm(storage: InMemoryMainStorage) -> tuple[Any, ScriptedChatModel]:
    """A `langgraph-swarm` of a stello graph ("desk") that hands off to a `create_agent` one."""
    model = ScriptedChatModel([ScriptedChatModel.tool_call("transfer_to_billing", {}), "Desk."])
    handoff = create_handoff_tool(agent_name="billing")
    desk = build_stello_graph(model, storage, tools=[handoff]).compile(name="desk")
    billing = create_agent(ScriptedChatModel(default="Billing here."), [], name="billing")
    swarm = create_swarm([desk, billing], default_active_agent="desk")
    return swarm.compile(checkpointer=InMemorySaver()), model


def _handed_off(out: dict[str, Any]) -> None:
    assert out["active_agent"] == "billing"
    said = [(m.type, m.content) for m in out["messages"]]
    assert said == [
        ("human", "Refund me."),  # once: the parent's message, not a second copy of it
        ("ai", ""),
        ("tool", "Successfully transferred to billing"),
        ("ai", "Billing here."),
    ]


def test_a_swarm_handoff_reaches_the_parent_and_leaves_the_turn_unstored() -> None:
    storage = InMemoryMainStorage()
    main = MainSession.create(storage)
    app, model = _swarm(storage)
    ask: Any = {"messages": [HumanMessage("Refund me.")]}
    _handed_off(app.invoke(ask, {"configurable": {"thread_id": "t1", "session_id": main.id}}))
    assert storage.list_records(main.id) == []  # the turn left the session: nothing stored
    again = app.invoke(ask, {"configurable": {"thread_id": "t2", "session_id": main.id}})
    assert again["messages"][-1].content == "Desk."  # the lease is free: the next turn runs
    assert [r.content for r in storage.list_records(main.id)] == ["Refund me.", "Desk."]
    assert len(model.prompts) == 2


async def test_an_async_swarm_handoff_reaches_the_parent() -> None:
    storage = InMemoryMainStorage()
    main = MainSession.create(storage)
    app, _ = _swarm(storage)
    ask: Any = {"messages": [HumanMessage("Refund me.")]}
    _handed_off(await app.ainvoke(ask, {"configurable": {"thread_id": "t", "session_id": main.id}}))
    assert storage.list_records(main.id) == []


def test_a_handoff_with_no_parent_graph_is_refused_and_stores_nothing(
    make_agent: AgentFactory,
) -> None:
    model = ScriptedChatModel([ScriptedChatModel.tool_call("transfer_to_billing", {}), "Again."])
    agent = make_agent(model=model, tools=[transfer_to_billing])
    sid = agent.main_session_id
    with pytest.raises(StelloUsageError, match=r"goto='billing'\), but this stello graph runs "):
        agent.turn(sid, "Refund me.")
    assert agent.session(sid).messages() == []
    assert agent.turn(sid, "Hello?").content == "Again."  # the lease is free
