"""`OpenAICompatibleChat`: requests that local OpenAI-compatible servers accept."""

from __future__ import annotations

from langchain_core.tools import tool

from stello_graph import StelloAgent
from stello_graph.checkpoints import InMemoryMainStorage
from stello_graph.providers import OpenAICompatibleChat, local_chat_model
from stello_graph.testing.openai_server import FakeOpenAI, Reply, ToolCallSpec


@tool
def double(n: int) -> int:
    """Double a number."""
    return 2 * n


def test_tool_rounds_send_empty_content_and_max_tokens(server: FakeOpenAI) -> None:
    server.add(
        Reply(tool_calls=(ToolCallSpec(name="double", args={"n": 21}),)),
        Reply(content="It is 42."),
    )
    model = local_chat_model(server.base_url, "tiny", max_tokens=40, max_retries=0, timeout=5)
    assert isinstance(model, OpenAICompatibleChat)
    agent = StelloAgent(model=model, storage=InMemoryMainStorage(), tools=[double])
    assert agent.turn(agent.main_session_id, "double 21").content == "It is 42."
    first, second = server.requests
    assert first.body["max_tokens"] == 40
    assert "max_completion_tokens" not in first.body
    assistant = next(m for m in second.messages if m["role"] == "assistant")
    assert assistant["content"] == ""  # never null: llama-cpp-python refuses it
    assert assistant["tool_calls"][0]["function"]["name"] == "double"
    assert first.headers["authorization"] == "Bearer not-needed"
    agent.close()
