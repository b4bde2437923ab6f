"""Full turns through `ChatOpenAI` over real HTTP: context on the wire, streaming, tools, forks."""

from __future__ import annotations

import json

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, ToolMessage
from langchain_core.tools import tool

from stello_graph import StelloAgent
from stello_graph._context import sanitize_history
from stello_graph.testing.openai_server import FakeOpenAI, Reply, ToolCallSpec, words
from tests.providers.conftest import AgentFactory, openai_model


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def test_turn_sends_the_session_context_and_stores_the_reply(
    server: FakeOpenAI, make_agent: AgentFactory
) -> None:
    server.add(Reply(content="Start with a free tier."), Reply(content="Yes, as I said."))
    agent = make_agent()
    branch = agent.fork(agent.main_session_id, "Pricing", system_prompt="Be brief.")

    result = agent.turn(branch.id, "Free tier?")

    assert result.content == "Start with a free tier."
    first = server.requests[0]
    assert first.headers["authorization"] == "Bearer sk-test"
    assert first.body["model"] == "fake" and not first.streamed
    assert [m["role"] for m in first.messages] == ["system", "user"]
    system = first.messages[0]["content"]
    assert system.startswith("Be brief.") and 'branch session "Pricing"' in system
    assert first.messages[1]["content"] == "Free tier?"
    assert first.tool_names == ["create_session"]
    # The next turn sends the stored history back, as the provider wrote it.
    assert agent.turn(branch.id, "Sure?").content == "Yes, as I said."
    assert [(m["role"], m["content"]) for m in server.requests[1].messages[1:]] == [
        ("user", "Free tier?"),
        ("assistant", "Start with a free tier."),
        ("user", "Sure?"),
    ]
    records = agent.session(branch.id).messages()
    assert [m.text for m in records] == [
        "Free tier?",
        "Start with a free tier.",
        "Sure?",
        "Yes, as I said.",
    ]
    assert agent.storage.get_turn_count(branch.id) == 2


def test_turn_reports_the_provider_usage(server: FakeOpenAI, make_agent: AgentFactory) -> None:
    server.add(Reply(content="Counted.", usage=(42, 7)))
    agent = make_agent()
    result = agent.turn(agent.main_session_id, "count my tokens")
    assert result.message is not None
    usage = result.message.usage_metadata
    assert usage is not None
    assert (usage["input_tokens"], usage["output_tokens"], usage["total_tokens"]) == (42, 7, 49)
    stored = agent.session(agent.main_session_id).messages()[-1]
    assert isinstance(stored, AIMessage) and stored.usage_metadata == usage


def test_streamed_turn_yields_the_sse_tokens(server: FakeOpenAI, make_agent: AgentFactory) -> None:
    text = "Tokens arrive one by one, over SSE."
    server.add(Reply(content=text))
    agent = make_agent()
    sid = agent.main_session_id

    items = list(agent.stream(sid, "stream please", stream_mode=["messages", "custom"]))

    chunks = [data[0] for mode, data in items if mode == "messages"]
    assert all(isinstance(c, AIMessageChunk) for c in chunks)
    assert [c.text for c in chunks if c.text] == words(text)
    events = [data["event"] for mode, data in items if mode == "custom"]
    assert events == ["turn_started", "turn_committed"]
    request = server.requests[0]
    assert request.streamed and request.body["stream_options"] == {"include_usage": True}
    stored = agent.session(sid).messages()[-1]
    assert isinstance(stored, AIMessage) and stored.text == text
    assert stored.usage_metadata is not None and stored.usage_metadata["output_tokens"] == 7


def _fork_script() -> tuple[ToolCallSpec, ToolCallSpec, list[Reply]]:
    add_call = ToolCallSpec(name="add", args={"a": 2, "b": 3})
    fork_call = ToolCallSpec(
        name="create_session", args={"label": "Deep dive", "context": "inherit"}
    )
    script = [
        Reply(content="Hello."),
        Reply.calls(add_call, fork_call),
        Reply(content="2 + 3 = 5, and I opened a branch."),
        Reply(content="Still here."),
    ]
    return add_call, fork_call, script


