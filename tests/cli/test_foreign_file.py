"""`stello-graph chat` on another application's SQLite file refuses it and leaves it alone,
unless told to share it (`--allow-foreign-tables`)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.testing import ScriptedChatModel
from tests.cli.conftest import RunCli


def _app_file(tmp_path: Path) -> Path:
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("CREATE TABLE users (name TEXT)")
        conn.execute("INSERT INTO users VALUES ('ada')")
    conn.close()
    return path


def test_chat_refuses_a_foreign_sqlite_file_and_names_the_flag(cli: RunCli, tmp_path: Path) -> None:
    path = _app_file(tmp_path)
    before = path.read_bytes()
    run = cli("chat", "--db", str(path), input="hi\n", model=ScriptedChatModel(default="ok"))
    assert run.code == 2
    assert "another application's tables ('users')" in run.err
    assert "pass --allow-foreign-tables to add stello-graph's tables to this one" in run.err
    assert "SqliteMainStorage" not in run.err  # a fix the command line can make
    assert "Traceback" not in run.err
    assert path.read_bytes() == before


def test_chat_shares_a_foreign_sqlite_file_with_the_flag(cli: RunCli, tmp_path: Path) -> None:
    path = _app_file(tmp_path)
    run = cli("chat", "--db", str(path), "--allow-foreign-tables", "--manual", input="hi\n",
              model=ScriptedChatModel(default="ok"))  # fmt: skip
    assert run.code == 0, run.err
    assert "Main Session › ok" in run.out
    with SqliteMainStorage(path) as storage:
        main = storage.get_main_session()
        assert main is not None and storage.get_turn_count(main.id) == 1
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT name FROM users").fetchall() == [("ada",)]
    conn.close()
