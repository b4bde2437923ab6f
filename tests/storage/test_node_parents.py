"""Schema version 11 keeps on each session's row a copy of its topology node's parent
(`stello_sessions.node_parent`), written by triggers on `stello_nodes`: the digests read it
without a join. The nodes stay the tree; the copy follows every write of them."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

from stello_graph.checkpoints import SqliteMainStorage, _schema
from stello_graph.models import SessionMeta, TopologyNode
from tests.storage._old_files import file_at_version, put_old_session

_DRIFT = """SELECT s.id, s.node_parent, n.parent_id FROM stello_sessions s
    LEFT JOIN stello_nodes n ON n.tree_id = s.tree_id AND n.id = s.id
    WHERE s.node_parent IS NOT n.parent_id"""


def _parents(storage: SqliteMainStorage) -> dict[str, str | None]:
    return {digest.id: digest.parent_id for digest in storage.list_session_digests()}


def _nodes(storage: SqliteMainStorage) -> dict[str, str | None]:
    """Each session's parent as the nodes hold it (`None` without a node)."""
    found = {node.id: node.parent_id for node in storage.get_tree()}
    return {meta.id: found.get(meta.id) for meta in storage.list_sessions()}


def test_a_version_10_file_gets_its_parents_copied(tmp_path: Path) -> None:
    path = tmp_path / "v10.db"
    conn = file_at_version(path, 10)
    for tree in ("default", "other"):
        for sid in ("root", "a", "b", "loose"):
            put_old_session(conn, sid, sid, tree)
            conn.execute("UPDATE stello_sessions SET l3_key = rowid WHERE l3_key IS NULL")
    tree_of = {"default": [("root", None), ("a", "root"), ("b", "a")],
               "other": [("root", None), ("b", "root"), ("a", "b")]}  # fmt: skip
    for tree, nodes in tree_of.items():
        for position, (sid, parent) in enumerate(nodes, 1):
            row = (tree, sid, parent, sid, position)
            conn.execute("INSERT INTO stello_nodes VALUES (?, ?, ?, ?, ?)", row)
    conn.close()
    with SqliteMainStorage(path) as storage:
        assert _schema.read_version(storage._conn) == _schema.SCHEMA_VERSION == 11
        assert _parents(storage) == {"root": None, "a": "root", "b": "a", "loose": None}
    with SqliteMainStorage(path, tree_id="other") as other:  # the same ids in another tree
        assert _parents(other) == {"root": None, "b": "root", "a": "b", "loose": None}
        assert other._conn.execute(_DRIFT).fetchall() == []


def test_the_copy_follows_inserts_moves_and_removals(tmp_path: Path) -> None:
    with SqliteMainStorage(tmp_path / "t.db") as storage:
        for sid in ("root", "a", "b", "c", "loose"):
            storage.put_session(SessionMeta(id=sid, label=sid))
        storage.put_node(TopologyNode(id="root", parent_id=None, label="root"))
        for sid in ("a", "b", "c"):
            storage.put_node(TopologyNode(id=sid, parent_id="root", label=sid))
        assert _parents(storage) == {"root": None, "a": "root", "b": "root", "c": "root",
                                     "loose": None}  # fmt: skip
        storage.put_node(TopologyNode(id="c", parent_id="a", label="c"))  # moved
        storage.put_node(TopologyNode(id="b", parent_id="root", label="B"))  # relabelled only
        storage.put_session(SessionMeta(id="c", label="C"))  # a meta write keeps it
        assert _parents(storage)["c"] == "a" and _parents(storage)["b"] == "root"
        assert storage.remove_node("a", cascade=True) == ["a", "c"]
        assert _parents(storage) == {"root": None, "b": "root", "loose": None}
        # A node deleted under its session (foreign keys off, as in the sqlite3 shell)
        with sqlite3.connect(tmp_path / "t.db") as raw:
            raw.execute("DELETE FROM stello_nodes WHERE id = 'b'")
        assert _parents(storage)["b"] is None


def test_after_any_run_of_tree_writes_the_digests_parents_are_the_nodes(tmp_path: Path) -> None:
    rng = random.Random(11)
    with SqliteMainStorage(tmp_path / "t.db") as storage:
        storage.put_session(SessionMeta(id="s0", label="s0"))
        storage.put_node(TopologyNode(id="s0", parent_id=None, label="s0"))
        made = 1
        for _ in range(300):
            nodes = [node.id for node in storage.get_tree()]
            step = rng.random()
            if step < 0.5 or len(nodes) < 3:  # a new session under any node
                sid = f"s{made}"
                made += 1
                storage.put_session(SessionMeta(id=sid, label=sid))
                storage.put_node(TopologyNode(id=sid, parent_id=rng.choice(nodes), label=sid))
            elif step < 0.8:  # a move under a node outside its own subtree
                sid = rng.choice(nodes[1:])
                below = {sid, *(n.id for n in storage.get_tree() if sid in _up(storage, n.id))}
                parent = rng.choice([n for n in nodes if n not in below])
                storage.put_node(TopologyNode(id=sid, parent_id=parent, label=sid))
            else:
                storage.remove_node(rng.choice(nodes[1:]), cascade=True)
            assert _parents(storage) == _nodes(storage)
        assert storage._conn.execute(_DRIFT).fetchall() == []


def _up(storage: SqliteMainStorage, node_id: str) -> list[str]:
    return [node.id for node in storage.get_ancestors(node_id)]
