"""Async-only tools (`@tool async def`, `StructuredTool(coroutine=...)`, every MCP tool) run
on sync turns too: the sync paths run their coroutine to completion on a private loop, the
async paths await it natively."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool, StructuredTool, tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.prebuilt import ToolRuntime
from langgraph.types import interrupt
from pydantic import BaseModel, Field

from stello_graph import StelloAgent
from stello_graph._calls import sync_tool
from stello_graph.testing import ScriptedChatModel
from tests.orchestration.conftest import AgentFactory

ran_on: list[tuple[str, asyncio.AbstractEventLoop]] = []


async def _lookup(city: str) -> str:
    ran_on.append((threading.current_thread().name, asyncio.get_running_loop()))
    await asyncio.sleep(0)
    return f"sunny in {city}"


class _LookupArgs(BaseModel):
    city: str = Field(description="The city to look up.")


@tool
async def decorated(city: str) -> str:
    """Look the weather up (an `@tool async def`)."""
    return await _lookup(city)


async def bare(city: str) -> str:
    """Look the weather up (a bare coroutine function)."""
    return await _lookup(city)


def _structured() -> BaseTool:
    return StructuredTool.from_function(
        coroutine=_lookup, name="structured", description="Look the weather up.",
        args_schema=_LookupArgs,
    )  # fmt: skip


KINDS: dict[str, Callable[[], Any]] = {
    "decorated": lambda: decorated,
    "structured": _structured,
    "bare": lambda: bare,
}


def _agent(make_agent: AgentFactory, kind: str) -> tuple[StelloAgent, ScriptedChatModel]:
    ran_on.clear()
    model = ScriptedChatModel(
        [ScriptedChatModel.tool_call(kind, {"city": "Paris"}), "It is sunny."]
    )
    return make_agent(model=model, tools=[KINDS[kind]()]), model


def _result_seen(model: ScriptedChatModel) -> ToolMessage:
    (result,) = [m for m in model.prompts[1] if isinstance(m, ToolMessage)]
    return result


SYNC_RUNS: dict[str, Callable[[StelloAgent, str], object]] = {
    "turn": lambda agent, sid: agent.turn(sid, "Weather?"),
    "stream": lambda agent, sid: list(agent.stream(sid, "Weather?")),
    "graph": lambda agent, sid: agent.graph.invoke(
        {"session_id": sid, "input": "Weather?"}, agent.config(sid)
    ),
}


@pytest.mark.parametrize("run", SYNC_RUNS)
@pytest.mark.parametrize("kind", KINDS)
def test_sync_turns_run_async_only_tools(make_agent: AgentFactory, kind: str, run: str) -> None:
    agent, model = _agent(make_agent, kind)
    sid = agent.main_session_id
    SYNC_RUNS[run](agent, sid)
    result = _result_seen(model)
    assert (result.content, result.status) == ("sunny in Paris", "success")
    assert agent.session(sid).messages()[2].content == "sunny in Paris"
    assert len(ran_on) == 1


@pytest.mark.parametrize("kind", KINDS)
async def test_async_turns_await_async_only_tools_on_their_loop(
    make_agent: AgentFactory, kind: str
) -> None:
    agent, model = _agent(make_agent, kind)
    await agent.aturn(agent.main_session_id, "Weather?")
    assert _result_seen(model).content == "sunny in Paris"
    assert ran_on == [(threading.current_thread().name, asyncio.get_running_loop())]


def test_an_async_tool_interrupts_a_sync_turn_and_resumes(make_agent: AgentFactory) -> None:
    @tool
    async def delete_everything(target: str) -> str:
        """Dangerous: needs a human's approval."""
        answer = interrupt({"action": "delete", "target": target})
        return "deleted" if answer == "yes" else "cancelled"

    model = ScriptedChatModel(
        [ScriptedChatModel.tool_call("delete_everything", {"target": "/tmp/x"}), "Done."]
    )
    agent = make_agent(model=model, tools=[delete_everything])
    sid = agent.main_session_id
    paused = agent.turn(sid, "clean up")
    assert paused.interrupted
    assert paused.interrupts[0].value == {"action": "delete", "target": "/tmp/x"}
    assert agent.session(sid).messages() == []
    assert agent.resume(sid, "yes").content == "Done."
    assert agent.session(sid).messages()[2].content == "deleted"


def test_an_async_tool_keeps_its_injected_runtime_on_a_sync_turn(
    make_agent: AgentFactory,
) -> None:
    @tool
    async def whoami(note: str, runtime: ToolRuntime) -> str:
        """Say which call and session this is."""
        return f"{note}: {runtime.tool_call_id} in {runtime.state['session_id']}"

    model = ScriptedChatModel(
        [ScriptedChatModel.tool_call("whoami", {"note": "hi"}, id="call-7"), "ok"]
    )
    agent = make_agent(model=model, tools=[whoami])
    sid = agent.main_session_id
    agent.turn(sid, "who?")
    assert _result_seen(model).content == f"hi: call-7 in {sid}"
    assert model.calls[0].tools == ["whoami", "create_session"]  # runtime is not shown


def test_the_sync_twin_keeps_what_the_model_and_tool_node_see() -> None:
    original = StructuredTool.from_function(
        coroutine=_lookup, name="lookup", description="Look it up.", args_schema=_LookupArgs,
        return_direct=True, response_format="content",
    )  # fmt: skip
    twin = sync_tool(original)
    assert isinstance(twin, StructuredTool) and twin is not original
    assert (twin.name, twin.description, twin.return_direct) == ("lookup", "Look it up.", True)
    assert twin.args_schema is _LookupArgs and twin.coroutine is _lookup
    assert convert_to_openai_tool(twin) == convert_to_openai_tool(original)  # what models see
    assert original.func is None  # the caller's tool is not changed
    assert twin.invoke({"city": "Rome"}) == "sunny in Rome"

    def plain(city: str) -> str:
        """A sync function."""
        return city

    assert sync_tool(plain) is plain
    assert sync_tool(decorated).invoke({"city": "Oslo"}) == "sunny in Oslo"
