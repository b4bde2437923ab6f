"""`list_session_stats`: every session's figures in one read, the same on both backends."""

from __future__ import annotations

from langchain_core.messages import AIMessage, HumanMessage

from stello_graph.models import SessionMeta, TopologyNode
from tests.conftest import Api


def _turn(text: str) -> list[HumanMessage | AIMessage]:
    return [HumanMessage(text), AIMessage(f"re: {text}")]


async def test_stats_match_the_per_session_reads(api: Api) -> None:
    for sid, label in (("m", "Main"), ("a", "Pricing"), ("b", "Growth"), ("other", "")):
        role = "main" if sid == "m" else "standard"
        await api("put_session", SessionMeta(id=sid, label=label, role=role))
    await api("put_node", TopologyNode(id="m"))
    await api("put_node", TopologyNode(id="a", parent_id="m", label="Pricing"))
    for text in ("one", "two", "three"):
        await api("append_records", "a", _turn(text), user_turn=True)
    await api("put_memory", "a", "L2 of a", through=4)  # covers the first two turns
    await api("put_insight", "b", "look at a")
    await api("put_subtree_synthesis", "a", "below a")

    stats = await api("list_session_stats")

    assert [s.id for s in stats] == ["m", "a", "b", "other"]
    by_id = {s.id: s for s in stats}
    a, b = by_id["a"], by_id["b"]
    meta = await api("get_session", "a")
    assert (a.label, a.role, a.status, a.updated_at) == (
        "Pricing",
        "standard",
        "active",
        meta.updated_at,
    )
    assert (a.parent_id, a.in_tree, by_id["m"].role, by_id["m"].in_tree) == (
        "m",
        True,
        "main",
        True,
    )
    assert (by_id["b"].parent_id, by_id["b"].in_tree) == (None, False)
    assert (a.turns, a.records, a.memory_through, a.turns_since_memory) == (3, 6, 4, 1)
    assert (a.has_memory, a.has_insight, a.has_subtree_synthesis) == (True, False, True)
    assert (b.turns, b.records, b.turns_since_memory) == (0, 0, 0)
    assert (b.has_memory, b.has_insight) == (False, True)


async def test_stale_turns_count_from_the_first_record_after_a_trim(api: Api) -> None:
    await api("put_session", SessionMeta(id="a", label="A"))
    for text in ("one", "two", "three"):
        await api("append_records", "a", _turn(text), user_turn=True)
    await api("put_memory", "a", "L2", through=4)
    await api("trim_records", "a", 4)  # drops turn one; the cursor moves back to 2

    (stats,) = await api("list_session_stats")

    assert (stats.records, stats.memory_through, stats.turns_since_memory) == (4, 2, 1)


async def test_no_sessions_no_stats(api: Api) -> None:
    assert await api("list_session_stats") == []
