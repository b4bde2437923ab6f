"""Isolation suite: three trees (`tree_id`s) in one database (a SQLite file, and a PostgreSQL
database when there is one), driven by hypothesis.

A `RuleBasedStateMachine` forks, runs turns (sync and async), archives, consolidates,
integrates, writes globals, moves and removes nodes in random trees, one agent per tree, all
on one file. It also forks sessions whose id is already taken *in another tree* (ids are
per tree), and tries to hang a node under a parent that exists only in another tree.

After every step:

* every public read of every tree matches a plain-Python model of that tree;
* reading another tree's ids through a tree's storage finds nothing;
* the rows of every tree the step did not address (stello tables and LangGraph checkpoint
  threads alike) are exactly what they were before the step.
"""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from langchain_core.messages import BaseMessage

from stello_graph import NodeNotFoundError, NothingToIntegrateError, StelloAgent, TopologyNode
from stello_graph._context import message_text
from stello_graph.testing import ScriptedChatModel
from tests._postgres import POSTGRES
from tests.reliability import _scenario as sc
from tests.reliability.conftest import Figures, count

pytestmark = pytest.mark.reliability

TREES = ("alice", "bob", "carol")
EXAMPLES = count("isolation_examples", ci=50, full=300)
STEPS = count("isolation_steps", ci=40, full=60)
POSTGRES_EXAMPLES = count("isolation_examples_postgres", ci=15, full=100)
STATS: dict[str, int] = {}


def reply(messages: list[BaseMessage]) -> str:
    return f"re:{sc.turn_part(messages)[0]}"


@dataclass
class SessionModel:
    label: str
    parent: str | None
    role: str = "standard"
    status: str = "active"
    records: list[str] = field(default_factory=list)
    turns: int = 0
    covers: int = 0
    memory: str | None = None
    insight: str | None = None


@dataclass
class TreeModel:
    sessions: dict[str, SessionModel] = field(default_factory=dict)
    globals: dict[str, Any] = field(default_factory=dict)

    def active(self, *, standard: bool = False) -> list[str]:
        return [
            sid
            for sid, s in self.sessions.items()
            if s.status == "active" and (not standard or s.role == "standard")
        ]

    def subtree(self, root: str) -> set[str]:
        found, changed = {root}, True
        while changed:
            more = {sid for sid, s in self.sessions.items() if s.parent in found}
            changed = not more <= found
            found |= more
        return found


STELLO_TABLES = (
    "stello_sessions",
    "stello_records",
    "stello_nodes",
    "stello_globals",
    "stello_events",
)


def tree_rows(path: Path) -> dict[str, list[Any]]:
    """Every row of every tree: stello tables and LangGraph checkpoint threads."""
    conn = sqlite3.connect(path)
    try:
        rows: dict[str, list[Any]] = {tree: [] for tree in TREES}
        for table in STELLO_TABLES:
            for row in conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2, 3"):
                rows[row[0]].append((table, *row))
        for table in ("checkpoints", "writes"):
            exists = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
            ).fetchone()
            if exists:
                for row in conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2, 3"):
                    rows[str(row[0]).split(":")[1]].append((table, *row))
        return rows
    finally:
        conn.close()


def postgres_tree_rows(dsn: str) -> dict[str, list[Any]]:
    """`tree_rows` of a PostgreSQL database (LangGraph's `PostgresSaver` tables included)."""
    import psycopg

    rows: dict[str, list[Any]] = {tree: [] for tree in TREES}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in STELLO_TABLES:
            for row in conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2, 3"):
                rows[row[0]].append((table, *row))
        for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes"):
            found = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
            if found is None or found[0] is None:
                continue
            for row in conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2, 3"):
                thread = str(row[0])
                tree = unquote(thread.split("/")[1]) if "/" in thread else thread.split(":")[1]
                rows[tree].append((table, *row))
    return rows


def pick(items: list[str], index: int) -> str | None:
    return items[index % len(items)] if items else None


