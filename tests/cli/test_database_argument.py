"""Every command takes the same database argument: `--db` a SQLite file or a `postgresql://`
DSN, `--tree ID` (alias `--tree-id`) the tree of it. On PostgreSQL, `demo`, `chat`, `tree`
and `export` work as on a file; a database that cannot be read is refused as a file is (exit 2,
the DSN shown without its password)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.models import SessionMeta, TopologyNode
from tests.cli.conftest import RunCli

COMMANDS = ["demo", "chat", "tree", "export", "inspect"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_names_the_same_database_options(cli: RunCli, command: str) -> None:
    run = cli(command, "--help")
    assert run.code == 0, run.err
    text = " ".join(run.out.split())
    assert "--db DB a SQLite file or a postgresql:// DSN (default: " in text
    assert "--tree ID, --tree-id ID which tree of the database (default: default)" in text


@pytest.mark.parametrize("option", ["--tree", "--tree-id"])
def test_each_command_reads_the_tree_named_by_either_option(
    cli: RunCli, demo_db: Path, option: str
) -> None:
    with SqliteMainStorage(demo_db, tree_id="alice") as storage:
        storage.put_session(SessionMeta(id="root", label="Alice's main", role="main"))
        storage.put_node(TopologyNode(id="root", label="Alice's main"))
    tree = cli("tree", "--db", str(demo_db), option, "alice")
    assert tree.code == 0, tree.err
    assert tree.out.startswith("Alice's main  (root)")
    export = cli("export", "--db", str(demo_db), option, "alice")
    assert export.code == 0, export.err
    assert [s["label"] for s in json.loads(export.out)["sessions"]] == ["Alice's main"]
    chat = cli("chat", "--db", str(demo_db), option, "bob", "--model", "scripted", "--manual",
               input="hello bob\n")  # fmt: skip
    assert chat.code == 0, chat.err
    assert "(tree 'bob')" in chat.out
    with SqliteMainStorage(demo_db, tree_id="bob") as storage:
        main = storage.get_main_session()
        assert main is not None and storage.get_turn_count(main.id) == 1


@pytest.mark.parametrize("command", ["tree", "export", "inspect"])
def test_an_unknown_tree_is_named_with_the_option_to_use(
    cli: RunCli, demo_db: Path, command: str
) -> None:
    extra = ["--no-browser"] if command == "inspect" else []
    run = cli(command, "--db", str(demo_db), "--tree", "nobody", *extra)
    assert run.code == 2
    assert "has no tree 'nobody' (trees: 'default'); name one with --tree ID." in run.err
    assert "--tree-id" not in run.err


@pytest.mark.parametrize("command", ["chat", "tree", "export"])
def test_an_unreachable_postgresql_is_refused_without_its_password(
    cli: RunCli, command: str
) -> None:
    extra = ["--model", "scripted"] if command == "chat" else []
    run = cli(command, "--db", "postgresql://ada:s3cret@127.0.0.1:1/app", *extra, input="hi\n")
    assert run.code == 2, run.err
    assert "Cannot connect to PostgreSQL at 'postgresql://ada@127.0.0.1:1/app'" in run.err
    assert "s3cret" not in run.err and "no such file" not in run.err
    assert "Traceback" not in run.err


def test_without_the_postgres_extra_the_commands_say_how_to_install_it(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "sys.modules['psycopg'] = None\n"  # as if the extra were not installed
        "from stello_graph.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    for argv in (["tree"], ["export"], ["chat", "--model", "scripted"]):
        done = subprocess.run(
            [sys.executable, "-c", code, *argv, "--db", "postgresql://ada@127.0.0.1:1/app"],
            capture_output=True, text=True, timeout=60, cwd=tmp_path, input="",
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert 'needs its extra: pip install "stello-graph[postgres]"' in done.stderr
        assert "(psycopg is missing)" in done.stderr
    assert list(tmp_path.iterdir()) == []


# -- on PostgreSQL --------------------------------------------------------------------------
def _demo(cli: RunCli, dsn: str, *options: str) -> None:
    run = cli("demo", "--db", dsn, *options)
    assert run.code == 0, run.err
    assert "Database: postgresql://stello@127.0.0.1:" in run.out
    assert "I opened three branches: Pricing, Onboarding, Growth" in run.out


def test_demo_tree_export_and_chat_on_postgresql(
    cli: RunCli, postgres_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the demo's star map goes to the current directory
    _demo(cli, postgres_dsn)
    assert (tmp_path / "stello-demo.svg").exists()
    again = cli("demo", "--db", postgres_dsn)  # never deletes: fills an empty tree only
    assert again.code == 2
    assert "Tree 'default' of postgresql://stello@127.0.0.1:" in again.err
    assert "name another with --tree ID" in again.err
    tree = cli("tree", "--db", postgres_dsn)
    assert tree.code == 0, tree.err
    assert [line.split()[-2] for line in tree.out.splitlines()[1:4]] == [
        "Pricing",
        "Onboarding",
        "Growth",
    ]
    assert tree.out.splitlines()[-1] == "4 session(s), 0 archived, 5 turn(s)"
    drawn = cli("tree", "--db", postgres_dsn, "--svg", str(tmp_path / "map.svg"))
    assert drawn.code == 0 and (tmp_path / "map.svg").read_text().startswith("<svg")
    chat = cli("chat", "--db", postgres_dsn, "--model", "scripted", "--manual",
               input="/switch Growth\nand then?\n")  # fmt: skip
    assert chat.code == 0, chat.err
    assert "Growth › (scripted) You said: and then?" in chat.out
    export = cli("export", "--db", postgres_dsn, "--records")
    assert export.code == 0, export.err
    sessions = {s["label"]: s for s in json.loads(export.out)["sessions"]}
    assert list(sessions) == ["Main Session", "Pricing", "Onboarding", "Growth"]
    assert sessions["Growth"]["records"][-1]["data"]["content"] == (
        "(scripted) You said: and then?"
    )


def test_a_key_value_connection_string_is_postgresql_too(
    cli: RunCli, postgres_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """libpq's `host=... dbname=...` form names the same database as its URL, not a file."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    monkeypatch.chdir(tmp_path)  # the demo's star map goes to the current directory
    _demo(cli, make_conninfo("", **conninfo_to_dict(postgres_dsn)))
    tree = cli("tree", "--db", postgres_dsn)
    assert tree.code == 0, tree.err
    assert tree.out.splitlines()[-1] == "4 session(s), 0 archived, 5 turn(s)"
    assert [p.name for p in tmp_path.iterdir()] == ["stello-demo.svg"]  # no SQLite file


