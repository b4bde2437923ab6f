"""The backend protocol: a few primitives a storage implements, the rest built on them."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from stello_graph.checkpoints import (
    BackendStorage,
    InMemoryMainStorage,
    OptionalPrimitives,
    SqliteMainStorage,
    StorageBackend,
)
from stello_graph.checkpoints.backend import FIELDS
from stello_graph.errors import InvalidInputError
from stello_graph.models import SessionMeta, TopologyNode
from stello_graph.storage import MainStorage


def _members(cls: type) -> set[str]:
    return {name for name in vars(cls) if not name.startswith("_")}


def test_a_backend_implements_primitives_only() -> None:
    primitives = _members(StorageBackend)
    assert len(primitives) == 21  # twenty `op_*` and the transaction hooks
    assert primitives - {"transaction_hooks"} == {n for n in primitives if n.startswith("op_")}


@pytest.mark.parametrize("storage_class", [InMemoryMainStorage, SqliteMainStorage])
def test_the_reference_storages_are_backends(storage_class: type) -> None:
    for name in _members(StorageBackend) | _members(OptionalPrimitives):
        assert hasattr(storage_class, name), name


def test_the_storage_implements_every_method_of_the_protocol() -> None:
    protocol = {
        name
        for cls in MainStorage.__mro__
        if cls is not object and not cls.__name__.startswith("Protocol")
        for name in vars(cls)
        if not name.startswith("_")
    } - {"Generic"}
    missing = {name for name in protocol if not callable(getattr(BackendStorage, name, None))}
    assert missing <= {"tree_id"}, missing  # a property
    for name in protocol - {"tree_id"}:
        ours = inspect.signature(getattr(BackendStorage, name)).parameters
        theirs = list(inspect.signature(getattr(MainStorage, name)).parameters)
        assert list(ours)[: len(theirs)] == theirs, name
        for extra in list(ours)[len(theirs) :]:  # options of its own (`savepoints=`) only
            assert ours[extra].kind is inspect.Parameter.KEYWORD_ONLY, (name, extra)
            assert ours[extra].default is not inspect.Parameter.empty, (name, extra)


def test_a_backend_object_is_composed_into_a_full_storage(tmp_path: Path) -> None:
    backend = SqliteMainStorage(tmp_path / "b.db", tree_id="t")
    with BackendStorage(backend, tree_id="t") as storage:
        storage.put_session(SessionMeta(id="main", label="Main", role="main"))
        storage.put_session(SessionMeta(id="c", label="Child"))
        storage.put_node(TopologyNode(id="main"))
        with storage.transaction():
            storage.put_node(TopologyNode(id="c", parent_id="main", label="Child"))
            storage.put_memory("c", "l2")
        assert [n.id for n in storage.get_tree()] == ["main", "c"]
        assert [c.l2 for c in storage.get_all_session_l2s()] == ["l2"]
        with pytest.raises(InvalidInputError):  # validation is the storage's, not the backend's
            storage.put_insight("c", 5)  # type: ignore[arg-type]
        assert backend.get_memory("c") == "l2"  # what the backend holds
    assert backend._closed  # closing the storage released its backend
    assert "insight" in FIELDS
