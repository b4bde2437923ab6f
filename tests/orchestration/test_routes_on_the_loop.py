"""An async run decides its next step on its event loop.

LangGraph runs a plain function given as a conditional edge in a worker thread when the run
is async: one thread handoff per decision, which under many gathered turns waits for the
interpreter lock. stello's routes are lookups in the state, so its graphs give LangGraph an
async twin of each (`stello_graph.graph._on_the_loop`); the sync path is unchanged.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

import stello_graph.graph as graph_module
from stello_graph import MainSession, StelloAgent, build_stello_graph
from stello_graph.checkpoints import InMemoryMainStorage
from stello_graph.testing import ScriptedChatModel

ROUTES = ("route_after_model", "route_start", "route_level")


@tool
def lookup(query: str) -> str:
    """Look a fact up."""
    return f"fact about {query}"


@pytest.fixture
def routed(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[int]]:
    """The threads each route of the graphs built in the test ran on, by route."""
    seen: dict[str, list[int]] = {name: [] for name in ROUTES}

    def recording(name: str, route: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def recorded(state: Any) -> Any:
            seen[name].append(threading.get_ident())
            return route(state)

        recorded.__name__ = name
        return recorded

    for name in ROUTES:
        monkeypatch.setattr(graph_module, name, recording(name, getattr(graph_module, name)))
    return seen


async def test_an_async_turn_routes_on_the_loop(routed: dict[str, list[int]]) -> None:
    model = ScriptedChatModel(default="done")
    async with StelloAgent(model=model, storage=InMemoryMainStorage(), tools=[lookup]) as agent:
        sid = (await agent.afork(agent.main_session_id, "Topic")).id
        model.extend([ScriptedChatModel.tool_call("lookup", {"query": "x"}), "found"])
        result = await agent.aturn(sid, "look it up")
        assert result.content == "found" and result.tool_rounds == 1
    loop_thread = threading.get_ident()
    assert routed["route_after_model"] == [loop_thread, loop_thread]  # tools, then the end


async def test_the_orchestration_graph_routes_on_the_loop(routed: dict[str, list[int]]) -> None:
    storage = InMemoryMainStorage()
    main = MainSession.create(storage)
    model = ScriptedChatModel(default="ok")
    app = build_stello_graph(
        model, storage, consolidate_fn=lambda l2, records: "L2", integrate_fn=_integrate
    ).compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t"}}
    forked = await app.ainvoke(
        {"op": "fork", "session_id": main.id, "fork": {"label": "A"}}, config
    )
    child = forked["forked"]["session_id"]
    await app.ainvoke({"session_id": child, "input": "hello"}, config)
    await app.ainvoke({"op": "consolidate", "session_id": child}, config)
    await app.ainvoke({"op": "integrate", "mode": "tree", "session_id": main.id}, config)
    loop_thread = threading.get_ident()
    assert len(routed["route_start"]) == 4 and len(routed["route_level"]) >= 1
    assert {*routed["route_start"], *routed["route_level"], *routed["route_after_model"]} == {
        loop_thread
    }


def test_a_sync_turn_routes_on_its_own_thread(routed: dict[str, list[int]]) -> None:
    with StelloAgent(model=ScriptedChatModel(default="ok"), storage=InMemoryMainStorage()) as agent:
        sid = agent.fork(agent.main_session_id, "Topic").id
        assert agent.turn(sid, "hi").content == "ok"
    assert routed["route_after_model"] == [threading.get_ident()]


def _integrate(children: Any, synthesis: Any) -> Any:
    from stello_graph import IntegrationResult

    return IntegrationResult(synthesis="all of it", insights={})
