"""Fixtures of the orchestration tests: an agent factory on every storage backend."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stello_graph import StelloAgent
from stello_graph.checkpoints import InMemoryMainStorage, SqliteMainStorage
from stello_graph.storage import MainStorage
from tests._postgres import POSTGRES

AgentFactory = Callable[..., StelloAgent]


@pytest.fixture(params=["memory", "sqlite", *(["postgres"] if POSTGRES.wanted else [])])
def make_agent(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AgentFactory]:
    """Build agents on a fresh storage of the parametrised backend; closed after the test."""
    made: list[StelloAgent] = []
    storages: list[MainStorage] = []

    def factory(**kwargs: Any) -> StelloAgent:
        if "storage" not in kwargs:
            if request.param == "memory":
                kwargs["storage"] = storages[0] if storages else InMemoryMainStorage()
            elif request.param == "postgres":  # a URL: the agent opens storage and saver
                kwargs["storage"] = POSTGRES.dsn_for(tmp_path)
            else:
                kwargs["storage"] = str(tmp_path / "stello.db")
            if request.param == "memory" and not storages:
                storages.append(kwargs["storage"])
        agent = StelloAgent(**kwargs)
        made.append(agent)
        return agent

    yield factory
    for agent in made:
        agent.close()
    for storage in storages:
        close = getattr(storage, "close", None)
        if close is not None:
            close()


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    return tmp_path / "stello.db"


def close_storage(storage: MainStorage) -> None:
    if isinstance(storage, SqliteMainStorage):
        storage.close()
