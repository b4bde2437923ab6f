"""Runs of the compiled graph on one checkpointed thread are independent of each other.

Every LangGraph Server thread is such a thread: a run's input (`op`, `input`, `fork`,
`tool_choice`, `mode`) must not carry over into the next run, while continuing a run
(`Command(resume=...)`, or `None` after a crash) still sees the input it started with.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, interrupt

from stello_graph import InvalidInputError, MainSession, build_stello_graph
from stello_graph.storage import MainStorage
from stello_graph.testing import ScriptedChatModel

Graph = CompiledStateGraph[Any, Any, Any, Any]
CONFIG: Any = {"configurable": {"thread_id": "one-thread"}}


@tool
def approve(what: str) -> str:
    """Ask a human to approve something."""
    return f"{what}: {interrupt({'approve': what})}"


class Runner:
    """Runs the compiled graph through `invoke` or `ainvoke`, by mode."""

    def __init__(self, graph: Graph, mode: str) -> None:
        self.graph, self.mode = graph, mode

    async def __call__(self, payload: Any) -> dict[str, Any]:
        if self.mode == "sync":
            return dict(self.graph.invoke(payload, CONFIG))
        return dict(await self.graph.ainvoke(payload, CONFIG))


def _compiled(storage: MainStorage, model: ScriptedChatModel, **options: Any) -> Graph:
    return build_stello_graph(model, storage, **options).compile(checkpointer=InMemorySaver())


@pytest.fixture(params=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_a_turn_after_a_fork_is_a_turn(main_storage: MainStorage, mode: str) -> None:
    main = MainSession.create(main_storage)
    model = ScriptedChatModel(default="Hi there.")
    run = Runner(_compiled(main_storage, model), mode)
    forked = await run({"op": "fork", "session_id": main.id, "fork": {"label": "Child"}})
    child = forked["forked"]["session_id"]
    out = await run({"session_id": child, "input": "hello"})
    assert out["content"] == "Hi there."
    assert [c.label for c in main_storage.get_children(main.id)] == ["Child"]  # no 2nd fork
    assert [m.content for m in main_storage.list_records(child)] == ["hello", "Hi there."]


async def test_a_run_without_input_is_refused(main_storage: MainStorage, mode: str) -> None:
    main = MainSession.create(main_storage)
    model = ScriptedChatModel(default="Hi there.")
    run = Runner(_compiled(main_storage, model), mode)
    await run({"session_id": main.id, "input": "hello"})
    with pytest.raises(InvalidInputError, match="input"):
        await run({"session_id": main.id})
    assert len(model.prompts) == 1  # the previous message was not sent again
    assert len(main_storage.list_records(main.id)) == 2


async def test_tool_choice_and_mode_do_not_carry_over(main_storage: MainStorage, mode: str) -> None:
    main = MainSession.create(main_storage)
    model = ScriptedChatModel(default="Plain answer.")
    run = Runner(_compiled(main_storage, model), mode)
    await run({"session_id": main.id, "input": "one", "tool_choice": "required"})
    await run({"session_id": main.id, "input": "two"})
    assert [call.tool_choice for call in model.calls] == ["required", None]


async def test_an_interrupted_turn_resumes_with_its_input(
    main_storage: MainStorage, mode: str
) -> None:
    main = MainSession.create(main_storage)
    model = ScriptedChatModel(
        [ScriptedChatModel.tool_call("approve", {"what": "deploy"}), "Deployed."]
    )
    run = Runner(_compiled(main_storage, model, tools=[approve]), mode)
    first = await run({"session_id": main.id, "input": "ship it"})
    assert first["__interrupt__"]
    out = await run(Command(resume="yes"))
    assert out["content"] == "Deployed."
    assert main_storage.list_records(main.id)[0].content == "ship it"
