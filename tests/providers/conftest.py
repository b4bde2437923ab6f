"""Fixtures of the provider tests: a scripted OpenAI server on loopback and `ChatOpenAI` on it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_openai import ChatOpenAI

from stello_graph import StelloAgent
from stello_graph.checkpoints import InMemoryMainStorage
from stello_graph.testing.openai_server import FakeOpenAI

ModelFactory = Callable[..., ChatOpenAI]
AgentFactory = Callable[..., StelloAgent]


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    """A `FakeOpenAI` on a free port of 127.0.0.1, stopped after the test."""
    with FakeOpenAI() as fake:
        yield fake
    assert not fake.errors, f"the fake server failed: {fake.errors!r}"


def openai_model(base_url: str, **overrides: Any) -> ChatOpenAI:
    """`ChatOpenAI` on a local server: any api key, usage in streams, no retries, short timeout."""
    options: dict[str, Any] = {
        "base_url": base_url,
        "api_key": "sk-test",
        "model": "fake",
        "stream_usage": True,
        "max_retries": 0,
        "timeout": 5.0,
        **overrides,
    }
    return ChatOpenAI(**options)


@pytest.fixture
def chat_model(server: FakeOpenAI) -> ModelFactory:
    """Make a `ChatOpenAI` talking to `server` (keyword arguments override the defaults)."""

    def factory(**overrides: Any) -> ChatOpenAI:
        return openai_model(server.base_url, **overrides)

    return factory


@pytest.fixture(params=["memory", "sqlite"])
def make_agent(
    request: pytest.FixtureRequest, tmp_path: Path, chat_model: ModelFactory
) -> Iterator[AgentFactory]:
    """Build `StelloAgent`s on `ChatOpenAI` over HTTP, on each storage backend; closed after.

    Records go through a real round trip on the SQLite backend, so a history that a provider
    sent is sent back to it from storage on the next turn.
    """
    made: list[StelloAgent] = []

    def factory(**kwargs: Any) -> StelloAgent:
        kwargs.setdefault("model", chat_model())
        if request.param == "memory":
            kwargs.setdefault("storage", InMemoryMainStorage())
        else:
            kwargs.setdefault("storage", str(tmp_path / "stello.db"))
        agent = StelloAgent(**kwargs)
        made.append(agent)
        return agent

    yield factory
    for agent in made:
        agent.close()
