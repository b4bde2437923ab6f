"""`stello-graph chat` on another application's SQLite file refuses it and leaves it alone."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from stello_graph.testing import ScriptedChatModel
from tests.cli.conftest import RunCli


def test_chat_refuses_a_foreign_sqlite_file(cli: RunCli, tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("CREATE TABLE users (name TEXT)")
    conn.close()
    before = path.read_bytes()
    run = cli("chat", "--db", str(path), input="hi\n", model=ScriptedChatModel(default="ok"))
    assert run.code == 2
    assert "another application's tables ('users')" in run.err
    assert "Traceback" not in run.err
    assert path.read_bytes() == before