def test_an_unknown_tree_on_postgresql(cli: RunCli, postgres_dsn: str) -> None:
    _demo(cli, postgres_dsn, "--tree", "alice")
    for command in ("tree", "export"):
        run = cli(command, "--db", postgres_dsn, "--tree-id", "bob")
        assert run.code == 2
        assert "'postgresql://stello@127.0.0.1:" in run.err
        assert "has no tree 'bob' (trees: 'alice'); name one with --tree ID." in run.err
    assert cli("tree", "--db", postgres_dsn, "--tree", "alice").code == 0


def test_a_postgresql_database_without_stello_data_is_refused_and_left_alone(
    cli: RunCli, postgres_dsn: str
) -> None:
    import psycopg

    for command in ("tree", "export"):
        run = cli(command, "--db", postgres_dsn)
        assert run.code == 2
        assert "is a PostgreSQL database without stello-graph data." in run.err
    tables = "SELECT table_name FROM information_schema.tables WHERE table_schema = %s"
    with psycopg.connect(postgres_dsn) as conn:
        schema = conn.execute("SELECT current_schema()").fetchone()
        made = conn.execute(tables, schema).fetchall()
    assert made == []  # no table added by a command that only reads


def test_damaged_rows_on_postgresql_are_shown_marked(cli: RunCli, postgres_dsn: str) -> None:
    import psycopg

    _demo(cli, postgres_dsn)
    with psycopg.connect(postgres_dsn) as conn:
        ids: dict[str, str] = dict(conn.execute("SELECT label, id FROM stello_sessions"))
        conn.execute("UPDATE stello_sessions SET tags = '[oops' WHERE id = %s",
                     (ids["Onboarding"],))  # fmt: skip
        conn.execute("UPDATE stello_nodes SET parent_id = id WHERE id = %s", (ids["Growth"],))
    tree = cli("tree", "--db", postgres_dsn)
    assert tree.code == 0, tree.err
    lines = {line.split("(")[-1].split(")")[0]: line for line in tree.out.splitlines()}
    assert set(ids.values()) <= set(lines)
    assert lines[ids["Onboarding"]].endswith("[damaged: tags]")
    assert "[detached: its parents make a cycle]" in lines[ids["Growth"]]
    assert "warning: 2 session(s) of this tree are damaged" in tree.err
    export = cli("export", "--db", postgres_dsn)
    assert export.code == 0, export.err
    data = json.loads(export.out)
    assert {s["id"]: s.get("damaged") for s in data["sessions"]}[ids["Onboarding"]] == ["tags"]
    assert {n["id"]: n.get("detached") for n in data["nodes"]}[ids["Growth"]] is True
