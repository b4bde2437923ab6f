"""Reading a whole tree costs a fixed number of statements, whatever its size."""

from __future__ import annotations

from pathlib import Path

from langchain_core.messages import AIMessage, HumanMessage

from stello_graph import SqliteMainStorage, export_tree
from stello_graph.models import SessionMeta, TopologyNode
from stello_graph.topology import Topology


def _tree(path: Path, sessions: int) -> SqliteMainStorage:
    storage = SqliteMainStorage(path)
    with storage.transaction():
        storage.put_session(SessionMeta(id="main", label="", role="main"))
        storage.put_node(TopologyNode(id="main"))
        for n in range(sessions):
            storage.put_session(SessionMeta(id=f"s{n}", label=f"S{n}"))
            storage.put_node(TopologyNode(id=f"s{n}", parent_id="main"))
            records = [HumanMessage(f"q{n}"), AIMessage(f"a{n}")] * (n % 3)
            storage.append_records(f"s{n}", records, user_turn=bool(records))
    return storage


def _statements(storage: SqliteMainStorage, read: object) -> int:
    seen: list[str] = []
    conn = storage._conn
    conn.set_trace_callback(seen.append)
    try:
        assert callable(read)
        read()
    finally:
        conn.set_trace_callback(None)
    return len(seen)


def test_reading_the_topology_does_not_grow_with_the_tree(tmp_path: Path) -> None:
    small, big = _tree(tmp_path / "small.db", 3), _tree(tmp_path / "big.db", 30)
    try:
        tree = Topology.read(big)
        assert [tree.turns[f"s{n}"] for n in range(4)] == [0, 1, 1, 0]  # one turn per append
        assert _statements(small, lambda: Topology.read(small)) == _statements(
            big, lambda: Topology.read(big)
        )
    finally:
        small.close()
        big.close()


def test_export_reads_record_counts_at_once(tmp_path: Path) -> None:
    storage = _tree(tmp_path / "t.db", 5)
    try:
        data = export_tree(storage)
        counts = {s["id"]: s["record_count"] for s in data["sessions"]}
        assert counts == {"main": 0, "s0": 0, "s1": 2, "s2": 4, "s3": 0, "s4": 2}
    finally:
        storage.close()


class _Without:
    """`storage` as on a backend without `op_topology_text`: `Topology.read` reads
    `topology_parts`."""

    def __init__(self, storage: SqliteMainStorage) -> None:
        self._storage = storage

    def topology_text(self) -> None:
        return None

    async def atopology_text(self) -> None:
        return None

    def __getattr__(self, name: str) -> object:
        return getattr(self._storage, name)


async def test_the_topology_is_one_statement(
    tmp_path: Path,
) -> None:
    storage = _tree(tmp_path / "t.db", 5)
    try:
        storage.put_lineage("s1", "s0", 1)
        seen: list[str] = []
        storage._conn.set_trace_callback(seen.append)
        tree = Topology.read(storage)
        storage._conn.set_trace_callback(None)
        reads = [sql for sql in seen if "stello_sessions" in sql or "stello_nodes" in sql]
        assert len(reads) == 1, reads  # nodes, metas, lineage and turns together: one snapshot
        assert tree == Topology.read(_Without(storage))  # type: ignore[arg-type]
        assert tree == await Topology.aread(storage)
        assert tree == await Topology.aread(_Without(storage))  # type: ignore[arg-type]
        assert tree.lineage["s1"].at_turn == 1 and tree.turns["s2"] == 1
    finally:
        storage.close()
