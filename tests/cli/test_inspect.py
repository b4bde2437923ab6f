"""`stello-graph tree` / `export`, and what the command line does with bad input."""

from __future__ import annotations

import json
import runpy
import sqlite3
import sys
import xml.etree.ElementTree as ET
from functools import partial
from pathlib import Path

import pytest

from stello_graph import StelloAgent, __version__
from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.cli import _common
from stello_graph.cli._common import CliError, check_tree, probe_database
from stello_graph.cli._inspect import EXPORT_FORMAT
from stello_graph.testing import ScriptedChatModel
from tests.cli.conftest import RunCli

SVG = "{http://www.w3.org/2000/svg}"


def test_tree_prints_the_tree_and_writes_its_star_map(
    cli: RunCli, demo_db: Path, tmp_path: Path
) -> None:
    out_svg = tmp_path / "map.svg"
    run = cli("tree", "--db", str(demo_db), "--svg", str(out_svg))
    assert run.code == 0, run.err
    lines = run.out.splitlines()
    assert lines[0].startswith("Main Session  (")
    assert [line.split("  (")[0] for line in lines[1:4]] == [
        "├── Pricing", "├── Onboarding", "└── Growth",
    ]  # fmt: skip
    assert "4 session(s), 0 archived, 5 turn(s)" in run.out
    assert f"star map: {out_svg}" in run.out
    root = ET.parse(out_svg).getroot()
    groups = root.findall(f".//{SVG}g[@data-id]")
    assert sorted(g.attrib["data-turns"] for g in groups) == ["1", "1", "1", "2"]


def test_tree_shows_where_a_fork_at_a_turn_came_from(cli: RunCli, demo_db: Path) -> None:
    with SqliteMainStorage(demo_db) as storage:
        pricing = next(s for s in storage.list_sessions() if s.label == "Pricing")
    with StelloAgent(model=ScriptedChatModel(default="ok"), storage=demo_db) as agent:
        child = agent.fork(pricing.id, "Pricing, again", context="inherit", at_turn=1)
    run = cli("tree", "--db", str(demo_db))
    assert run.code == 0, run.err
    line = next(line for line in run.out.splitlines() if "Pricing, again" in line)
    assert line.endswith(f"({child.id})  <- forked from 'Pricing' at turn 1")


def test_tree_svg_to_stdout(cli: RunCli, demo_db: Path) -> None:
    run = cli("tree", "--db", str(demo_db), "--svg", "-", "--size", "300")
    assert run.code == 0
    root = ET.fromstring(run.out)
    assert root.attrib["width"] == "300"
    assert len(root.findall(f".//{SVG}circle[@class='star']")) == 4


def test_export_is_the_tree_with_sessions_l2_and_synthesis(cli: RunCli, demo_db: Path) -> None:
    run = cli("export", "--db", str(demo_db))
    assert run.code == 0, run.err
    data = json.loads(run.out)
    assert data["format"] == EXPORT_FORMAT
    assert data["synthesis"].startswith("Launch plan: Pricing: Yes")
    main_id = data["main_session_id"]
    assert [n["parent_id"] for n in data["nodes"]] == [None, main_id, main_id, main_id]
    by_label = {s["label"]: s for s in data["sessions"]}
    assert by_label["Main Session"]["role"] == "main"
    assert by_label["Main Session"]["l2"] is None
    assert by_label["Pricing"]["l2"] == "Yes: a free tier capped at 3 projects."
    assert by_label["Pricing"]["turns"] == 2
    assert by_label["Pricing"]["record_count"] == 4
    assert by_label["Pricing"]["insight"] is None  # delivered by the demo's last turn
    assert "records" not in by_label["Pricing"]
    records = json.loads(cli("export", "--db", str(demo_db), "--records").out)
    growth = next(s for s in records["sessions"] if s["label"] == "Growth")
    assert [r["type"] for r in growth["records"]] == ["human", "ai"]
    assert growth["records"][1]["data"]["content"] == "Developer communities first."


