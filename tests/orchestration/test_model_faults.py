"""Model failures a turn must survive: unparsable tool calls, slow and failing calls."""

from __future__ import annotations

import inspect
import re
import time
from typing import Any

import pytest
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    InvalidToolCall,
    ToolMessage,
)
from langchain_core.tools import tool
from langchain_openai.chat_models.base import _convert_message_to_dict
from langgraph.types import RetryPolicy

from stello_graph import InvalidInputError, ModelCallError, ToolRoundLimitError
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


# -- time limit and retries of a turn's model calls ----------------------------------------
FAST_RETRY = RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False)


async def test_model_timeout_fails_the_turn_and_stores_nothing(make_agent: AgentFactory) -> None:
    agent = make_agent(model=ScriptedChatModel(default="late", latency=2.0), model_timeout=0.05)
    branch = agent.fork(agent.main_session_id, "B")
    agent.storage.put_insight(branch.id, "kept")
    for run in (agent.turn, agent.aturn):
        started = time.monotonic()
        with pytest.raises(ModelCallError, match=r"did not answer within model_timeout=0\.05 s"):
            await _maybe_await(run(branch.id, "hello?"))
        assert time.monotonic() - started < 1.0
    assert agent.session(branch.id).messages() == []
    assert agent.storage.get_insight(branch.id) == "kept"


def test_timed_out_call_is_retried(make_agent: AgentFactory) -> None:
    calls: list[float] = []

    def slow_then_fast(messages: list[BaseMessage]) -> str:
        calls.append(time.monotonic())
        if len(calls) == 1:
            time.sleep(1.0)
        return "on time"

    agent = make_agent(
        model=ScriptedChatModel(respond=slow_then_fast), model_timeout=0.1, model_retry=FAST_RETRY
    )
    sid = agent.main_session_id
    assert agent.turn(sid, "hi").content == "on time"
    assert len(calls) == 2
    assert [m.content for m in agent.session(sid).messages()] == ["hi", "on time"]


async def test_retry_policy_judges_the_provider_error(make_agent: AgentFactory) -> None:
    model = ScriptedChatModel(
        [ConnectionError("reset"), ConnectionError("reset"), "third time", ValueError("bad")]
    )
    agent = make_agent(model=model, model_retry=FAST_RETRY)
    sid = agent.main_session_id
    assert (await agent.aturn(sid, "hi")).content == "third time"
    assert model.call_count == 3
    # the default retry_on does not retry a ValueError: one call, a typed error
    with pytest.raises(ModelCallError, match="ValueError: bad"):
        agent.turn(sid, "again")
    assert model.call_count == 4
    assert [m.content for m in agent.session(sid).messages()] == ["hi", "third time"]


def test_retry_policy_does_not_retry_the_round_limit(make_agent: AgentFactory) -> None:
    model = ScriptedChatModel(
        respond=lambda msgs: ScriptedChatModel.tool_call("add", {"a": 1, "b": 1})
    )
    agent = make_agent(model=model, tools=[add], max_tool_rounds=1, model_retry=FAST_RETRY)
    with pytest.raises(ToolRoundLimitError):
        agent.turn(agent.main_session_id, "loop")
    assert model.call_count == 2


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"model_timeout": 0}, "model_timeout must be a number of seconds > 0, got 0"),
        ({"model_timeout": "5"}, "model_timeout must be a number of seconds > 0, got '5'"),
        ({"model_retry": 3}, "model_retry must be a langgraph.types.RetryPolicy, got int"),
    ],
)
def test_bad_limits_are_refused(
    make_agent: AgentFactory, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidInputError, match=re.escape(message)):
        make_agent(model=ScriptedChatModel(default="ok"), **options)


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value
