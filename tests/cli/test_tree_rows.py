"""`tree` and `export` read a file at the current schema version through `TreeRows` (one
read-only snapshot, no model built) and print exactly what the storage's path prints."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from stello_graph import StelloAgent
from stello_graph.checkpoints import SqliteMainStorage, _schema
from stello_graph.checkpoints._sqlite_rows import TreeRows
from stello_graph.testing import ScriptedChatModel
from tests.cli.conftest import Run, RunCli


@pytest.fixture
def rich_db(tmp_path: Path) -> Path:
    """A tree with every kind of line: forks at a turn and of a whole history (shared
    prefixes), a moved fork whose source was removed, an archived session, non-ASCII text,
    a synthesis and an insight, and a second tree in the file."""
    path = tmp_path / "rich.db"
    with StelloAgent(model=ScriptedChatModel(default="Noted — ok."), storage=path) as agent:
        main = agent.main_session_id
        pricing = agent.fork(main, "Pricing — ünïcode")
        agent.turn(pricing.id, "first question")
        agent.turn(pricing.id, "second question")
        again = agent.fork(pricing.id, "Again", context="inherit", at_turn=1)
        whole = agent.fork(pricing.id, "Whole", context="inherit")
        agent.turn(whole.id, "one more")
        source = agent.fork(main, "Source")
        agent.turn(source.id, "a question")
        moved = agent.fork(source.id, "Moved", context="inherit")
        agent.move(moved.id, main)
        agent.remove(source.id)
        agent.archive(again.id)
        agent.storage.put_memory(main, "the synthesis ✓")
        agent.storage.put_memory(whole.id, "whole's L2")
        agent.storage.put_insight(whole.id, "an insight")
    with StelloAgent(model=ScriptedChatModel(default="ok"), storage=path, tree_id="other") as b:
        b.fork(b.main_session_id, "Elsewhere")
    return path


def _rows(path: Path) -> TreeRows:
    rows = TreeRows.open(path, "default")
    assert rows is not None
    return rows


def _storage_refused(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("the storage was opened")


def _no_rows(cls: type[TreeRows], path: Path, tree_id: str) -> None:
    return None


def _both(cli: RunCli, monkeypatch: pytest.MonkeyPatch, *argv: str) -> tuple[Run, Run]:
    """`argv` read through `TreeRows` (the storage refused), then through the storage."""
    with monkeypatch.context() as patch:
        patch.setattr(SqliteMainStorage, "__init__", _storage_refused)
        fast = cli(*argv)
    with monkeypatch.context() as patch:
        patch.setattr(TreeRows, "open", classmethod(_no_rows))
        slow = cli(*argv)
    return fast, slow


@pytest.mark.parametrize(
    "argv",
    [["tree"], ["export"], ["export", "--records"], ["tree", "--tree-id", "other"]],
    ids=["tree", "export", "export-records", "other-tree"],
)
def test_rows_print_what_the_storage_prints(
    cli: RunCli, rich_db: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    fast, slow = _both(cli, monkeypatch, argv[0], "--db", str(rich_db), *argv[1:])
    assert (fast.code, fast.err) == (0, "")
    assert (slow.code, slow.err) == (0, "")
    assert fast.out == slow.out


def test_the_tree_shows_each_kind_of_line(cli: RunCli, rich_db: Path) -> None:
    lines = cli("tree", "--db", str(rich_db)).out.splitlines()
    by_label = {line.split("  (")[0].lstrip("│├└─ "): line for line in lines[:-1]}
    assert by_label["Again [archived]"].endswith("<- forked from 'Pricing — ünïcode' at turn 1")
    assert "(removed) at turn 1" in by_label["Moved"]
    assert "forked from" not in by_label["Pricing — ünïcode"]
    assert lines[-1] == "5 session(s), 1 archived, 3 turn(s)"  # own turns, as `turns` counts


def test_an_older_file_is_read_through_the_storage(
    cli: RunCli, rich_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file at an earlier schema version is brought up to date by the storage, then read."""
    expected = cli("tree", "--db", str(rich_db)).out
    released = _schema.SCHEMA_VERSION
    monkeypatch.setattr(_schema, "MIGRATIONS", (*_schema.MIGRATIONS, lambda db: None))
    monkeypatch.setattr(_schema, "SCHEMA_VERSION", released + 1)
    assert TreeRows.open(rich_db, "default") is None
    assert cli("tree", "--db", str(rich_db)).out == expected
    with sqlite3.connect(rich_db) as conn:
        assert _schema.read_version(conn) == released + 1
    with _rows(rich_db) as rows:  # now current
        assert rows.main_session() is not None