def test_missing_file_is_an_error_and_is_not_created(cli: RunCli, tmp_path: Path) -> None:
    missing = tmp_path / "nope.db"
    for command in ("tree", "export"):
        run = cli(command, "--db", str(missing))
        assert run.code == 2
        assert "no such file" in run.err and "--db FILE" in run.err
        assert run.out == ""
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"just some text, not a database", "is not a SQLite database"),
        (b"", "is an empty file"),
    ],
)
def test_a_file_that_is_not_a_database(
    cli: RunCli, tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(content)
    run = cli("export", "--db", str(path))
    assert (run.code, run.out) == (2, "")
    assert message in run.err
    assert path.read_bytes() == content


def test_a_foreign_sqlite_database_is_left_untouched(cli: RunCli, tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE users (name TEXT)")
    conn.close()
    before = path.read_bytes()
    run = cli("tree", "--db", str(path))
    assert run.code == 2
    assert "without stello-graph data" in run.err
    assert path.read_bytes() == before


def test_a_directory_and_an_unknown_tree(cli: RunCli, demo_db: Path, tmp_path: Path) -> None:
    run = cli("tree", "--db", str(tmp_path))
    assert run.code == 2 and "is a directory" in run.err
    run = cli("tree", "--db", str(demo_db), "--tree-id", "alice")
    assert run.code == 2
    assert "no tree 'alice'" in run.err and "'default'" in run.err


def test_several_trees_in_one_file(cli: RunCli, demo_db: Path) -> None:
    with SqliteMainStorage(demo_db, tree_id="alice") as storage:
        from stello_graph.models import SessionMeta, TopologyNode

        storage.put_session(SessionMeta(id="root", label="Alice's main", role="main"))
        storage.put_node(TopologyNode(id="root", label="Alice's main"))
    run = cli("tree", "--db", str(demo_db), "--tree-id", "alice")
    assert run.code == 0
    assert run.out.startswith("Alice's main  (root)")


def test_svg_into_a_missing_directory(cli: RunCli, demo_db: Path, tmp_path: Path) -> None:
    run = cli("tree", "--db", str(demo_db), "--svg", str(tmp_path / "no" / "map.svg"))
    assert run.code == 2 and "no directory" in run.err


def test_command_line_errors_and_help(cli: RunCli) -> None:
    run = cli()
    assert run.code == 2 and "required: COMMAND" in run.err
    run = cli("tree", "--no-such-option")
    assert run.code == 2 and "unrecognized arguments" in run.err
    run = cli("--help")
    assert run.code == 0
    for command in ("demo", "chat", "tree", "export"):
        assert command in run.out
    assert cli("--version").out.strip() == f"stello-graph {__version__}"


def test_the_module_runs_as_a_program(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["stello-graph", "--version"])
    with pytest.raises(SystemExit) as done:
        runpy.run_module("stello_graph.cli", run_name="__main__")
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"stello-graph {__version__}"


def test_version_starts_without_langchain() -> None:
    """`--version` (one fresh process) imports neither LangChain nor LangGraph."""
    import json
    import subprocess

    code = (
        "import json, sys\n"
        "from stello_graph.cli import main\n"
        "try:\n"
        "    main(['--version'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = ('langchain_core', 'langgraph', 'pydantic')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    version, loaded = done.stdout.strip().splitlines()
    assert version == f"stello-graph {__version__}"
    assert json.loads(loaded) == []


@pytest.mark.parametrize(
    ("argv", "heavy"),
    [
        (["tree"], ("langchain_core", "langgraph", "sqlite_utils", "pydantic")),
        (["tree", "--svg", "-"], ("langchain_core", "langgraph", "sqlite_utils")),
        (["export"], ("langchain_core", "langgraph", "sqlite_utils", "pydantic")),
    ],
    ids=["tree", "tree-svg", "export"],
)
def test_reading_a_tree_starts_without_langchain(
    demo_db: Path, argv: list[str], heavy: tuple[str, ...]
) -> None:
    """`tree` and `export` (one fresh process each) read the file without LangChain or
    LangGraph: nothing they print needs a decoded record (`export --records` does decode
    them, as LangChain message dicts). Printed as text, neither builds a model, so neither
    imports pydantic either (the star map is drawn from a `Topology`, which does)."""
    import subprocess

    code = (
        "import json, sys\n"
        "from stello_graph.cli import main\n"
        "code = main(sys.argv[1:])\n"
        f"heavy = {heavy!r}\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in heavy)\n"
        "print(json.dumps([code, loaded]), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, argv[0], "--db", str(demo_db), *argv[1:]],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    code_returned, loaded = json.loads(done.stderr.strip().splitlines()[-1])
    assert code_returned == 0
    assert loaded == []
    assert "Pricing" in done.stdout


def test_a_file_locked_by_a_writer_is_reported_as_locked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "busy.db"
    SqliteMainStorage(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("PRAGMA locking_mode = EXCLUSIVE")
        holder.execute("BEGIN EXCLUSIVE")  # another process writing, as readers see it
        assert probe_database(path, timeout=0.05) == ("locked", [])
        monkeypatch.setattr(_common, "probe_database", partial(probe_database, timeout=0.05))
        with pytest.raises(CliError, match="is locked by another process"):
            check_tree(path, "default")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert probe_database(path)[0] == "stello"