class TreesInOneFile(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="stello-isolation-"))
        self.path: Path | str = self.target()
        self.agents: dict[str, StelloAgent] = {}
        self.models: dict[str, TreeModel] = {}
        for n, tree in enumerate(TREES):
            agent = StelloAgent(
                model=ScriptedChatModel(respond=reply),
                storage=self.path,
                tree_id=tree,
                builtin_tools=(),
                consolidate_fn=sc.consolidate,
                integrate_fn=sc.Integrator(n + 1),
            )
            self.agents[tree] = agent
            model = TreeModel()
            model.sessions[agent.main_session_id] = SessionModel("Main Session", None, "main")
            self.models[tree] = model
        self.counter = 0
        self.before = self.rows()

    def target(self) -> Path | str:
        """What the agents are opened on (`storage=`)."""
        return self.dir / "trees.db"

    def rows(self) -> dict[str, list[Any]]:
        assert isinstance(self.path, Path)
        return tree_rows(self.path)

    def teardown(self) -> None:
        for agent in self.agents.values():
            agent.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- bookkeeping ----------------------------------------------------------------------
    def _step(self, tree: str, what: str) -> None:
        """Check that the step on `tree` left every other tree's rows as they were."""
        after = self.rows()
        for other in TREES:
            if other != tree:
                assert after[other] == self.before[other], f"{what} on {tree} changed {other}"
        self.before = after
        STATS["operations"] = STATS.get("operations", 0) + 1
        STATS[f"operations: {what}"] = STATS.get(f"operations: {what}", 0) + 1

    def _text(self) -> str:
        self.counter += 1
        return f"u-0-{self.counter}"

    # -- rules ----------------------------------------------------------------------------
    @rule(tree=st.sampled_from(TREES), source=st.integers(0, 99), inherit=st.booleans())
    def fork(self, tree: str, source: int, inherit: bool) -> None:
        model = self.models[tree]
        parent = pick(model.active(), source)
        assert parent is not None  # the main session is always active
        label = f"{tree}-{self._text()}"
        node = self.agents[tree].fork(parent, label, context="inherit" if inherit else "none")
        records = list(model.sessions[parent].records) if inherit else []
        model.sessions[node.id] = SessionModel(label, parent, records=records)
        self._step(tree, "fork")

    @rule(tree=st.sampled_from(TREES), other=st.sampled_from(TREES), index=st.integers(0, 99))
    def fork_with_an_id_of_another_tree(self, tree: str, other: str, index: int) -> None:
        taken = [
            sid for sid in self.models[other].sessions if sid not in self.models[tree].sessions
        ]
        sid = pick(taken, index)
        if tree == other or sid is None:
            return
        model = self.models[tree]
        main = next(s for s, m in model.sessions.items() if m.role == "main")
        self.agents[tree].fork(main, "borrowed id", id=sid)
        model.sessions[sid] = SessionModel("borrowed id", main)
        self._step(tree, "fork with an id of another tree")

    @rule(tree=st.sampled_from(TREES), index=st.integers(0, 99), use_async=st.booleans())
    def turn(self, tree: str, index: int, use_async: bool) -> None:
        model, agent = self.models[tree], self.agents[tree]
        sid = pick(model.active(), index)
        assert sid is not None
        text = self._text()
        if use_async:
            content = asyncio.run(agent.aturn(sid, text)).content
        else:
            content = agent.turn(sid, text).content
        assert content == f"re:{text}"
        session = model.sessions[sid]
        session.records += [text, content]
        session.turns += 1
        session.insight = None
        self._step(tree, "turn")

    @rule(tree=st.sampled_from(TREES), index=st.integers(0, 99))
    def archive(self, tree: str, index: int) -> None:
        sid = pick(self.models[tree].active(standard=True), index)
        if sid is None:
            return
        self.agents[tree].archive(sid)
        self.models[tree].sessions[sid].status = "archived"
        self._step(tree, "archive")

    @rule(tree=st.sampled_from(TREES), index=st.integers(0, 99))
    def consolidate(self, tree: str, index: int) -> None:
        if self._consolidate(tree, index):
            self._step(tree, "consolidate")

    def _consolidate(self, tree: str, index: int) -> bool:
        model = self.models[tree]
        talked = [sid for sid in model.active(standard=True) if model.sessions[sid].records]
        sid = pick(talked or model.active(standard=True), index)
        if sid is None:
            return False
        l2 = self.agents[tree].consolidate(sid)
        session = self.models[tree].sessions[sid]
        if session.records:
            session.covers = len(session.records)
            session.memory = l2
        assert l2 == session.memory
        return True

    @rule(tree=st.sampled_from(TREES), index=st.integers(0, 99))
    def integrate(self, tree: str, index: int) -> None:
        """Consolidate a session (so there is usually something to read), then integrate."""
        self._consolidate(tree, index)
        model = self.models[tree]
        inputs = {
            sid for sid in model.active(standard=True) if model.sessions[sid].memory is not None
        }
        try:
            result = self.agents[tree].integrate()
        except NothingToIntegrateError:
            assert not inputs
            return
        assert set(result.insights) <= inputs
        main = next(s for s, m in model.sessions.items() if m.role == "main")
        model.sessions[main].memory = result.synthesis
        for sid, insight in result.insights.items():
            model.sessions[sid].insight = insight
        self._step(tree, "integrate")

    @rule(
        tree=st.sampled_from(TREES),
        key=st.sampled_from(["k1", "k2", "shared"]),
        value=st.integers(),
    )
    def put_global(self, tree: str, key: str, value: int) -> None:
        self.agents[tree].storage.put_global(key, {"tree": tree, "value": value})
        self.models[tree].globals[key] = {"tree": tree, "value": value}
        self._step(tree, "put_global")

    @rule(tree=st.sampled_from(TREES), index=st.integers(0, 99), under=st.integers(0, 99))
    def move(self, tree: str, index: int, under: int) -> None:
        model = self.models[tree]
        standard = [sid for sid, s in model.sessions.items() if s.role == "standard"]
        sid = pick(standard, index)
        if sid is None:
            return
        parents = [p for p in model.sessions if p not in model.subtree(sid)]
        parent = pick(parents, under)
        assert parent is not None
        label = model.sessions[sid].label
        self.agents[tree].storage.put_node(TopologyNode(id=sid, parent_id=parent, label=label))
        model.sessions[sid].parent = parent
        self._step(tree, "move")

    @rule(tree=st.sampled_from(TREES), other=st.sampled_from(TREES), index=st.integers(0, 99))
    def move_under_a_node_of_another_tree(self, tree: str, other: str, index: int) -> None:
        foreign = [s for s in self.models[other].sessions if s not in self.models[tree].sessions]
        parent = pick(foreign, index)
        sid = pick([s for s, m in self.models[tree].sessions.items() if m.role == "standard"], 0)
        if tree == other or parent is None or sid is None:
            return
        node = TopologyNode(id=sid, parent_id=parent, label=self.models[tree].sessions[sid].label)
        with pytest.raises(NodeNotFoundError):
            self.agents[tree].storage.put_node(node)
        self._step(tree, "move under another tree's node")

    @rule(tree=st.sampled_from(TREES), index=st.integers(0, 99))
    def remove_subtree(self, tree: str, index: int) -> None:
        model = self.models[tree]
        sid = pick([s for s, m in model.sessions.items() if m.role == "standard"], index)
        if sid is None:
            return
        storage = self.agents[tree].storage
        removed = storage.remove_node(sid, cascade=True)
        assert set(removed) == model.subtree(sid)
        for gone in removed:
            del model.sessions[gone]
        # their events keep their cursors, and none of their text (labels, L2s, insights)
        events = storage.events_after(0, limit=10_000)
        assert [e.data for e in events if e.session_id in removed] == [
            {"removed": True} for e in events if e.session_id in removed
        ]
        self._step(tree, "remove subtree")

    # -- invariants -----------------------------------------------------------------------
    @invariant()
    def every_read_matches_the_model(self) -> None:
        for tree in TREES:
            self._check_tree(tree)
        STATS["invariant checks"] = STATS.get("invariant checks", 0) + 1

    @invariant()
    def other_trees_ids_are_invisible(self) -> None:
        for tree in TREES:
            s, mine = self.agents[tree].storage, self.models[tree].sessions
            for other in TREES:
                for sid in self.models[other].sessions:
                    if sid in mine:
                        continue
                    assert s.get_session(sid) is None
                    assert s.get_node(sid) is None
                    assert s.list_records(sid) == []
                    assert s.get_children(sid) == []
                    assert s.get_insight(sid) is None
            for key in ("k1", "k2", "shared"):
                assert s.get_global(key) == self.models[tree].globals.get(key)

    def _check_tree(self, tree: str) -> None:
        s, model = self.agents[tree].storage, self.models[tree]
        metas = s.list_sessions()
        expected = [(sid, m.label, m.role, m.status) for sid, m in model.sessions.items()]
        assert [(m.id, m.label, m.role, m.status) for m in metas] == expected
        nodes = {(n.id, n.parent_id, n.label) for n in s.get_tree()}
        assert nodes == {(sid, m.parent, m.label) for sid, m in model.sessions.items()}
        main = s.get_main_session()
        assert main is not None and model.sessions[main.id].role == "main"
        l2s = [c.session_id for c in s.get_all_session_l2s()]
        assert l2s == [
            sid
            for sid, m in model.sessions.items()
            if m.role == "standard" and m.status == "active" and m.memory is not None
        ]
        for sid, m in model.sessions.items():
            records = [message_text(r.content) for r in s.list_records(sid)]
            assert records == m.records, (tree, sid)
            assert s.get_turn_count(sid) == m.turns
            assert s.get_memory(sid) == m.memory
            assert s.get_insight(sid) == m.insight
            if m.role == "standard":
                assert s.get_memory_through(sid) == m.covers


