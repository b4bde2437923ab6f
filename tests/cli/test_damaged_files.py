"""`stello-graph tree` and `export` on damaged files: damaged rows are shown marked (exit 0,
a warning on stderr), a file whose pages are damaged is refused (exit 2, the findings of
`PRAGMA quick_check` named), and a command that reads a damaged session itself exits 2
naming the session and the column. No traceback either way."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from stello_graph import StelloAgent
from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.errors import DamagedDataError
from stello_graph.testing import ScriptedChatModel
from stello_graph.topology import Topology
from tests._helpers import corrupt_pages
from tests.cli.conftest import RunCli


def _ids(db: Path) -> dict[str, str]:
    with sqlite3.connect(db) as conn:
        found = dict(conn.execute("SELECT label, id FROM stello_sessions"))
    conn.close()
    return found


def _damage(db: Path, *statements: tuple[str, tuple[str, ...]]) -> None:
    with sqlite3.connect(db) as conn:
        for sql, params in statements:
            conn.execute(sql, params)
    conn.close()


def _copy(source: Path, target: Path) -> Path:
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{source}{suffix}").exists():
            shutil.copy(f"{source}{suffix}", f"{target}{suffix}")
    return target


@pytest.fixture
def damaged_db(demo_db: Path) -> tuple[Path, dict[str, str]]:
    """The demo's tree: a label that is not UTF-8 (Pricing), tags that are not JSON
    (Onboarding), and Growth its own parent (a cycle)."""
    ids = _ids(demo_db)
    _damage(
        demo_db,
        *(
            (f"UPDATE {t} SET label = CAST(X'50FF' AS TEXT) WHERE id = ?", (ids["Pricing"],))
            for t in ("stello_sessions", "stello_nodes")
        ),
        ("UPDATE stello_sessions SET tags = '[oops' WHERE id = ?", (ids["Onboarding"],)),
        ("UPDATE stello_nodes SET parent_id = id WHERE id = ?", (ids["Growth"],)),
    )
    return demo_db, ids


def test_tree_shows_every_session_and_marks_the_damaged_ones(
    cli: RunCli, damaged_db: tuple[Path, dict[str, str]]
) -> None:
    db, ids = damaged_db
    run = cli("tree", "--db", str(db))
    assert run.code == 0, run.err
    lines = {line.split("(")[-1].split(")")[0]: line for line in run.out.splitlines()}
    assert set(ids.values()) <= set(lines)  # every session, the detached ones too
    assert lines[ids["Pricing"]].lstrip("├└─ ").startswith("(undecodable)  (")
    assert lines[ids["Pricing"]].endswith("[damaged: label]")
    assert lines[ids["Onboarding"]].endswith("[damaged: tags]")
    assert "[detached: its parents make a cycle]" in lines[ids["Growth"]]
    assert "warning: 3 session(s) of this tree are damaged" in run.err
    assert ids["Pricing"] in run.err and "Traceback" not in run.err
    with SqliteMainStorage(db) as storage:  # what `tree()` shows, line for line
        assert run.out.splitlines()[:-1] == Topology.read(storage).render_text().splitlines()


def test_export_exports_every_session_and_marks_the_damaged_ones(
    cli: RunCli, damaged_db: tuple[Path, dict[str, str]]
) -> None:
    db, ids = damaged_db
    run = cli("export", "--db", str(db), "--records")
    assert run.code == 0, run.err
    data = json.loads(run.out)
    sessions = {s["id"]: s for s in data["sessions"]}
    nodes = {n["id"]: n for n in data["nodes"]}
    assert set(sessions) == set(nodes) == set(ids.values())
    assert sessions[ids["Pricing"]]["label"] == "(undecodable)"
    assert sessions[ids["Pricing"]]["damaged"] == ["label"]
    assert nodes[ids["Pricing"]]["damaged"] == ["label"]
    assert sessions[ids["Onboarding"]]["damaged"] == ["tags"]
    assert nodes[ids["Growth"]]["detached"] is True
    assert sessions[ids["Pricing"]]["records"]  # the rest of its row is there
    assert "warning:" in run.err and "Traceback" not in run.err


def test_a_command_that_reads_a_damaged_session_exits_2_naming_it(
    cli: RunCli, demo_db: Path
) -> None:
    main = _ids(demo_db)["Main Session"]
    _damage(
        demo_db, ("UPDATE stello_sessions SET role = 'main', status = 'gone' WHERE id = ?", (main,))
    )
    before = demo_db.read_bytes()
    run = cli("chat", "--db", str(demo_db), "--model", "scripted", input="/quit\n")
    assert run.code == 2
    assert f"Session '{main}': column 'status' cannot be decoded" in run.err
    assert "'gone'" in run.err and "Traceback" not in run.err
    assert demo_db.read_bytes() == before


@pytest.fixture(scope="module")
def big_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tree whose last pages hold records (made once: copy it before damaging it)."""
    db = tmp_path_factory.mktemp("big") / "big.db"
    with StelloAgent(model=ScriptedChatModel(default="r " * 300), storage=db) as agent:
        child = agent.fork(agent.main_session_id, "child").id
        for n in range(30):
            agent.turn(child, f"{n} " + "x" * 600)
    return db


@pytest.mark.parametrize("command", ["tree", "export"])
def test_a_file_whose_pages_are_damaged_is_refused(
    cli: RunCli, big_template: Path, tmp_path: Path, command: str
) -> None:
    db = _copy(big_template, tmp_path / "big.db")
    corrupt_pages(db)
    run = cli(command, "--db", str(db))
    assert run.code == 2
    assert f"The database {str(db)!r} is damaged: PRAGMA quick_check found: " in run.err
    assert "Restore it from a backup" in run.err
    assert run.out == "" and "Traceback" not in run.err


def test_a_storage_check_reports_damaged_pages(big_template: Path, tmp_path: Path) -> None:
    db = _copy(big_template, tmp_path / "big.db")
    with SqliteMainStorage(db) as storage:
        storage.check()  # a sound file
    corrupt_pages(db)
    with SqliteMainStorage(db) as storage, pytest.raises(DamagedDataError, match="quick_check"):
        storage.check()
