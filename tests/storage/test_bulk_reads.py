"""Whole-tree reads: `export_rows` (the streamed export), `iter_session_l2s`,
`list_turn_counts`, and the models built from stored rows without validation."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from stello_graph._export_rows import Emit, Entries
from stello_graph.checkpoints import BackendStorage
from stello_graph.checkpoints._rows import stored_l2, stored_meta, stored_node
from stello_graph.checkpoints._serde import meta_to_row, row_to_meta
from stello_graph.errors import InvalidInputError
from stello_graph.export import _gathered, export_tree, write_export
from stello_graph.models import ChildL2, SessionMeta, TopologyNode
from stello_graph.storage import MainStorage
from stello_graph.topology import Topology
from tests.conftest import Api


def _export_by_session(storage: MainStorage, records: bool) -> dict[str, Any]:
    """The export read session by session through the public reads: what the streamed
    export must equal."""
    return _gathered(storage, _by_session(storage, records))


def _by_session(storage: MainStorage, records: bool) -> tuple[Entries, Entries]:
    tree = Topology.read(storage)

    def nodes(emit: Emit) -> None:
        for node in tree.nodes:
            emit(_marked(node.model_dump(mode="json"), node.damaged))

    return nodes, lambda emit: _session_entries(storage, tree, records, emit)


def _marked(entry: dict[str, Any], damaged: tuple[str, ...]) -> dict[str, Any]:
    """An entry of a model, marked as the streamed export marks its row."""
    if "parent_id" in damaged:
        entry["detached"] = True
    if columns := [column for column in damaged if column != "parent_id"]:
        entry["damaged"] = columns
    return entry


def _session_entries(storage: MainStorage, tree: Topology, records: bool, emit: Emit) -> None:
    for node in tree.nodes:
        meta = tree.sessions.get(node.id)
        if meta is None:
            continue
        standard = meta.role == "standard"
        entry: dict[str, Any] = _marked(meta.model_dump(mode="json"), meta.damaged)
        entry["parent_id"] = node.parent_id
        entry["turns"] = tree.turns.get(node.id, 0)
        entry["record_count"] = storage.count_records(node.id)
        entry["system_prompt"] = storage.get_system_prompt(node.id)
        entry["l2"] = storage.get_memory(node.id) if standard else None
        entry["insight"] = storage.get_insight(node.id) if standard else None
        if records:
            from langchain_core.messages import messages_to_dict

            entry["records"] = messages_to_dict(storage.list_records(node.id))
        emit(entry)


def _tree(storage: MainStorage) -> None:
    """A tree whose depth-first order is not its creation order (a moved node), with every
    kind of value an export shows."""
    at = datetime(2026, 3, 4, 5, 6, 7, 120000, tzinfo=UTC)
    storage.put_session(SessionMeta(id="main", label="Main", role="main", created_at=at))
    storage.put_node(TopologyNode(id="main", label="Main"))
    sessions = [("a", "main", "Ärger ☕"), ("b", "main", "B"), ("c", "a", "C"), ("d", "b", "D")]
    for sid, parent, label in sessions:
        meta = SessionMeta(id=sid, label=label, tags=("x", "ü"), metadata={"k": [1, "ß"]})
        storage.put_session(meta if sid != "b" else meta.model_copy(update={"tags": ()}))
        storage.put_node(TopologyNode(id=sid, parent_id=parent, label=label))
    storage.put_node(TopologyNode(id="c", parent_id="b", label="C"))  # moved: b > c, d
    storage.append_records("a", [HumanMessage("q ☕"), AIMessage("r")], user_turn=True)
    call = {"name": "lookup", "args": {"q": "x"}, "id": "t1"}
    tool_turn = [
        HumanMessage("q2"),
        AIMessage("", tool_calls=[call]),
        ToolMessage("ok", tool_call_id="t1"),
    ]
    storage.append_records("c", tool_turn, user_turn=True)
    storage.put_memory("a", "L2 of a", through=2)
    storage.put_memory("main", "the synthesis")
    storage.put_insight("c", "an insight")
    storage.put_system_prompt("d", "be brief")
    storage.put_session(SessionMeta(id="d", label="D", status="archived"))
    storage.put_session(SessionMeta(id="loose", label="outside the tree"))  # no node


@pytest.mark.parametrize("records", [False, True], ids=["meta", "records"])
def test_the_streamed_export_is_the_export_read_session_by_session(
    main_storage: MainStorage, records: bool
) -> None:
    _tree(main_storage)
    reference = _export_by_session(main_storage, records)
    assert [s["id"] for s in reference["sessions"]] == ["main", "a", "b", "c", "d"]
    assert export_tree(main_storage, records=records) == reference
    out = io.StringIO()
    write_export(main_storage, out, records=records)
    assert out.getvalue() == json.dumps(reference, indent=2, ensure_ascii=False)


def _forks(storage: MainStorage) -> None:
    """`a` with two turns; `f` shares all of it and adds a turn; `g` shares two of `f`'s
    records (a cut inside `f`'s own shared prefix) and adds none; `h` shares all of `f`."""
    storage.put_session(SessionMeta(id="main", label="Main", role="main"))
    storage.put_node(TopologyNode(id="main", label="Main"))
    for sid, parent in [("a", "main"), ("f", "a"), ("g", "f"), ("h", "f")]:
        storage.put_session(SessionMeta(id=sid, label=sid.upper()))
        storage.put_node(TopologyNode(id=sid, parent_id=parent, label=sid.upper()))
    for text in ("one", "two"):
        storage.append_records("a", [HumanMessage(text), AIMessage(f"re {text}")], user_turn=True)
    storage.copy_records("a", "f", count=4)
    storage.append_records("f", [HumanMessage("three"), AIMessage("re three")], user_turn=True)
    storage.copy_records("f", "g", count=2)
    storage.copy_records("f", "h", count=6)


@pytest.mark.parametrize("records", [False, True], ids=["meta", "records"])
def test_forks_sharing_their_source_rows_export_their_whole_history(
    main_storage: MainStorage, records: bool
) -> None:
    _forks(main_storage)
    reference = _export_by_session(main_storage, records)
    counts = {s["id"]: s["record_count"] for s in reference["sessions"]}
    assert counts == {"main": 0, "a": 4, "f": 6, "g": 2, "h": 6}
    if records:
        texts = {
            s["id"]: [r["data"]["content"] for r in s["records"]] for s in reference["sessions"]
        }
        assert texts["h"] == ["one", "re one", "two", "re two", "three", "re three"]
        assert texts["g"] == ["one", "re one"]
    assert export_tree(main_storage, records=records) == reference
    out = io.StringIO()
    write_export(main_storage, out, records=records)
    assert out.getvalue() == json.dumps(reference, indent=2, ensure_ascii=False)


def test_an_empty_tree_exports_as_before(main_storage: MainStorage) -> None:
    out = io.StringIO()
    write_export(main_storage, out, records=True)
    reference = _export_by_session(main_storage, True)
    assert reference["nodes"] == reference["sessions"] == []
    assert out.getvalue() == json.dumps(reference, indent=2, ensure_ascii=False)


async def test_export_rows_reads_each_part_in_tree_order(api: Api) -> None:
    _tree(api.storage)
    order = [node.id for node in api.storage.get_tree()]
    seen: dict[str, list[tuple[Any, ...]]] = {}
    for part in ("nodes", "sessions", "records"):
        rows: list[tuple[Any, ...]] = []
        count = await api("export_rows", part, rows.append)
        assert count == len(rows)
        seen[part] = rows
    assert [row[0] for row in seen["nodes"]] == order == ["main", "a", "b", "c", "d"]
    assert [row[0] for row in seen["sessions"]] == order
    by_record = [(row[0], row[14] is not None) for row in seen["records"]]
    assert by_record == [("main", False), ("a", True), ("a", True), ("b", False),
                         *[("c", True)] * 3, ("d", False)]  # fmt: skip
    a = seen["sessions"][1]
    assert a[8:14] == ("main", 1, 2, None, "L2 of a", None)
    with pytest.raises(InvalidInputError, match="part must be one of"):
        await api("export_rows", "everything", rows.append)


async def test_l2s_come_in_pages_of_the_same_l2s(api: Api) -> None:
    storage = api.storage
    assert isinstance(storage, BackendStorage)  # every stello storage
    for n in range(7):
        storage.put_session(SessionMeta(id=f"s{n}", label=f"S{n}"))
        if n != 3:
            storage.put_memory(f"s{n}", f"l2 {n}")
    storage.put_session(SessionMeta(id="s5", label="S5", status="archived"))
    expected = storage.get_all_session_l2s()
    assert [c.session_id for c in expected] == ["s0", "s1", "s2", "s4", "s6"]
    for batch in (1, 2, 5, 1000):
        if api.mode == "sync":
            pages = list(storage.iter_session_l2s(batch=batch))
        else:
            pages = [page async for page in storage.aiter_session_l2s(batch=batch)]
        assert all(0 < len(page) <= batch for page in pages)
        assert [c for page in pages for c in page] == expected
    with pytest.raises(InvalidInputError, match="batch must be an int"):
        storage.iter_session_l2s(batch=0)
    with pytest.raises(InvalidInputError, match="batch must be an int"):
        await anext(storage.aiter_session_l2s(batch=True))


async def test_turn_counts_of_every_session(api: Api) -> None:
    _tree(api.storage)
    counts = await api("list_turn_counts")
    assert counts == {"main": 0, "a": 1, "b": 0, "c": 1, "d": 0, "loose": 0}


def test_models_from_stored_rows_equal_validated_ones() -> None:
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    for meta in (
        SessionMeta(id="s", label="L", created_at=at, updated_at=at),
        SessionMeta(id="s", label="L", role="main", status="archived", tags=("a", "b"),
                    metadata={"x": {"y": [1, 2]}}),
    ):  # fmt: skip
        row = meta_to_row(meta)
        built, checked = stored_meta(row), row_to_meta(row)
        assert built == checked == meta
        assert built.model_dump() == checked.model_dump()
        assert built.model_fields_set == checked.model_fields_set
        assert built.model_copy(update={"label": "M"}).label == "M" and built.label == "L"
    node = stored_node(("n", None, "N"))
    assert node == TopologyNode(id="n", label="N") and hash(node) == hash(
        TopologyNode(id="n", label="N")
    )
    assert stored_l2("s", "L", "x") == ChildL2(session_id="s", label="L", l2="x")
    with pytest.raises(Exception, match="frozen"):
        node.label = "changed"  # type: ignore[misc]
