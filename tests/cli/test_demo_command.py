"""`stello-graph demo`: the walkthrough, the database it leaves, and its safety rules."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from langchain_core.messages import BaseMessage, SystemMessage

from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.cli import demo
from stello_graph.memory import DEFAULT_CONSOLIDATE_PROMPT, DEFAULT_INTEGRATE_PROMPT
from stello_graph.testing import ScriptedChatModel
from tests.cli.conftest import RunCli


def test_demo_walks_through_and_leaves_a_database(cli: RunCli, tmp_path: Path) -> None:
    db = tmp_path / "walk.db"
    run = cli("demo", "--db", str(db))
    assert run.code == 0, run.err
    steps = [line for line in run.out.splitlines() if line[:2] in ("1.", "2.", "3.", "4.", "5.")]
    assert [s[:2] for s in steps] == ["1.", "2.", "2.", "2.", "3.", "4.", "5."]
    assert f"Database: {db.resolve()}" in run.out
    assert "model: I opened three branches: Pricing, Onboarding, Growth" in run.out
    assert "insight -> Pricing: Onboarding should show the 3-project cap up front." in run.out
    assert "insight still pending: False" in run.out
    assert f"stello-graph chat --db {db} --model scripted" in run.out
    assert "5. The tree: 4 sessions" in run.out
    last = run.out.strip().splitlines()[-1]  # the walkthrough ends on its hints, in prose
    assert last.split() == [
        "stello-graph",
        "inspect",
        "--db",
        str(db),
        "(the",
        "inspector",
        "extra)",
    ]
    with SqliteMainStorage(db) as storage:
        main = storage.get_main_session()
        assert main is not None
        children = storage.get_children(main.id)
        assert [n.label for n in children] == ["Pricing", "Onboarding", "Growth"]
        assert all(storage.get_memory(n.id) for n in children)
        assert (storage.get_memory(main.id) or "").startswith("Launch plan:")
        assert storage.get_global(demo.MARK) == {"version": 1}
    svg = ET.parse(db.with_suffix(".svg")).getroot()
    assert len(svg.findall(".//{http://www.w3.org/2000/svg}line")) == 3


def test_demo_runs_again_on_its_own_database(cli: RunCli, tmp_path: Path) -> None:
    db = tmp_path / "again.db"
    assert cli("demo", "--db", str(db)).code == 0
    assert cli("demo", "--db", str(db)).code == 0
    with SqliteMainStorage(db) as storage:
        assert len(storage.get_tree()) == 4  # made afresh, not added to


def test_demo_never_overwrites_a_file_it_did_not_make(
    cli: RunCli, tmp_path: Path, demo_db: Path
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    run = cli("demo", "--db", str(notes))
    assert run.code == 2 and "was not made by the demo" in run.err
    assert notes.read_text() == "my notes"
    with SqliteMainStorage(demo_db) as storage:
        storage.put_global(demo.MARK, None)  # now just someone's stello database
    assert cli("demo", "--db", str(demo_db)).code == 2
    run = cli("demo", "--db", str(tmp_path / "missing" / "d.db"))
    assert run.code == 2 and "no directory" in run.err


def _provider_like(messages: list[BaseMessage]) -> str:
    """A model that never calls tools and does its own memory work, as a real one would."""
    system = " ".join(m.text for m in messages if isinstance(m, SystemMessage))
    if system.startswith(DEFAULT_CONSOLIDATE_PROMPT[:40]):
        return "The branch settled on one idea."
    if system.startswith(DEFAULT_INTEGRATE_PROMPT[:40]):
        return '{"synthesis": "One plan.", "insights": {"Growth": "Price drives growth."}}'
    return f"Thoughts on: {messages[-1].text}"


def test_demo_with_a_model_that_does_not_fork(cli: RunCli, tmp_path: Path) -> None:
    db = tmp_path / "real.db"
    model = ScriptedChatModel(respond=_provider_like)
    run = cli("demo", "--db", str(db), model=model)
    assert run.code == 0, run.err
    assert "the model opened 0 branch(es); the demo opens the rest" in run.out
    assert "L2   : The branch settled on one idea." in run.out
    assert "synthesis: One plan." in run.out
    assert "insight -> Growth: Price drives growth." in run.out
    assert "4. The next Growth turn carries the insight (once)" in run.out
    assert model.prompts[0][0].text == demo.SYSTEM_PROMPT


@pytest.mark.parametrize("setting", [["--model", "llama3"], ["--base-url", "http://127.0.0.1:9"]])
def test_demo_names_what_is_missing_for_a_provider(
    cli: RunCli, tmp_path: Path, setting: list[str]
) -> None:
    db = tmp_path / "p.db"
    run = cli("demo", "--db", str(db), *setting)
    if setting[0] == "--model":
        assert run.code == 2 and "needs a server" in run.err
    else:  # a URL alone does not leave the offline default
        assert run.code == 0 and "I opened three branches" in run.out
