"""A prompt budget through the agent: turns with tool rounds, the model summarising itself
(`llm_compressor`), every prompt within the budget, every tool call beside its results, and
L3 keeping every record."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool

from stello_graph.compression import CompressionPolicy, estimate_tokens
from stello_graph.memory import DEFAULT_COMPRESS_PROMPT
from stello_graph.testing import ScriptedChatModel
from tests.orchestration.conftest import AgentFactory

BUDGET = 600


@tool
def lookup(q: str) -> str:
    """Look something up."""
    return "found " + "f" * 150


def _is_compress(messages: list[BaseMessage]) -> bool:
    first = messages[0] if messages else None
    return isinstance(first, SystemMessage) and first.text.startswith(DEFAULT_COMPRESS_PROMPT)


def respond(messages: list[BaseMessage]) -> AIMessage | str:
    if _is_compress(messages):
        return "MEMO of the earlier turns"
    last = messages[-1]
    if isinstance(last, HumanMessage) and last.text.startswith("look"):
        return ScriptedChatModel.tool_call("lookup", {"q": last.text[:10]})
    return "answer " + "a" * 200


def check_groups(prompt: list[BaseMessage]) -> None:
    """Every tool call is answered right after it, and no result stands alone."""
    for index, message in enumerate(prompt):
        if isinstance(message, AIMessage) and message.tool_calls:
            answered = {m.tool_call_id for m in prompt[index + 1 :] if isinstance(m, ToolMessage)}
            assert {call["id"] for call in message.tool_calls} <= answered
        if isinstance(message, ToolMessage):
            before = prompt[index - 1]
            assert isinstance(before, AIMessage | ToolMessage)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_turns_with_tool_rounds_stay_within_the_budget(
    make_agent: AgentFactory, mode: str
) -> None:
    model = ScriptedChatModel(respond=respond)
    agent = make_agent(model=model, tools=[lookup], compression=CompressionPolicy(budget=BUDGET))
    child = agent.fork(agent.main_session_id, "Research").id
    for n in range(16):
        text = ("look up " if n % 3 == 0 else "tell me ") + f"{n} " + "q" * 200
        if mode == "sync":
            agent.turn(child, text)
        else:
            await agent.aturn(child, text)
    turns = [p for p in model.prompts if not _is_compress(p)]
    assert len(turns) == 16 + 6  # one more call for each turn with a tool round
    assert len(model.prompts) > len(turns)  # the model summarised, more than nothing
    for prompt in turns:
        assert estimate_tokens(prompt) <= BUDGET
        check_groups(prompt)
    assert "MEMO of the earlier turns" in turns[-1][0].text
    records = agent.session(child).messages()
    assert len(records) == 16 * 2 + 6 * 2  # each tool round adds its call and its result
    assert sum(isinstance(m, ToolMessage) for m in records) == 6
