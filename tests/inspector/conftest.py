"""Fixtures of the inspector tests: a small tree with every kind of data a page shows."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import tool
from starlette.applications import Starlette
from starlette.testclient import TestClient

from stello_graph.agent import StelloAgent
from stello_graph.cli import _offline
from stello_graph.inspector import create_app
from stello_graph.models import Compression
from stello_graph.storage import MainStorage
from stello_graph.testing import ScriptedChatModel


@tool
def lookup(topic: str) -> str:
    """Look a topic up."""
    return f"notes on {topic}"


def _reply(messages: list[BaseMessage]) -> str | AIMessage:
    last = messages[-1]
    if isinstance(last, ToolMessage):
        return "Found it."
    if "look up" in last.text:
        return ScriptedChatModel.tool_call("lookup", {"topic": "tiers"}, content="Checking.")
    return "Noted."


@dataclass
class Tree:
    storage: MainStorage
    agent: StelloAgent
    main: str
    pricing: str
    tiers: str
    growth: str


def build_tree(storage: MainStorage) -> Tree:
    """Main -> Pricing (3 turns, one with a tool call, L2 over two, an insight, a subtree
    synthesis and a compression) -> Tiers; Main -> Growth (archived)."""
    agent = StelloAgent(
        model=ScriptedChatModel(respond=_reply),
        storage=storage,
        tools=[lookup],
        consolidate_fn=_offline.summarise,
        integrate_fn=_offline.integrate,
        system_prompt="You run a brainstorm.",
    )
    main = agent.main_session_id
    pricing = agent.fork(main, "Pricing", system_prompt="Think about prices.").id
    growth = agent.fork(main, "Growth").id
    agent.turn(pricing, "Please look up the tiers.")
    agent.turn(pricing, "Free tier?")
    agent.consolidate(pricing)
    agent.turn(growth, "Where do users come from?")
    agent.consolidate(growth)
    agent.integrate()
    agent.turn(pricing, "And a paid tier?")
    tiers = agent.fork(pricing, "Tiers").id
    storage.put_insight(pricing, "Growth wants a free tier.")
    storage.put_subtree_synthesis(pricing, "Tiers: three of them.")
    storage.put_compression(pricing, Compression(summary="They talked about tiers.", through=2))
    agent.archive(growth)
    return Tree(storage, agent, main, pricing, tiers, growth)


@pytest.fixture
def tree(main_storage: MainStorage) -> Iterator[Tree]:
    built = build_tree(main_storage)
    yield built
    built.agent.close()


HOST = "testserver"
"""The `Host` of `TestClient`'s requests: the apps of these tests are served as it."""


def inspector_app(storage: MainStorage, **options: Any) -> Starlette:
    """`create_app(storage, **options)`, served as `TestClient`'s host."""
    return create_app(storage, host=HOST, **options)


def page_headers(app: Starlette) -> dict[str, str]:
    """What the inspector's own page sends with a write: JSON, its origin, the app's token."""
    return {
        "Content-Type": "application/json",
        "Origin": f"http://{HOST}",
        "X-Stello-Token": app.state.inspector.token,
    }


@pytest.fixture
def client(tree: Tree) -> Iterator[TestClient]:
    with TestClient(inspector_app(tree.storage)) as test_client:
        yield test_client


@pytest.fixture
def writer(tree: Tree) -> Iterator[TestClient]:
    """A client of a `write=True` app that sends what its page sends."""
    app = inspector_app(tree.storage, write=True, agent=lambda: tree.agent)
    with TestClient(app, headers=page_headers(app)) as test_client:
        yield test_client
