"""A fork is written with its TopologyNode or not at all: in a tree (a storage with a main
session), forking a session that has no node is refused before anything is written; a
storage with no tree at all keeps standalone sessions, whose forks are standalone too."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import BaseMessage

from stello_graph import MainSession, NodeNotFoundError, Session
from stello_graph.models import TopologyNode
from stello_graph.storage import MainStorage


def _everything(storage: MainStorage) -> tuple[Any, ...]:
    return (
        [m.id for m in storage.list_sessions()],
        [n.id for n in storage.get_tree()],
    )


async def _fork(s: Session, mode: str, label: str, **options: Any) -> Session:
    return s.fork(label, **options) if mode == "sync" else await s.afork(label, **options)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_fork_of_a_session_outside_the_tree_is_refused(
    main_storage: MainStorage, mode: str
) -> None:
    MainSession.create(main_storage)
    outside = Session.create(main_storage, label="Outside")  # a session with no node
    before = _everything(main_storage)
    picked: list[int] = []

    def context(records: list[BaseMessage]) -> list[BaseMessage]:
        picked.append(len(records))
        return records

    with pytest.raises(NodeNotFoundError, match=repr(outside.id)) as caught:
        await _fork(outside, mode, "Child", context=context, id="child")
    assert "no topology node" in str(caught.value)
    assert _everything(main_storage) == before  # no child session, no node
    assert main_storage.get_session("child") is None
    assert picked == []  # refused before the context function ran


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_fork_in_a_tree_always_has_its_node(main_storage: MainStorage, mode: str) -> None:
    main = MainSession.create(main_storage)
    branch = Session.create(main_storage, label="Branch")
    main_storage.put_node(TopologyNode(id=branch.id, parent_id=main.id, label="Branch"))
    child = await _fork(branch, mode, "Leaf")
    node = main_storage.get_node(child.id)
    assert node is not None and node.parent_id == branch.id
    assert main_storage.remove_node(child.id) == [child.id]  # and so it can be removed


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_standalone_sessions_without_a_tree_fork_standalone(
    main_storage: MainStorage, mode: str
) -> None:
    alone = Session.create(main_storage)  # no main session: the storage keeps no tree
    child = await _fork(alone, mode, "x")
    assert main_storage.get_session(child.id) is not None
    assert main_storage.get_tree() == []