def test_trees_in_one_file_never_see_or_touch_each_other(figures: Figures) -> None:
    STATS.clear()
    run_state_machine_as_test(
        TreesInOneFile,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            database=None,
        ),
    )
    figures.set("trees per file", len(TREES))
    figures.set("state machine runs", EXAMPLES)
    for key, value in sorted(STATS.items()):
        figures.set(key, value)


class TreesInOnePostgres(TreesInOneFile):
    """The same machine on a PostgreSQL database (a fresh schema per run)."""

    def target(self) -> Path | str:
        return POSTGRES.dsn_for(self.dir)

    def rows(self) -> dict[str, list[Any]]:
        assert isinstance(self.path, str)
        return postgres_tree_rows(self.path)


def test_trees_in_one_postgres_database_never_see_or_touch_each_other(
    figures: Figures, postgres_dsn: str
) -> None:
    STATS.clear()
    run_state_machine_as_test(
        TreesInOnePostgres,
        settings=settings(
            max_examples=POSTGRES_EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            database=None,
        ),
    )
    figures.set("trees per database", len(TREES))
    figures.set("state machine runs", POSTGRES_EXAMPLES)
    for key, value in sorted(STATS.items()):
        figures.set(key, value)


# -- many tree ids in one server process --------------------------------------------------------
SERVER_TREES = count("server_trees", ci=12, full=120)
SERVER_TURNS = count("server_turns", ci=40, full=400)
OPEN_LIMIT = 3


