"""Model replies a provider can produce that a turn must survive."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    InvalidToolCall,
    ToolMessage,
)
from langchain_core.tools import tool
from langchain_openai.chat_models.base import _convert_message_to_dict

from stello_graph._context import sanitize_history
from stello_graph.testing import ScriptedChatModel
from tests.orchestration.conftest import AgentFactory


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def _unparsable(call_id: str) -> InvalidToolCall:
    return {
        "type": "invalid_tool_call",
        "name": "add",
        "args": '{"a": 1, "b":',
        "id": call_id,
        "error": "Unterminated JSON",
    }


def assert_openai_accepts(prompt: list[BaseMessage]) -> None:
    """Every tool call of an assistant message, as OpenAI would receive it, is answered."""
    payload = [_convert_message_to_dict(m) for m in prompt]
    for index, message in enumerate(payload):
        for call in message.get("tool_calls") or []:
            answers = [m for m in payload[index + 1 :] if m.get("tool_call_id") == call["id"]]
            assert answers, f"tool call {call['id']} is never answered: {payload}"


async def test_unparsable_tool_arguments_are_fed_back(make_agent: AgentFactory) -> None:
    model = ScriptedChatModel(
        [
            AIMessage(content="", invalid_tool_calls=[_unparsable("bad-1")]),
            ScriptedChatModel.tool_call("add", {"a": 1, "b": 2}),
            "1 + 2 = 3",
            AIMessage(content="", invalid_tool_calls=[_unparsable("bad-2")]),
            "gave up",
            "next",
        ]
    )
    agent = make_agent(model=model, tools=[add])
    sid = agent.main_session_id
    result = agent.turn(sid, "add 1 and 2")
    assert result.content == "1 + 2 = 3"
    assert result.tool_rounds == 2
    error = model.prompts[1][-1]
    assert isinstance(error, ToolMessage) and error.status == "error"
    assert error.tool_call_id == "bad-1" and "could not be read" in str(error.content)
    assert (await agent.aturn(sid, "again")).content == "gave up"
    kinds = [m.type for m in agent.session(sid).messages()]
    assert kinds == ["human", "ai", "tool", "ai", "tool", "ai", "human", "ai", "tool", "ai"]
    agent.turn(sid, "more")
    for prompt in model.prompts:
        assert_openai_accepts(prompt)


def test_stored_unanswered_unparsable_call_is_not_sent_again() -> None:
    records: list[Any] = [
        HumanMessage("q"),
        AIMessage(content="", invalid_tool_calls=[_unparsable("bad")]),
        HumanMessage("q2"),
        AIMessage("a2"),
    ]
    clean = sanitize_history(records)
    assert [m.content for m in clean] == ["q", "q2", "a2"]
    assert_openai_accepts(clean)
