"""A damaged row never makes the rest of the tree unreadable.

The damage is done the way it happens to real files: a raw statement outside stello writes a
text that is not UTF-8, a JSON column that is not JSON, an unknown role or status, a record
that does not decode, or a node parent that makes a cycle. Every whole-tree read (`tree()`,
`digests()`, the export, the inspector's tree, `list_sessions`, `get_tree`) then shows every
session, the damaged one as a placeholder marked `damaged`; a read of the damaged session
itself raises `DamagedDataError` (a `StorageError`) naming the session and the column.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from stello_graph import StelloAgent
from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.errors import DamagedDataError, InvalidInputError, StorageError
from stello_graph.export import export_tree, write_export
from stello_graph.inspector._views import tree_nodes, tree_view
from stello_graph.models import SessionMeta, TopologyNode
from stello_graph.testing import ScriptedChatModel
from tests._postgres import POSTGRES


@dataclass
class Tree:
    database: Path | str
    main: str
    child: str  # the session the damage is done to
    grandchild: str
    sibling: str

    @property
    def postgres(self) -> bool:
        return isinstance(self.database, str)

    def execute(self, sql: str, *params: Any) -> None:
        """A raw statement on the database, outside stello."""
        if self.postgres:
            import psycopg

            with psycopg.connect(str(self.database), autocommit=True) as server:
                server.execute(sql.replace("?", "%s"), params)
            return
        with sqlite3.connect(self.database) as conn:
            conn.execute(sql, params)
        conn.close()

    def agent(self) -> StelloAgent:
        return StelloAgent(model=ScriptedChatModel(default="ok"), storage=self.database)


@pytest.fixture(params=["sqlite", *(["postgres"] if POSTGRES.wanted else [])])
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> Tree:
    database = POSTGRES.dsn_for(tmp_path) if request.param == "postgres" else tmp_path / "t.db"
    return make_tree(database)


def make_tree(database: Path | str) -> Tree:
    """main -> (child -> grandchild, sibling); the child has tags, metadata and a turn."""
    with StelloAgent(model=ScriptedChatModel(default="ok"), storage=database) as agent:
        main = agent.main_session_id
        child = agent.fork(main, "child-label").id
        agent.storage.put_session(
            agent.storage.get_session(child).model_copy(  # type: ignore[union-attr]
                update={"tags": ("t",), "metadata": {"k": 1}}
            )
        )
        agent.turn(child, "hello")
        grandchild = agent.fork(child, "grandchild-label").id
        sibling = agent.fork(main, "sibling-label").id
        agent.turn(sibling, "hi")
    return Tree(database, main, child, grandchild, sibling)


def _set(column: str, value: str) -> Callable[[Tree], None]:
    def damage(t: Tree) -> None:
        t.execute(f"UPDATE stello_sessions SET {column} = {value} WHERE id = ?", t.child)

    return damage


def _not_utf8(t: Tree) -> None:
    if t.postgres:
        pytest.skip("PostgreSQL refuses text that is not UTF-8 in a UTF-8 database")
    for table in ("stello_sessions", "stello_nodes"):
        t.execute(f"UPDATE {table} SET label = CAST(X'FF41' AS TEXT) WHERE id = ?", t.child)


def _record(t: Tree) -> None:
    if t.postgres:
        sql = "UPDATE stello_records SET data = '{bad' WHERE session_id = ? AND seq = 0"
    else:
        sql = """UPDATE stello_record_rows SET data = '{bad' WHERE seq = 0
            AND l3_key = (SELECT l3_key FROM stello_sessions WHERE id = ?)"""
    t.execute(sql, t.child)


def _cycle(t: Tree) -> None:
    t.execute("UPDATE stello_nodes SET parent_id = ? WHERE id = ?", t.grandchild, t.child)


DAMAGES: dict[str, tuple[Callable[[Tree], None], str]] = {
    "label not UTF-8": (_not_utf8, "label"),
    "tags not JSON": (_set("tags", "'[bad'"), "tags"),
    "metadata not JSON": (_set("metadata", "'{bad'"), "metadata"),
    "unknown role": (_set("role", "'boss'"), "role"),
    "unknown status": (_set("status", "'lost'"), "status"),
    "record not JSON": (_record, "records"),
    "parent cycle": (_cycle, "parent_id"),
}
"""Each damage, and the column a whole-tree read marks."""
_META_COLUMNS = ("label", "tags", "metadata", "role", "status")
LABELS = ("child-label", "grandchild-label", "sibling-label")


@pytest.fixture(params=list(DAMAGES))
def damaged(request: pytest.FixtureRequest, tree: Tree) -> tuple[Tree, str]:
    damage, column = DAMAGES[request.param]
    damage(tree)
    return tree, column


def test_whole_tree_reads_show_every_session_and_mark_the_damaged_one(
    damaged: tuple[Tree, str],
) -> None:
    t, column = damaged
    ids = {t.main, t.child, t.grandchild, t.sibling}
    with t.agent() as agent:
        tree = agent.tree()
        assert {node.id for node in tree.nodes} == ids
        assert set(tree.sessions) == ids and len(tree) == 4
        text = tree.render_text()
        for label in LABELS[1:]:
            assert label in text
        entries = {e["id"]: e for e in tree.to_dict()["nodes"]}
        assert set(entries) == ids
        if column in (*_META_COLUMNS, "parent_id"):
            assert column in tree.damaged[t.child]
            assert column in entries[t.child]["damaged"]
            assert set(tree.damaged) == {t.child}
        if column == "parent_id":
            assert "[detached: its parents make a cycle]" in text
            assert tree.node(t.child).parent_id is None  # type: ignore[union-attr]
            assert tree.depth(t.grandchild) == 1
        elif column in _META_COLUMNS:
            assert f"[damaged: {column}]" in text
            assert tree.sessions[t.child].damaged == (column,)
        if column == "label":
            assert tree.node(t.child).label == "(undecodable)"  # type: ignore[union-attr]
            assert tree.sessions[t.child].label == "(undecodable)"
        else:
            assert "child-label" in text

        digests = {d.id: d for d in agent.digests()}
        assert set(digests) == ids
        if column in ("label", "role", "status"):
            assert digests[t.child].damaged == (column,)
        assert all(not d.damaged for sid, d in digests.items() if sid != t.child)

        metas = {m.id: m for m in agent.storage.list_sessions()}
        assert set(metas) == ids
        if column in _META_COLUMNS:
            assert metas[t.child].damaged == (column,)
        nodes = {n.id: n for n in agent.storage.get_tree()}
        assert set(nodes) == ids
        if column in ("label", "parent_id"):
            assert nodes[t.child].damaged == (column,)

        data = export_tree(agent.storage, records=True)
        assert {n["id"] for n in data["nodes"]} == {s["id"] for s in data["sessions"]} == ids
        sessions = {s["id"]: s for s in data["sessions"]}
        if column in (*_META_COLUMNS, "records"):
            assert column in sessions[t.child]["damaged"]
        if column == "records":
            assert sessions[t.child]["records"][0] == {"undecodable": "{bad"}
        if column == "parent_id":
            assert {n["id"] for n in data["nodes"] if n.get("detached")} == {
                t.child,
                t.grandchild,
            }
        assert [sid for sid, s in sessions.items() if "damaged" in s] == (
            [t.child] if column != "parent_id" else []
        )
        assert json.loads(json.dumps(data, ensure_ascii=False)) == data  # what can be shown

        view = {n["id"]: n for n in tree_nodes(tree_view(agent.storage, compact=True))}
        assert set(view) == ids
        if column in ("label", "role", "status", "parent_id"):
            assert column in view[t.child]["damaged"]

        # the other sessions work as before
        assert agent.turn(t.sibling, "still here").content == "ok"


@pytest.mark.parametrize("damage", [name for name in DAMAGES if name != "parent cycle"])
def test_a_read_of_the_damaged_session_raises_naming_it_and_the_column(
    tree: Tree, damage: str
) -> None:
    make, column = DAMAGES[damage]
    make(tree)
    t = tree
    with t.agent() as agent:
        read: Callable[[], object] = (
            partial(agent.storage.list_records, t.child)
            if column == "records"
            else partial(agent.session, t.child)
        )
        with pytest.raises(DamagedDataError) as caught:
            read()
        message = str(caught.value)
        assert isinstance(caught.value, StorageError) and caught.value.__cause__ is not None
        assert t.child in message
        assert f"column '{'data of its record 1' if column == 'records' else column}'" in message
        again: Callable[[], object] = (
            partial(agent.turn, t.child, "again")
            if column == "records"
            else partial(agent.storage.get_session, t.child)
        )
        with pytest.raises(DamagedDataError):
            again()
        assert agent.session(t.sibling).meta.label == "sibling-label"


@pytest.mark.parametrize("damage", ["label not UTF-8", "parent cycle"])
def test_a_placeholder_is_not_written_back(tree: Tree, damage: str) -> None:
    make, _ = DAMAGES[damage]
    make(tree)
    t = tree
    with t.agent() as agent:
        storage = agent.storage
        meta = {m.id: m for m in storage.list_sessions()}[t.child]
        node = {n.id: n for n in storage.get_tree()}[t.child]
        stand_in = meta if meta.damaged else node
        put = storage.put_session if isinstance(stand_in, SessionMeta) else storage.put_node
        with pytest.raises(InvalidInputError, match="placeholder for a damaged row"):
            put(stand_in)  # type: ignore[arg-type]
        # what mends it: the values to keep, written again
        if isinstance(stand_in, SessionMeta):
            storage.put_session(stand_in.model_copy(update={"label": "mended", "damaged": ()}))
            storage.put_node(TopologyNode(id=t.child, parent_id=t.main, label="mended"))
        else:
            storage.put_node(TopologyNode(id=t.child, parent_id=t.main, label="child-label"))
        assert not agent.tree().damaged
        assert agent.session(t.child).meta.label in ("mended", "child-label")


def test_the_export_streams_what_it_can(damaged: tuple[Tree, str], tmp_path: Path) -> None:
    t, column = damaged
    out = tmp_path / "export.json"
    with t.agent() as agent, out.open("w", encoding="utf-8") as stream:
        marked = write_export(agent.storage, stream, records=True)
    data = json.loads(out.read_text(encoding="utf-8"))
    assert len(data["sessions"]) == 4
    if column == "parent_id":  # every node no root reaches
        assert marked == {t.child: ("parent_id",), t.grandchild: ("parent_id",)}
    else:
        assert marked == {t.child: (column,)}


def test_removing_a_node_of_a_cycle_ends(tree: Tree) -> None:
    _cycle(tree)
    with tree.agent() as agent:
        assert set(agent.storage.remove_node(tree.child, cascade=True)) == {
            tree.child,
            tree.grandchild,
        }
        assert {node.id for node in agent.tree().nodes} == {tree.main, tree.sibling}


def test_texts_that_are_not_utf8_in_every_whole_tree_read(tmp_path: Path) -> None:
    """A text column that is not UTF-8 beyond the label: an L2, an insight, a system prompt,
    the id of a node's parent. Whole-tree reads still read the tree."""
    db = tmp_path / "t.db"
    with SqliteMainStorage(db) as storage:
        storage.put_session(SessionMeta(id="main", label="M", role="main"))
        storage.put_node(TopologyNode(id="main", label="M"))
        for sid in ("a", "b"):
            storage.put_session(SessionMeta(id=sid, label=sid))
            storage.put_node(TopologyNode(id=sid, parent_id="main", label=sid))
            storage.append_records(sid, [HumanMessage("hi")], user_turn=True)
            storage.put_memory(sid, "l2", through=1)
            storage.put_insight(sid, "insight")
    with sqlite3.connect(db) as conn:
        for column in ("memory", "insight", "system_prompt"):
            conn.execute(
                f"UPDATE stello_sessions SET {column} = CAST(X'C328' AS TEXT) WHERE id = 'a'"
            )
    conn.close()
    with SqliteMainStorage(db) as storage:
        l2s = {c.session_id: c.l2 for c in storage.get_all_session_l2s()}
        assert l2s == {"a": "(undecodable)", "b": "l2"}
        digests = {d.id: d for d in storage.list_session_digests()}
        assert (digests["a"].l2, digests["a"].insight) == ("(undecodable)", "(undecodable)")
        assert digests["a"].damaged == ("memory", "insight")
        entry = next(s for s in export_tree(storage)["sessions"] if s["id"] == "a")
        assert entry["damaged"] == ["system_prompt", "memory", "insight"]
        with pytest.raises(DamagedDataError, match="column 'memory'"):
            storage.get_memory("a")
        assert storage.get_memory("b") == "l2"


@pytest.mark.parametrize("payload", ["'{bad'", "CAST(X'7B22FF' AS TEXT)"])
def test_a_damaged_event_does_not_stop_a_follower(tree: Tree, payload: str) -> None:
    if tree.postgres and "X'" in payload:
        pytest.skip("PostgreSQL refuses text that is not UTF-8 in a UTF-8 database")
    tree.execute(
        f"UPDATE stello_events SET payload = {payload} WHERE session_id = ? "
        "AND kind = 'session_forked'",
        tree.child,
    )
    with tree.agent() as agent:
        events = agent.follow_events().poll()
        forks = {e.session_id: e.data for e in events if e.type == "session_forked"}
        assert set(forks) == {tree.child, tree.grandchild, tree.sibling}
        assert set(forks[tree.child]) == {"undecodable"}
        assert forks[tree.sibling]["label"] == "sibling-label"
