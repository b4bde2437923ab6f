"""End to end against a real model: SmolLM2-135M-Instruct served by llama-cpp-python.

A 135M-parameter model writes nonsense, so these tests check structure, never wording: what
is stored where, which ids insights go to, and that no history is left half-done.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langchain_core.tools import tool

from stello_graph import Session, StelloAgent
from stello_graph._context import sanitize_history
from tests.live.conftest import ModelFactory

pytestmark = pytest.mark.live


@tool
def get_weather(city: str) -> str:
    """Get the current weather of a city."""
    return f"It is sunny in {city}."


@pytest.fixture
def agent(live_model: ModelFactory, tmp_path: Path) -> Iterator[StelloAgent]:
    """An agent on a SQLite file, driven by the live model (no built-in tools: plain turns)."""
    with StelloAgent(
        model=live_model(),
        storage=tmp_path / "live.db",
        builtin_tools=(),
        system_prompt="You are a helpful assistant. Answer in one short sentence.",
    ) as made:
        yield made


def assert_clean(agent: StelloAgent) -> None:
    """Every session's L3 is a complete history: no tool call without all its results."""
    for node in agent.storage.get_tree():
        records = agent.session(node.id).messages()
        assert sanitize_history(records) == records, node.id


def test_send_and_stream(agent: StelloAgent) -> None:
    sid = agent.main_session_id
    result = agent.turn(sid, "What is the capital of France?")
    assert isinstance(result.content, str) and result.content.strip()
    assert result.message is not None and result.message.usage_metadata is not None
    assert result.message.usage_metadata["output_tokens"] > 0

    chunks = [chunk for chunk, _ in agent.stream(sid, "And of Italy?")]
    assert all(isinstance(c, AIMessageChunk) for c in chunks)
    texts = [c.text for c in chunks]
    assert all(isinstance(t, str) for t in texts) and len([t for t in texts if t]) > 1
    records = agent.session(sid).messages()
    assert [type(m) for m in records] == [HumanMessage, AIMessage, HumanMessage, AIMessage]
    assert records[-1].text == "".join(texts) and records[-1].text.strip()
    assert agent.storage.get_turn_count(sid) == 2


def test_session_stream_result_matches_storage(
    live_model: ModelFactory, agent: StelloAgent
) -> None:
    session = agent.session(agent.main_session_id)
    stream = session.stream("Name a colour.")
    chunks = list(stream)
    assert chunks and all(isinstance(c, str) for c in chunks)
    assert stream.result.content == "".join(chunks)
    stored = session.messages()[-1]
    assert isinstance(stored, AIMessage) and stored.text == stream.result.content
    # llama-cpp-python ignores `stream_options.include_usage`: a streamed reply has no usage.
    assert stream.result.usage == stored.usage_metadata


def test_fork_consolidate_integrate(agent: StelloAgent) -> None:
    main = agent.main_session_id
    tea = agent.fork(main, "Tea", system_prompt="You talk about tea. One sentence.")
    coffee = agent.fork(main, "Coffee", system_prompt="You talk about coffee. One sentence.")
    assert {n.id for n in agent.storage.get_children(main)} == {tea.id, coffee.id}
    assert agent.storage.get_session(tea.id) is not None
    for node, question in ((tea, "Is green tea healthy?"), (coffee, "Is espresso strong?")):
        assert agent.turn(node.id, question).content.strip()

    for node in (tea, coffee):
        l2 = agent.consolidate(node.id)
        assert isinstance(l2, str) and l2.strip()
        assert agent.storage.get_memory(node.id) == l2

    result = agent.integrate()
    assert result.synthesis.strip()
    assert agent.session(main).storage.get_memory(main) == result.synthesis
    real_ids = {tea.id, coffee.id}
    assert set(result.insights) <= real_ids
    for sid in real_ids:
        stored = agent.storage.get_insight(sid)
        assert stored == result.insights.get(sid)
    # A child with an insight gets it on its next turn, which then consumes it.
    for sid in result.insights:
        assert agent.turn(sid, "Anything new?").content.strip()
        assert agent.storage.get_insight(sid) is None
    assert_clean(agent)


def test_turn_with_tools_offered(live_model: ModelFactory, tmp_path: Path) -> None:
    """The server accepts stello's tool schemas (`create_session` included); whatever the model
    does with them, the turn ends with a clean history and no fork without its node."""
    with StelloAgent(
        model=live_model(), storage=tmp_path / "tools.db", tools=[get_weather]
    ) as agent:
        result = agent.turn(agent.main_session_id, "Open a branch about the weather in Rome.")
        assert isinstance(result.content, str)
        request_tools = agent.session(agent.main_session_id).tools
        assert [t.name for t in request_tools] == ["get_weather", "create_session"]
        for node in agent.storage.get_tree():
            assert agent.storage.get_session(node.id) is not None
        assert_clean(agent)


def test_forced_tool_call(live_model: ModelFactory, agent: StelloAgent) -> None:
    """`tool_choice` forces the first call; the tool's result is then answered freely."""
    forced = {"type": "function", "function": {"name": "get_weather"}}
    node = agent.fork(agent.main_session_id, "Weather")
    session = Session.load(node.id, agent.storage, model=live_model(), tools=[get_weather])
    reply = session.send("What is the weather like in Paris?", tool_choice=forced)
    assert [call["name"] for call in reply.tool_calls] == ["get_weather"]
    call = reply.tool_calls[0]
    assert isinstance(call["args"].get("city"), str) and call["id"]
    assert sanitize_history(session.messages()) != session.messages()  # the call is open
    result = ToolMessage(
        content=get_weather.invoke(call["args"]), tool_call_id=call["id"], name="get_weather"
    )
    final = session.send_tool_results([result])  # the continuation is not forced
    assert isinstance(final.content, str)
    records = session.messages()
    assert [type(m) for m in records] == [HumanMessage, AIMessage, ToolMessage, AIMessage]
    assert_clean(agent)
