"""Consolidate and integrate with the LLM-backed memory functions, over HTTP; session usage."""

from __future__ import annotations

import json

from stello_graph import MainSession, Session
from stello_graph.checkpoints import InMemoryMainStorage
from stello_graph.memory import DEFAULT_CONSOLIDATE_PROMPT, DEFAULT_INTEGRATE_PROMPT
from stello_graph.testing.openai_server import FakeOpenAI, Json, Reply
from tests.providers.conftest import AgentFactory, ModelFactory


def _kind(body: Json) -> str:
    system = next((m["content"] for m in body["messages"] if m["role"] == "system"), "")
    if system == DEFAULT_CONSOLIDATE_PROMPT:
        return "consolidate"
    if system == DEFAULT_INTEGRATE_PROMPT:
        return "integrate"
    return "turn"


def test_consolidate_and_integrate_over_http(server: FakeOpenAI, make_agent: AgentFactory) -> None:
    agent = make_agent()
    tea = agent.fork(agent.main_session_id, "Tea")
    coffee = agent.fork(agent.main_session_id, "Coffee")
    answer = {
        "synthesis": "Tea in the morning, coffee never.",
        "insights": {tea.id: "The coffee branch ruled coffee out.", "not-a-session": "lost"},
    }
    server.add(
        Reply(content="Green tea is fine."),
        Reply(content="Coffee keeps you awake."),
        Reply(content="<think>short</think>The user drinks green tea."),
        Reply(content="The user avoids coffee."),
        Reply(content="Here you go:\n```json\n" + json.dumps(answer) + "\n```"),
        Reply(content="Then tea it is."),
    )
    agent.turn(tea.id, "Is tea fine?")
    agent.turn(coffee.id, "And coffee?")

    assert agent.consolidate(tea.id) == "The user drinks green tea."
    assert agent.consolidate(coffee.id) == "The user avoids coffee."
    result = agent.integrate()

    assert [_kind(r.body) for r in server.requests] == [
        "turn",
        "turn",
        "consolidate",
        "consolidate",
        "integrate",
    ]
    assert "Is tea fine?" in server.requests[2].messages[1]["content"]  # L3 went to the summary
    integrate_prompt = server.requests[4].messages[1]["content"]
    assert "The user drinks green tea." in integrate_prompt  # the L2 ...
    assert "Is tea fine?" not in integrate_prompt  # ... and never the L3
    assert result.synthesis == answer["synthesis"]
    assert result.insights == {tea.id: "The coffee branch ruled coffee out."}
    assert agent.storage.get_memory(tea.id) == "The user drinks green tea."
    assert agent.storage.get_memory(agent.main_session_id) == answer["synthesis"]
    # The insight goes to the child's next call, on the wire, then it is consumed.
    agent.turn(tea.id, "Anything else?")
    system = server.requests[5].messages[0]["content"]
    assert "The coffee branch ruled coffee out." in system
    assert "The user drinks green tea." not in system  # a child never sees its own L2
    assert agent.storage.get_insight(tea.id) is None
    assert agent.storage.get_insight(coffee.id) is None


def test_integrator_copes_with_an_answer_that_is_not_json(
    server: FakeOpenAI, make_agent: AgentFactory
) -> None:
    agent = make_agent(consolidate_fn=lambda l2, records: "a summary")
    child = agent.fork(agent.main_session_id, "Only")
    server.add(Reply(content="ok"), Reply(content="Everything is fine {not json"))
    agent.turn(child.id, "hi")
    agent.consolidate(child.id)
    result = agent.integrate()
    assert result.synthesis == "Everything is fine {not json"
    assert result.insights == {}
    assert agent.storage.get_insight(child.id) is None


def test_session_send_and_stream_report_usage(server: FakeOpenAI, chat_model: ModelFactory) -> None:
    storage = InMemoryMainStorage()
    MainSession.create(storage)
    session = Session.create(storage, model=chat_model(), label="Usage")
    server.add(Reply(content="Plain reply.", usage=(11, 3)), Reply(content="Streamed reply here."))

    sent = session.send("count")
    assert sent.content == "Plain reply."
    assert sent.usage is not None and (sent.usage["input_tokens"], sent.usage["output_tokens"]) == (
        11,
        3,
    )

    stream = session.stream("again")
    chunks = list(stream)
    assert chunks == ["Streamed", " reply", " here."]
    assert stream.result.content == "".join(chunks)
    usage = stream.result.usage
    assert usage is not None and usage["output_tokens"] == 3 and usage["input_tokens"] > 0
    assert server.requests[1].body["stream_options"] == {"include_usage": True}
    assert [m.text for m in session.messages()] == [
        "count",
        "Plain reply.",
        "again",
        "Streamed reply here.",
    ]


async def test_session_async_send_and_stream(server: FakeOpenAI, chat_model: ModelFactory) -> None:
    storage = InMemoryMainStorage()
    await MainSession.acreate(storage)
    session = await Session.acreate(storage, model=chat_model(), label="Async")
    server.add(Reply(content="Async plain.", usage=(5, 2)), Reply(content="Async streamed."))

    sent = await session.asend("one")
    assert sent.content == "Async plain." and sent.usage is not None
    assert sent.usage["total_tokens"] == 7

    stream = session.astream("two")
    chunks = [chunk async for chunk in stream]
    assert chunks == ["Async", " streamed."]
    assert stream.result.content == "Async streamed." and stream.result.usage is not None
    texts = [m.text for m in await session.amessages()]
    assert texts == ["one", "Async plain.", "two", "Async streamed."]
