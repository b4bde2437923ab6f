"""The live suite's fixtures: one real model server for the whole run, started and stopped here.

Run with `make test-live` (which installs the server first). The tests are marked `live` and
left out of the default run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stello_graph.providers import OpenAICompatibleChat
from tests.live.llama_server import LiveServer, running_server

ModelFactory = Callable[..., OpenAICompatibleChat]


@pytest.fixture(scope="session")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """SmolLM2-135M-Instruct behind llama-cpp-python's OpenAI API on 127.0.0.1.

    Its log goes to `$STELLO_LIVE_LOG` (default: a file in pytest's temporary directory).
    """
    log = Path(os.environ.get("STELLO_LIVE_LOG") or tmp_path_factory.mktemp("live") / "server.log")
    with running_server(log=log) as server:
        yield server


@pytest.fixture
def live_model(live_server: LiveServer) -> ModelFactory:
    """Make `ChatOpenAI` clients of the live server: short, greedy, seeded generations."""

    def factory(**overrides: Any) -> OpenAICompatibleChat:
        options: dict[str, Any] = {
            "base_url": live_server.base_url,
            "api_key": "sk-local",
            "model": live_server.model,
            "temperature": 0.0,
            "seed": 7,
            "max_tokens": 40,
            "stream_usage": True,
            "max_retries": 0,
            "timeout": 120.0,
            **overrides,
        }
        return OpenAICompatibleChat(**options)

    return factory
