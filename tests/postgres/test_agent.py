"""An agent on a `postgresql://` URL: storage and LangGraph checkpointer on one database."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from stello_graph import StelloAgent
from stello_graph.checkpoints import (
    PostgresMainStorage,
    StelloPostgresSaver,
    open_postgres,
)
from stello_graph.errors import StorageUnavailableError
from stello_graph.testing import ScriptedChatModel


def _checkpoint_rows(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT COUNT(*) FROM checkpoints").fetchone()
    assert row is not None
    return int(row[0])


def test_an_agent_on_a_url_turns_and_prunes_its_checkpoints(postgres_dsn: str) -> None:
    with StelloAgent(model=ScriptedChatModel(default="ok"), storage=postgres_dsn) as agent:
        assert isinstance(agent.storage, PostgresMainStorage)
        assert isinstance(agent.checkpointer, StelloPostgresSaver)
        sid = agent.main_session_id
        assert agent.turn(sid, "hi").content == "ok"
        assert _checkpoint_rows(postgres_dsn) == 0  # the committed turn's thread is pruned
    with StelloAgent(
        model=ScriptedChatModel(default="ok"), storage=postgres_dsn, prune_checkpoints=False
    ) as agent:
        assert agent.main_session_id == sid  # the tree was found again
        agent.turn(sid, "again")
        assert _checkpoint_rows(postgres_dsn) > 0
        assert [m.content for m in agent.session(sid).messages()] == ["hi", "ok", "again", "ok"]


def test_an_agent_on_a_key_value_connection_string_opens_postgresql(
    postgres_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """libpq's other form (`host=... dbname=...`) is PostgreSQL too, not a SQLite file
    named by that text."""
    conninfo = make_conninfo("", **conninfo_to_dict(postgres_dsn))
    assert "://" not in conninfo, conninfo
    monkeypatch.chdir(tmp_path)
    with StelloAgent(model=ScriptedChatModel(default="ok"), storage=conninfo) as agent:
        assert isinstance(agent.storage, PostgresMainStorage)
        assert agent.turn(agent.main_session_id, "hi").content == "ok"
    assert list(tmp_path.iterdir()) == []


async def test_an_async_agent_on_a_url(postgres_dsn: str) -> None:
    agent = StelloAgent(model=ScriptedChatModel(default="ok"), storage=postgres_dsn, tree_id="a")
    try:
        child = await agent.afork(agent.main_session_id, label="Child")
        result = await agent.aturn(child.id, "hi")
        assert result.content == "ok"
        assert _checkpoint_rows(postgres_dsn) == 0
    finally:
        await agent.aclose()


def test_open_postgres_gives_both_on_one_database(postgres_dsn: str) -> None:
    storage, saver = open_postgres(postgres_dsn, tree_id="alice")
    try:
        with StelloAgent(
            model=ScriptedChatModel(default="ok"), storage=storage, checkpointer=saver
        ) as agent:
            agent.turn(agent.main_session_id, "hi")
        assert storage.tree_id == "alice"
        assert storage.count_records(agent.main_session_id) == 2
    finally:
        storage.close()
        saver.close()


def test_an_agent_on_a_server_that_is_down(postgres_dsn: str) -> None:
    with pytest.raises(StorageUnavailableError):
        StelloAgent(model=ScriptedChatModel(), storage="postgresql://nobody@127.0.0.1:1/none")


def test_the_inspector_opens_a_postgresql_url(postgres_dsn: str) -> None:
    from stello_graph.cli._common import open_storage

    with StelloAgent(model=ScriptedChatModel(default="ok"), storage=postgres_dsn) as agent:
        main = agent.main_session_id
    storage, shown = open_storage(postgres_dsn, "default")
    try:
        assert isinstance(storage, PostgresMainStorage)
        assert storage.get_main_session() is not None
        assert storage.get_main_session().id == main  # type: ignore[union-attr]
        assert shown.startswith("postgresql://stello@127.0.0.1:")
    finally:
        storage.close()
