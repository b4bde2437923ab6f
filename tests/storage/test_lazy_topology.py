"""`Topology.read` on a stello storage: one snapshot of JSON text, models built on access.

Every backend's read must give what the per-part reads give (`get_tree`, `list_sessions`,
`list_lineage`, the turn counts), the views must answer without building every model, and
what was read must not move with later writes.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from stello_graph.models import SessionMeta, TopologyNode
from stello_graph.storage import MainStorage
from stello_graph.topology import Topology

_ODD = 'Quotes " \\ and\nnew line, tab\t, accents é, emoji 🌳, a NUL \x00 end'


def _fill(storage: MainStorage) -> None:
    """A tree with what a read must keep: moved nodes (tree order is not creation order),
    an archived session, fork lineage, tags and metadata, a session outside the tree, an
    odd label and turns."""
    at = datetime(2026, 3, 4, 5, 6, 7, 891011, tzinfo=UTC)
    with storage.transaction():
        storage.put_session(SessionMeta(id="m", label="Main", role="main", created_at=at))
        storage.put_node(TopologyNode(id="m", label="Main"))
        for sid, parent in [("a", "m"), ("b", "m"), ("c", "a"), ("d", "b"), ("e", "m")]:
            storage.put_session(SessionMeta(id=sid, label=f"L{sid}", tags=("t", sid)))
            storage.put_node(TopologyNode(id=sid, parent_id=parent, label=f"N{sid}"))
        storage.put_session(
            SessionMeta(id="odd", label=_ODD, metadata={"k": [1, {"x": None}]}, status="archived")
        )
        storage.put_node(TopologyNode(id="odd", parent_id="c", label=_ODD))
        storage.put_session(SessionMeta(id="loose", label="outside the tree"))
        storage.put_lineage("d", "a", 1)
        storage.put_lineage("loose", "b", None)
        for sid in ("zz", "aa"):  # made in the other order of their ids
            storage.put_session(SessionMeta(id=sid, label=sid))
            storage.put_node(TopologyNode(id=sid, parent_id="e", label=sid))
            storage.put_lineage(sid, "e", None)
        storage.append_records("a", [HumanMessage("q"), AIMessage("r")], user_turn=True)
        storage.append_records("a", [HumanMessage("q2"), AIMessage("r2")], user_turn=True)
        storage.append_records("d", [HumanMessage("q")], user_turn=True)
    # `b` (with its subtree) moves under `e`, made after it
    storage.put_node(TopologyNode(id="b", parent_id="e", label="Nb"))
    # archived after `aa` was made: on PostgreSQL its row moves to the end of the table
    zz = storage.get_session("zz")
    assert zz is not None
    storage.put_session(zz.model_copy(update={"status": "archived"}))


def _native(storage: MainStorage) -> bool:
    """Whether the storage reads the tree as text (SQLite, in memory too, and PostgreSQL)."""
    names = ("SqliteMainStorage", "InMemoryMainStorage", "PostgresMainStorage")
    return type(storage).__name__ in names


def _reference(storage: MainStorage) -> Topology:
    """The tree from the per-part reads, every model given."""
    nodes = storage.get_tree()
    metas = {meta.id: meta for meta in storage.list_sessions()}
    sessions = {node.id: metas[node.id] for node in nodes if node.id in metas}
    turns = {sid: storage.get_turn_count(sid) for sid in sessions}
    return Topology(nodes, sessions, turns, storage.list_lineage())


def test_a_read_tree_is_what_the_per_part_reads_give(main_storage: MainStorage) -> None:
    _fill(main_storage)
    tree, reference = Topology.read(main_storage), _reference(main_storage)
    assert [n.id for n in tree.nodes] == ["m", "a", "c", "odd", "e", "b", "d", "zz", "aa"]
    assert tree == reference
    assert tree.nodes == reference.nodes
    assert dict(tree.sessions) == dict(reference.sessions)
    assert list(tree.sessions) == [n.id for n in tree.nodes]
    assert tree.sessions["odd"].label == _ODD and tree.node("odd") == reference.node("odd")
    assert tree.sessions["odd"].metadata == {"k": [1, {"x": None}]}
    assert tree.sessions["a"].tags == ("t", "a")
    assert tree.sessions["m"].created_at == datetime(2026, 3, 4, 5, 6, 7, 891011, tzinfo=UTC)
    assert dict(tree.turns) == {"m": 0, "a": 2, "b": 0, "c": 0, "d": 1, "e": 0, "odd": 0} | {
        "zz": 0,
        "aa": 0,
    }
    assert list(tree.lineage.items()) == list(reference.lineage.items())  # in creation order
    assert list(tree.lineage) == ["d", "loose", "zz", "aa"]  # every session's, as before
    assert "loose" not in tree.sessions and len(tree.sessions) == 9
    assert tree.render_text() == reference.render_text()
    assert tree.to_dict() == reference.to_dict()
    assert repr(tree) == repr(reference) == "<Topology: 9 sessions, 2 archived, root 'Main'>"


async def test_the_async_read_is_the_same_tree(main_storage: MainStorage) -> None:
    _fill(main_storage)
    assert await Topology.aread(main_storage) == Topology.read(main_storage)


def test_views_answer_without_building_every_model(main_storage: MainStorage) -> None:
    _fill(main_storage)
    tree, reference = Topology.read(main_storage), _reference(main_storage)
    assert len(tree) == 9 and repr(tree) == repr(reference)
    assert tree.root == reference.root
    assert tree.children("m") == reference.children("m")
    assert tree.children("nobody") == [] and tree.node("nobody") is None
    assert [tree.depth(sid) for sid in "mabcde"] == [reference.depth(sid) for sid in "mabcde"]
    assert tree.render_text() == reference.render_text()
    assert tree.to_dict() == reference.to_dict()
    assert tree.sessions.get("a") == reference.sessions["a"] and "nobody" not in tree.sessions
    with pytest.raises(KeyError):
        tree.sessions["loose"]
    if _native(main_storage):
        assert "nodes" not in vars(tree)  # no view above needed every node's model
        assert len(vars(tree)["sessions"]._built) == 1  # the one session looked up
    assert tree.nodes == reference.nodes and tree.node("a") is tree.nodes[1]


def test_what_was_read_stays_as_it_was_read(main_storage: MainStorage) -> None:
    _fill(main_storage)
    before = _reference(main_storage)
    tree = Topology.read(main_storage)
    main_storage.put_session(SessionMeta(id="late", label="Late"))
    main_storage.put_node(TopologyNode(id="late", parent_id="m", label="Late"))
    main_storage.append_records("a", [HumanMessage("q3")], user_turn=True)
    assert tree == before and "late" not in tree.sessions and tree.turns["a"] == 2
    assert len(Topology.read(main_storage)) == 10


def test_an_empty_tree(main_storage: MainStorage) -> None:
    tree = Topology.read(main_storage)
    assert len(tree) == 0 and tree.root is None and tree.nodes == ()
    assert dict(tree.sessions) == {} and tree.render_text() == "" and tree == Topology()
    assert repr(tree) == "<Topology: 0 sessions, 0 archived, root none>"


def test_a_topology_is_read_only() -> None:
    tree = Topology((TopologyNode(id="m"),))
    with pytest.raises(AttributeError, match="read-only"):
        tree.nodes = ()
    with pytest.raises(AttributeError, match="read-only"):
        del tree.turns
    with pytest.raises(TypeError):
        hash(tree)
    assert tree.node("m") is tree.nodes[0] and tree.root is tree.nodes[0]


def test_a_topology_is_a_field_of_a_pydantic_model(main_storage: MainStorage) -> None:
    import pydantic

    class Holder(pydantic.BaseModel):
        tree: Topology

    _fill(main_storage)
    tree, reference = Topology.read(main_storage), _reference(main_storage)
    assert Holder(tree=tree).tree is tree
    assert Holder(tree=tree).model_dump() == Holder(tree=reference).model_dump()
    dumped = Holder(tree=tree).model_dump()["tree"]
    assert [node["id"] for node in dumped["nodes"]] == [node.id for node in reference.nodes]
    assert dumped["turns"]["a"] == 2 and dumped["sessions"]["odd"]["label"] == _ODD
    assert '"lineage":{"d":' in Holder(tree=tree).model_dump_json()
    with pytest.raises(pydantic.ValidationError):
        Holder(tree={"nodes": []})


def test_where_the_tree_is_read_from(main_storage: MainStorage) -> None:
    """SQLite and PostgreSQL give the tree as text; the others as models, in one read."""
    _fill(main_storage)
    tree = Topology.read(main_storage)
    assert (vars(tree)["_text"] is not None) == _native(main_storage)
    assert ("nodes" in vars(tree)) == (not _native(main_storage))


def test_a_tree_longer_than_sqlite_s_longest_value_is_read_as_models(tmp_path: Path) -> None:
    import sqlite3

    from stello_graph.checkpoints import SqliteMainStorage

    with SqliteMainStorage(tmp_path / "t.db") as storage:
        _fill(storage)
        with storage.transaction():
            for n in range(20):
                meta = SessionMeta(id=f"big{n}", label="Big", metadata={"blob": "y" * 5_000})
                storage.put_session(meta)
                storage.put_node(TopologyNode(id=f"big{n}", parent_id="m", label="Big"))
        reference = _reference(storage)
        storage._conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 50_000)  # the text is ~100 kB
        tree = Topology.read(storage)
        assert vars(tree)["_text"] is None and tree == reference


async def test_a_tree_longer_than_postgresql_s_longest_value_is_read_as_models(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL's 1 GB limit on a value, hit for real by a statement that asks for more
    (the tree's own text would need a gigabyte of sessions): outside a transaction the read
    falls back to models; inside one the failure has aborted it, and is raised."""
    from stello_graph.checkpoints import PostgresMainStorage, _postgres_tree
    from stello_graph.errors import StorageError

    with PostgresMainStorage(postgres_dsn) as storage:
        _fill(storage)
        reference = _reference(storage)
        too_long = "SELECT repeat('x', 1073741824) || %s, %s"
        monkeypatch.setattr(_postgres_tree, "_TOPOLOGY_TEXT", too_long)
        for tree in (Topology.read(storage), await Topology.aread(storage)):
            assert vars(tree)["_text"] is None and tree == reference
        with pytest.raises(StorageError, match="requested length too large"), storage.transaction():
            Topology.read(storage)
        assert Topology.read(storage) == reference  # the storage is still usable


def test_the_text_of_a_chain_deeper_than_the_recursion_limit() -> None:
    import sys

    depth = sys.getrecursionlimit() + 500
    chain = [TopologyNode(id="n0", label="root")]
    chain += [TopologyNode(id=f"n{i}", parent_id=f"n{i - 1}") for i in range(1, depth)]
    lines = Topology(chain).render_text().split("\n")
    assert len(lines) == depth and lines[0] == "root  (n0)"
    assert lines[-1] == " " * 4 * (depth - 2) + f"└── (no label)  (n{depth - 1})"