def test_rows_read_one_snapshot(rich_db: Path) -> None:
    """Sessions made while the rows are open are not seen by them: every part of an export
    comes from the same state of the file."""
    with _rows(rich_db) as rows:
        before = rows.session_marks()
        with StelloAgent(model=ScriptedChatModel(default="ok"), storage=rich_db) as agent:
            agent.fork(agent.main_session_id, "Later")
        nodes: list[tuple[Any, ...]] = []
        assert rows.export_rows("nodes", nodes.append) == len(nodes) == 5
        assert rows.session_marks() == before
    with _rows(rich_db) as rows:
        assert len(rows.session_marks()) == len(before) + 1


def test_rows_refuse_what_they_cannot_read(tmp_path: Path) -> None:
    assert TreeRows.open(tmp_path / "missing.db", "default") is None
    plain = tmp_path / "plain.db"
    sqlite3.connect(plain).close()
    assert TreeRows.open(plain, "default") is None  # version 0: no stello schema


def test_the_public_modules_keep_their_type_hints() -> None:
    """The row path lives in modules of its own (`_tree_text`, `_export_rows`), so the
    public ones still name their models at run time (pydantic and `get_type_hints` resolve
    them: a `Topology` can be a field of a model)."""
    import typing

    import pydantic

    from stello_graph.export import export_tree, write_export
    from stello_graph.topology import Topology

    assert set(typing.get_type_hints(Topology.__init__)) >= {
        "nodes",
        "sessions",
        "turns",
        "lineage",
    }
    assert "_text" in typing.get_type_hints(Topology)
    assert "storage" in typing.get_type_hints(export_tree)
    assert "storage" in typing.get_type_hints(write_export)

    class Holder(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)
        tree: Topology

    assert Holder(tree=Topology(nodes=())).tree.nodes == ()


# -- reading leaves the file as it was ---------------------------------------------------------
def _beside(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(path.name))


@pytest.mark.parametrize("argv", [["tree"], ["export", "--records"]], ids=["tree", "export"])
def test_a_read_leaves_no_side_files(cli: RunCli, rich_db: Path, argv: list[str]) -> None:
    """A WAL file opened read-only gets a -wal and a -shm: `tree` on a file nobody has open
    must not leave them next to it (a copied or committed database would carry them)."""
    assert _beside(rich_db) == ["rich.db"]
    result = cli(argv[0], "--db", str(rich_db), *argv[1:])
    assert result.code == 0, result.err
    assert _beside(rich_db) == ["rich.db"]


def test_tree_rows_leave_no_side_files(rich_db: Path) -> None:
    with _rows(rich_db) as rows:
        assert rows.main_session() is not None
        assert _beside(rich_db) != ["rich.db"]  # made while it reads
    assert _beside(rich_db) == ["rich.db"]


def test_a_file_in_use_keeps_its_side_files(rich_db: Path) -> None:
    """The side files of a file another connection has open are that connection's."""
    with SqliteMainStorage(rich_db) as storage:
        with _rows(rich_db) as rows:
            assert rows.main_session() is not None
        assert _beside(rich_db) == ["rich.db", "rich.db-shm", "rich.db-wal"]
        storage.put_memory(storage.list_sessions()[0].id, "written after the read")
    assert _beside(rich_db) == ["rich.db"]  # the writer's last close removed them


def test_a_writer_opening_during_a_read_keeps_the_side_files(rich_db: Path) -> None:
    rows = _rows(rich_db)
    with SqliteMainStorage(rich_db) as storage:
        rows.close()  # the writer has the file open: its files stay
        assert _beside(rich_db) == ["rich.db", "rich.db-shm", "rich.db-wal"]
        assert storage.list_sessions()