@pytest.fixture(params=["sqlite", "postgres"])
def server_database(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Any:
    """The server module on a SQLite file or a PostgreSQL database, at most `OPEN_LIMIT`
    trees open; every tree closed at the end."""
    from stello_graph import server

    if request.param == "postgres" and not POSTGRES.wanted:
        pytest.skip(f"PostgreSQL {POSTGRES.describe()}")
    uri = POSTGRES.dsn_for(tmp_path) if request.param == "postgres" else str(tmp_path / "s.db")
    monkeypatch.setenv(server.MODEL_ENV, "scripted")
    monkeypatch.setenv(server.DATABASE_ENV, uri)
    monkeypatch.setenv(server.MAX_OPEN_TREES_ENV, str(OPEN_LIMIT))
    server.close_trees()
    yield uri
    server.close_trees()


def test_a_server_process_keeps_few_trees_open_and_loses_nothing(
    server_database: str, figures: Figures, seed: int
) -> None:
    """Turns on many tree ids in random order through the server's graph factory: never more
    than `STELLO_MAX_OPEN_TREES` trees open, the process's open files bounded, and every
    tree, closed and reopened any number of times, holds exactly its own turns."""
    import os
    import random

    from langgraph.checkpoint.memory import InMemorySaver

    from stello_graph import server
    from stello_graph.agent import _open_storage

    rng = random.Random(seed)
    names = [f"user-{n}" for n in range(SERVER_TREES)]
    said: dict[str, list[str]] = {name: [] for name in names}
    files: list[int] = []
    for step in range(SERVER_TURNS):
        name = names[step] if step < len(names) else rng.choice(names)
        config: Any = {"configurable": {"tree_id": name, "thread_id": f"{name}-{step}"}}
        graph = server.make_graph(config).compile(checkpointer=InMemorySaver())
        text = f"{name} says {step}"
        out = graph.invoke({"messages": [{"role": "user", "content": text}]}, config)
        assert out["content"] == f"(scripted) You said: {text}"
        said[name].append(text)
        assert len(server._trees) <= OPEN_LIMIT
        files.append(len(os.listdir("/proc/self/fd")))
    assert max(files[len(names) :] or files) <= files[OPEN_LIMIT] + 4  # not two more per tree
    server.close_trees()
    for name in names:
        storage = _open_storage(server_database, name)
        try:
            main = storage.get_main_session()
            assert main is not None
            # each run is a thread of its own, so a session of its own (a child of the main)
            sessions = [main.id, *(node.id for node in storage.get_children(main.id))]
            stored = [m.text for s in sessions for m in storage.list_records(s, role="human")]
            assert sorted(stored) == sorted(said[name])  # its own turns, once, none of another
        finally:
            storage.close()
    figures.set("trees", len(names))
    figures.set("turns", SERVER_TURNS)
    figures.set("most open files", max(files))
