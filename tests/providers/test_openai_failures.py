"""Provider failures over HTTP (typed errors, nothing stored) and the async path end to end."""

from __future__ import annotations

import json

import pytest
from langchain_core.messages import AIMessageChunk
from langchain_core.tools import tool

from stello_graph import ConsolidationError, IntegrationError, ModelCallError
from stello_graph._context import sanitize_history
from stello_graph.testing.openai_server import FakeOpenAI, Reply
from tests.providers.conftest import AgentFactory, ModelFactory


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def test_http_500_is_a_model_call_error_and_stores_nothing(
    server: FakeOpenAI, make_agent: AgentFactory
) -> None:
    agent = make_agent()
    branch = agent.fork(agent.main_session_id, "B")
    agent.storage.put_insight(branch.id, "keep me")
    server.add(Reply(status=500, error="upstream exploded"), Reply(content="Recovered."))

    with pytest.raises(ModelCallError, match="upstream exploded") as caught:
        agent.turn(branch.id, "hello")

    assert caught.value.session_id == branch.id
    assert agent.session(branch.id).messages() == []
    assert agent.storage.get_turn_count(branch.id) == 0
    assert agent.storage.get_insight(branch.id) == "keep me"
    assert agent.turn(branch.id, "hello").content == "Recovered."
    assert agent.storage.get_insight(branch.id) is None


def test_failure_in_the_second_round_drops_the_whole_turn(
    server: FakeOpenAI, make_agent: AgentFactory
) -> None:
    agent = make_agent(tools=[add])
    sid = agent.main_session_id
    server.add(Reply.calls(("add", {"a": 1, "b": 2})), Reply(status=503, error="overloaded"))
    with pytest.raises(ModelCallError, match="overloaded"):
        agent.turn(sid, "1 + 2?")
    assert agent.session(sid).messages() == []  # neither the call nor its result is kept


def test_stream_cut_mid_way_stores_nothing(server: FakeOpenAI, make_agent: AgentFactory) -> None:
    agent = make_agent()
    sid = agent.main_session_id
    server.add(Reply(content="This reply never finishes arriving.", cut_after=3))
    received: list[AIMessageChunk] = []

    def consume() -> None:
        for chunk, _ in agent.stream(sid, "go"):
            received.append(chunk)

    with pytest.raises(ModelCallError):
        consume()
    assert "".join(c.text for c in received) == "This reply"  # what came before the cut
    assert agent.session(sid).messages() == []


def test_session_stream_cut_mid_way_stores_nothing(
    server: FakeOpenAI, make_agent: AgentFactory
) -> None:
    agent = make_agent()
    session = agent.session(agent.main_session_id)
    server.add(Reply(content="one two three four", cut_after=2))
    stream = session.stream("go")
    with pytest.raises(ModelCallError):
        list(stream)
    assert not stream.done
    assert session.messages() == []


def test_client_timeout_is_a_model_call_error(
    server: FakeOpenAI, make_agent: AgentFactory, chat_model: ModelFactory
) -> None:
    agent = make_agent(model=chat_model(timeout=0.3))
    server.add(Reply(content="too late", delay=1.0))
    with pytest.raises(ModelCallError, match="Timeout"):
        agent.turn(agent.main_session_id, "quick?")
    assert agent.session(agent.main_session_id).messages() == []


def test_memory_calls_failing_over_http_keep_the_old_memory(
    server: FakeOpenAI, make_agent: AgentFactory
) -> None:
    agent = make_agent()
    child = agent.fork(agent.main_session_id, "C")
    server.add(Reply(content="hi"), Reply(content="first summary"), Reply(content="synth"))
    agent.turn(child.id, "hello")
    agent.consolidate(child.id)
    agent.integrate()
    server.add(
        Reply(content="more reply"),
        Reply(status=500, error="no summary today"),
        Reply(status=500, error="nor synth"),
    )
    agent.turn(child.id, "more")

    with pytest.raises(ConsolidationError, match="no summary today"):
        agent.consolidate(child.id)
    with pytest.raises(IntegrationError, match="nor synth"):
        agent.integrate()
    assert agent.storage.get_memory(child.id) == "first summary"
    assert agent.storage.get_memory(agent.main_session_id) == "synth"


async def test_async_turns_streams_and_memory(server: FakeOpenAI, make_agent: AgentFactory) -> None:
    agent = make_agent(tools=[add])
    main = agent.main_session_id
    server.add(
        Reply.calls(("add", {"a": 20, "b": 22}), ("create_session", {"label": "Async child"})),
        Reply(content="42, and a branch."),
        Reply(content="Streaming asynchronously."),
        Reply(content="child summary"),
        Reply(content=json.dumps({"synthesis": "all async", "insights": {}})),
        Reply(status=500, error="async failure"),
    )

    result = await agent.aturn(main, "add 20 and 22 and branch")
    assert result.content == "42, and a branch." and result.tool_rounds == 1
    (child,) = agent.storage.get_children(main)
    chunks = [c async for c, _ in agent.astream(child.id, "stream")]
    assert "".join(c.text for c in chunks) == "Streaming asynchronously."
    assert await agent.aconsolidate(child.id) == "child summary"
    assert (await agent.aintegrate()).synthesis == "all async"
    with pytest.raises(ModelCallError, match="async failure"):
        await agent.aturn(child.id, "fail")
    records = await agent.session(main).amessages()
    assert len(records) == 5 and sanitize_history(records) == records
    assert len(await agent.session(child.id).amessages()) == 2
    assert [r.streamed for r in server.requests] == [False, False, True, False, False, False]
