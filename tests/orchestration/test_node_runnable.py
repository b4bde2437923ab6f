"""`StelloNode`: nodes run their function directly inside a graph, and set the context alone."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import HumanMessage, RemoveMessage
from langgraph.graph.message import REMOVE_ALL_MESSAGES

from stello_graph import MainSession, nodes
from stello_graph.checkpoints import InMemoryMainStorage
from stello_graph.graph import build_graph
from stello_graph.testing import ScriptedChatModel


class Runs(BaseCallbackHandler):
    """Records the name of every chain run and every chat-model run."""

    def __init__(self) -> None:
        self.chains: list[str] = []
        self.models = 0

    def on_chain_start(
        self, serialized: dict[str, Any] | None, inputs: Any, *, run_id: UUID, **kw: Any
    ) -> None:
        self.chains.append(str(kw.get("name") or (serialized or {}).get("name")))

    def on_chat_model_start(self, serialized: Any, messages: Any, **kw: Any) -> None:
        self.models += 1


def _deps() -> tuple[nodes.StelloDeps, str]:
    storage = InMemoryMainStorage()
    main = MainSession.create(storage)
    return nodes.StelloDeps(storage=storage, model=ScriptedChatModel(default="hi")), main.id


def _state(session_id: str) -> dict[str, Any]:
    human = HumanMessage(content="hello", id="h1")
    return {
        "session_id": session_id,
        "pending": [RemoveMessage(id=REMOVE_ALL_MESSAGES), human],
        "tool_rounds": 0,
    }


def test_a_node_invoked_alone_passes_its_callbacks_to_the_model_call() -> None:
    deps, sid = _deps()
    node = nodes.make_model_node(deps)
    assert isinstance(node, nodes.StelloNode) and node.name == "model"
    runs = Runs()
    out = node.invoke(_state(sid), {"callbacks": [runs]})
    assert out["pending"][-1].text == "hi"
    assert runs.models == 1 and runs.chains == ["model"]


def test_the_async_path_alone_does_the_same() -> None:
    deps, sid = _deps()
    runs = Runs()
    out = asyncio.run(nodes.make_model_node(deps).ainvoke(_state(sid), {"callbacks": [runs]}))
    assert out["pending"][-1].text == "hi"
    assert runs.models == 1 and runs.chains == ["model"]


def test_in_a_graph_each_node_is_one_run() -> None:
    deps, sid = _deps()
    graph = build_graph(deps).compile()
    for call in (graph.invoke, lambda s, c: asyncio.run(graph.ainvoke(s, c))):
        runs = Runs()
        out = call({"session_id": sid, "input": "hello"}, {"callbacks": [runs]})
        assert out["content"] == "hi"
        assert runs.models == 1
        for name in ("model",):  # the turn is one step: it opens, calls and commits
            assert runs.chains.count(name) == 1, (name, runs.chains)
