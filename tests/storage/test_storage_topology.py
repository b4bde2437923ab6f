"""The topology tree: both backends, sync and async."""

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage

from stello_graph.errors import (
    NodeHasChildrenError,
    NodeNotFoundError,
    SessionNotFoundError,
    TopologyCycleError,
)
from stello_graph.models import SessionMeta, TopologyNode
from tests.conftest import Api


async def add(api: Api, node_id: str, parent_id: str | None = None) -> None:
    """A session and its node, labelled with the id upper-cased."""
    role = "main" if parent_id is None else "standard"
    await api("put_session", SessionMeta(id=node_id, label=node_id.upper(), role=role))
    await api("put_node", TopologyNode(id=node_id, parent_id=parent_id, label=node_id.upper()))


def ids(nodes: list[TopologyNode]) -> list[str]:
    return [node.id for node in nodes]


@pytest.fixture
async def tree(api: Api) -> Api:
    """main -> (zed -> (z2, z1), alpha -> (a1 -> a11), mid)  (created in that order)."""
    await add(api, "main")
    await add(api, "zed", "main")
    await add(api, "alpha", "main")
    await add(api, "z2", "zed")
    await add(api, "a1", "alpha")
    await add(api, "mid", "main")
    await add(api, "z1", "zed")
    await add(api, "a11", "a1")
    return api


async def test_get_node(tree: Api) -> None:
    assert await tree("get_node", "a1") == TopologyNode(id="a1", parent_id="alpha", label="A1")
    assert await tree("get_node", "main") == TopologyNode(id="main", parent_id=None, label="MAIN")


async def test_children_in_creation_order(tree: Api) -> None:
    assert ids(await tree("get_children", "main")) == ["zed", "alpha", "mid"]
    assert ids(await tree("get_children", "zed")) == ["z2", "z1"]
    assert await tree("get_children", "mid") == []


async def test_ancestors_nearest_first(tree: Api) -> None:
    assert ids(await tree("get_ancestors", "a11")) == ["a1", "alpha", "main"]
    assert ids(await tree("get_ancestors", "zed")) == ["main"]
    assert await tree("get_ancestors", "main") == []


async def test_tree_is_depth_first_preorder(tree: Api) -> None:
    assert ids(await tree("get_tree")) == [
        *("main", "zed", "z2", "z1", "alpha", "a1", "a11", "mid"),
    ]


async def test_move_keeps_creation_position(tree: Api) -> None:
    await tree("put_node", TopologyNode(id="zed", parent_id="mid", label="moved"))
    assert ids(await tree("get_children", "main")) == ["alpha", "mid"]
    await tree("put_node", TopologyNode(id="zed", parent_id="main", label="back"))
    assert ids(await tree("get_children", "main")) == ["zed", "alpha", "mid"]
    assert (await tree("get_node", "zed")).label == "back"
    assert ids(await tree("get_ancestors", "z1")) == ["zed", "main"]


async def test_relabelling_the_session_relabels_its_node(tree: Api) -> None:
    await tree("put_session", SessionMeta(id="z1", label="renamed"))
    assert (await tree("get_node", "z1")).label == "renamed"
    assert (await tree("get_node", "z2")).label == "Z2"


@pytest.mark.parametrize(
    ("node_id", "parent_id"), [("zed", "zed"), ("zed", "z1"), ("alpha", "a11")]
)
async def test_cycles_are_refused(tree: Api, node_id: str, parent_id: str) -> None:
    before = await tree("get_tree")
    with pytest.raises(TopologyCycleError, match=repr(parent_id)):
        await tree("put_node", TopologyNode(id=node_id, parent_id=parent_id))
    assert await tree("get_tree") == before


async def test_put_node_needs_session_and_parent(tree: Api) -> None:
    with pytest.raises(SessionNotFoundError):
        await tree("put_node", TopologyNode(id="ghost", parent_id="main"))
    await tree("put_session", SessionMeta(id="orphan", label=""))
    with pytest.raises(NodeNotFoundError, match="'missing'"):
        await tree("put_node", TopologyNode(id="orphan", parent_id="missing"))
    assert await tree("get_node", "orphan") is None


async def test_remove_leaf_removes_its_session_data(tree: Api) -> None:
    await tree("append_records", "z1", [HumanMessage("x")], user_turn=True)
    await tree("put_memory", "z1", "L2")
    assert await tree("remove_node", "z1") == ["z1"]
    assert await tree("get_node", "z1") is None
    assert await tree("get_session", "z1") is None
    assert await tree("list_records", "z1") == []
    assert await tree("count_records", "z1") == 0
    assert await tree("get_memory", "z1") is None
    assert ids(await tree("get_children", "zed")) == ["z2"]


async def test_remove_refuses_node_with_children(tree: Api) -> None:
    before = await tree("get_tree")
    with pytest.raises(NodeHasChildrenError, match="2 child") as caught:
        await tree("remove_node", "zed")
    assert caught.value.children == 2
    assert await tree("get_tree") == before
    assert await tree("get_session", "zed") is not None


async def test_cascade_removes_the_subtree_and_its_data(tree: Api) -> None:
    for sid in ("alpha", "a1", "a11", "mid"):
        await tree("append_records", sid, [HumanMessage(sid)])
        await tree("put_memory", sid, f"L2 {sid}")
        await tree("put_insight", sid, "insight")
    removed = await tree("remove_node", "alpha", cascade=True)
    assert removed == ["alpha", "a1", "a11"]
    for sid in removed:
        assert await tree("get_session", sid) is None
        assert await tree("get_node", sid) is None
        assert await tree("list_records", sid) == []
        assert await tree("get_insight", sid) is None
    assert [l2.session_id for l2 in await tree("get_all_session_l2s")] == ["mid"]
    assert ids(await tree("get_tree")) == ["main", "zed", "z2", "z1", "mid"]
    assert await tree("list_records", "mid") == [HumanMessage("mid")]


async def test_removed_id_can_be_reused_fresh(tree: Api) -> None:
    await tree("append_records", "mid", [HumanMessage("old")], user_turn=True)
    await tree("remove_node", "mid")
    await add(tree, "mid", "zed")
    assert await tree("count_records", "mid") == 0
    assert await tree("get_turn_count", "mid") == 0
    assert ids(await tree("get_children", "zed")) == ["z2", "z1", "mid"]


async def test_remove_missing_node(tree: Api) -> None:
    with pytest.raises(NodeNotFoundError):
        await tree("remove_node", "nope")
    await tree("put_session", SessionMeta(id="no-node", label=""))
    with pytest.raises(NodeNotFoundError):
        await tree("remove_node", "no-node")
    assert await tree("get_session", "no-node") is not None


async def test_whole_tree_removal(tree: Api) -> None:
    removed = await tree("remove_node", "main", cascade=True)
    assert sorted(removed) == sorted(["main", "zed", "alpha", "z2", "a1", "mid", "z1", "a11"])
    assert removed[0] == "main"
    assert await tree("get_tree") == []
    assert await tree("list_sessions") == []
