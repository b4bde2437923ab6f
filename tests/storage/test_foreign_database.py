"""A SQLite file of another application is refused unless sharing it is asked for."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stello_graph import ForeignDatabaseError, StelloAgent, StorageError
from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.checkpoints.saver import open_sqlite
from stello_graph.models import SessionMeta
from stello_graph.testing import ScriptedChatModel


def app_database(path: Path, *tables: str) -> bytes:
    conn = sqlite3.connect(path)
    with conn:
        for table in tables:
            conn.execute(f"CREATE TABLE {table} (name TEXT)")
        conn.execute(f"INSERT INTO {tables[0]} VALUES ('ada')")
    conn.close()
    return path.read_bytes()


def on_connection(path: Path) -> Any:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        return SqliteMainStorage(conn)
    finally:
        conn.close()


OPENERS: dict[str, Callable[[Path], Any]] = {
    "storage": lambda p: SqliteMainStorage(p),
    "storage-str": lambda p: SqliteMainStorage(str(p), tree_id="alice"),
    "connection": on_connection,
    "agent": lambda p: StelloAgent(model=ScriptedChatModel(), storage=p),
    "open_sqlite": lambda p: open_sqlite(p),
}


@pytest.mark.parametrize("open_it", OPENERS.values(), ids=OPENERS.keys())
def test_a_foreign_file_is_refused_and_left_as_it_was(
    tmp_path: Path, open_it: Callable[[Path], Any]
) -> None:
    path = tmp_path / "app.db"
    before = app_database(path, "users", "orders")
    with pytest.raises(ForeignDatabaseError) as caught:
        open_it(path)
    message = str(caught.value)
    assert repr(str(path)) in message
    assert "'orders', 'users'" in message
    assert "allow_foreign_tables=True" in message
    assert isinstance(caught.value, StorageError)
    assert path.read_bytes() == before
    assert not Path(f"{path}-wal").exists()


def test_sharing_a_foreign_file_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    app_database(path, "users")
    with SqliteMainStorage(path, allow_foreign_tables=True) as storage:
        storage.put_session(SessionMeta(id="s1", label="One"))
    with SqliteMainStorage(path) as storage:  # a stello database now: no flag needed
        assert storage.get_session("s1") is not None
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT name FROM users").fetchall() == [("ada",)]
    conn.close()
    storage, saver = open_sqlite(tmp_path / "other.db", allow_foreign_tables=True)
    storage.close()
    saver.conn.close()


def test_an_agent_on_a_shared_foreign_file(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    app_database(path, "users")
    storage = SqliteMainStorage(path, allow_foreign_tables=True)
    with StelloAgent(model=ScriptedChatModel(default="ok"), storage=storage) as agent:
        assert agent.turn(agent.main_session_id, "hi").content == "ok"
    storage.close()


@pytest.mark.parametrize("tables", [(), ("checkpoints", "writes")], ids=["empty", "langgraph"])
def test_files_that_are_not_foreign(tmp_path: Path, tables: tuple[str, ...]) -> None:
    """An empty database, or one holding only a LangGraph checkpointer's tables (the
    checkpointer stello puts on its own file), is not another application's."""
    path = tmp_path / "graph.db"
    sqlite3.connect(path).close()
    if tables:
        app_database(path, *tables)
    with SqliteMainStorage(path) as storage:
        storage.put_session(SessionMeta(id="s1", label="One"))