def _run(agent: StelloAgent, sid: str, text: str, streamed: bool) -> list[AIMessageChunk]:
    if not streamed:
        agent.turn(sid, text)
        return []
    return [chunk for chunk, _ in agent.stream(sid, text)]


@pytest.mark.parametrize("streamed", [False, True], ids=["invoke", "stream"])
def test_parallel_tool_calls_and_a_model_initiated_fork(
    server: FakeOpenAI, make_agent: AgentFactory, streamed: bool
) -> None:
    add_call, fork_call, script = _fork_script()
    server.add(*script)
    agent = make_agent(tools=[add])
    parent = agent.fork(agent.main_session_id, "Math")
    agent.turn(parent.id, "hi")

    chunks = _run(agent, parent.id, "add 2 and 3, then branch off", streamed)

    if streamed:  # the tool calls arrived as deltas, split across chunks, by index
        fragments = [tc for c in chunks for tc in c.tool_call_chunks]
        assert {tc["index"] for tc in fragments} == {0, 1}
        assert len(fragments) > 2
        assert server.requests[1].streamed
    # The model's fork: a child with its node, holding the parent's history before this turn.
    (child,) = agent.storage.get_children(parent.id)
    assert child.label == "Deep dive"
    assert [m.text for m in agent.session(child.id).messages()] == ["hi", "Hello."]
    # What went over the wire: the tool schemas, then both calls with their results.
    tools = {t["function"]["name"]: t["function"] for t in server.requests[1].body["tools"]}
    assert list(tools) == ["add", "create_session"]
    # The graph state injected into `create_session` is not part of its schema.
    params = set(tools["create_session"]["parameters"]["properties"])
    assert params == {
        *("label", "system_prompt", "prompt", "context", "at_turn"),
        *("profile", "profile_vars", "skills"),
    }
    follow_up = server.requests[2].messages
    assistant, result_add, result_fork = follow_up[-3:]
    assert [c["id"] for c in assistant["tool_calls"]] == [add_call.id, fork_call.id]
    assert [json.loads(c["function"]["arguments"]) for c in assistant["tool_calls"]] == [
        add_call.args,
        fork_call.args,
    ]
    assert (result_add["role"], result_add["tool_call_id"], result_add["content"]) == (
        "tool",
        add_call.id,
        "5",
    )
    assert result_fork["tool_call_id"] == fork_call.id
    assert json.loads(result_fork["content"]) == {"session_id": child.id, "label": "Deep dive"}
    # L3 holds the whole group, and a later turn sends it back from storage unchanged.
    records = agent.session(parent.id).messages()
    assert [type(m).__name__ for m in records[2:]] == [
        "HumanMessage",
        "AIMessage",
        "ToolMessage",
        "ToolMessage",
        "AIMessage",
    ]
    assert sanitize_history(records) == records
    agent.turn(parent.id, "thanks")
    again = server.requests[3].messages
    assert again[: len(follow_up)] == follow_up
    assert [m["role"] for m in again[len(follow_up) :]] == ["assistant", "user"]


def test_tool_choice_reaches_the_provider(server: FakeOpenAI, make_agent: AgentFactory) -> None:
    """A forced `tool_choice` set on the model is sent along with the tools stello binds."""
    forced = {"type": "function", "function": {"name": "add"}}
    server.add(Reply.calls(("add", {"a": 1, "b": 1})), Reply(content="2"))
    agent = make_agent()
    branch = agent.fork(
        agent.main_session_id,
        "Forced",
        model=openai_model(server.base_url, model_kwargs={"tool_choice": forced}),
        tools=[add],
    )
    session = agent.session(branch.id)
    reply = session.send("one plus one")
    assert [c["name"] for c in reply.tool_calls] == ["add"]
    assert server.requests[0].body["tool_choice"] == forced
    assert server.requests[0].tool_names == ["add", "create_session"]
    result = ToolMessage(content="2", tool_call_id=reply.tool_calls[0]["id"], name="add")
    assert session.send_tool_results([result]).content == "2"
    assert server.requests[1].messages[-1] == {
        "role": "tool",
        "tool_call_id": reply.tool_calls[0]["id"],
        "content": "2",
    }
    records = session.messages()
    assert sanitize_history(records) == records and len(records) == 4
