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
AgentsOnFile = Callable[..., StelloAgent]
"""`agents(db, model, **kwargs)`: a `StelloAgent` on the SQLite file `db` (or the PostgreSQL
DSN `db`) (`on_file`)."""


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
def on_file() -> Iterator[AgentsOnFile]:
    """Build agents on SQLite files or PostgreSQL DSNs (several may share one, as processes
    do); closed after the test."""
    made: list[StelloAgent] = []

    def factory(db: Path | str, model: Any, **kwargs: Any) -> StelloAgent:
        agent = StelloAgent(model=model, storage=db, **kwargs)
        made.append(agent)
        return agent

    yield factory
    for agent in made:
        agent.close()


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    return tmp_path / "stello.db"


def close_storage(storage: MainStorage) -> None:
    if isinstance(storage, SqliteMainStorage):
        storage.close()


def lose_last_checkpoint(agent: StelloAgent, session_id: str) -> None:
    """What a crash right after a turn's commit leaves when its step's results were still on
    their way to the disk: the thread's newest checkpoint and the writes of the step that
    made it are gone; a resume continues from the checkpoint before, as a recovering
    process does."""
    from langgraph.checkpoint.memory import InMemorySaver

    from stello_graph.checkpoints.saver import StelloSqliteSaver

    saver, config = agent.checkpointer, agent.config(session_id)
    assert saver is not None
    latest = saver.get_tuple(config)
    assert latest is not None and latest.parent_config is not None
    thread = str(config["configurable"]["thread_id"])
    checkpoint_id = latest.config["configurable"]["checkpoint_id"]
    parent_id = latest.parent_config["configurable"]["checkpoint_id"]
    if isinstance(saver, InMemorySaver):
        del saver.storage[thread][""][checkpoint_id]
        saver.writes.pop((thread, "", parent_id), None)
    elif not isinstance(saver, StelloSqliteSaver):  # LangGraph's PostgresSaver
        with saver._cursor() as pg:  # type: ignore[attr-defined]
            pg.execute(
                "DELETE FROM checkpoints WHERE thread_id = %s AND checkpoint_id = %s",
                (thread, checkpoint_id),
            )
            pg.execute(
                "DELETE FROM checkpoint_writes WHERE thread_id = %s AND checkpoint_id = %s",
                (thread, parent_id),
            )
    else:
        with saver.cursor() as cur:
            cur.execute(
                "DELETE FROM checkpoints WHERE thread_id = ? AND checkpoint_id = ?",
                (thread, checkpoint_id),
            )
            cur.execute(
                "DELETE FROM writes WHERE thread_id = ? AND checkpoint_id = ?", (thread, parent_id)
            )
