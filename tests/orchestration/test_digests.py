"""Digests: every session's figures for an outside orchestrator, the same from the bulk
read (`digests`) and the one-session read (`digest`), sync and async."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from langchain_core.messages import BaseMessage

from stello_graph import InvalidInputError, SessionDigest, StelloAgent
from stello_graph.errors import SessionNotFoundError
from stello_graph.testing import ScriptedChatModel
from tests.orchestration.conftest import AgentFactory


def _consolidate(previous: str | None, records: Sequence[BaseMessage]) -> str:
    return f"{len(records)} records"


def _setup(make_agent: AgentFactory) -> tuple[StelloAgent, dict[str, str]]:
    agent = make_agent(model=ScriptedChatModel(default="ok"), consolidate_fn=_consolidate)
    ideas = agent.fork(agent.main_session_id, "Ideas").id
    tea = agent.fork(ideas, "Tea").id
    old = agent.fork(ideas, "Old").id
    for question in ("a", "b", "c"):
        agent.turn(ideas, question)
    agent.consolidate(ideas)
    agent.turn(ideas, "d")
    agent.turn(tea, "x")
    agent.child(tea).set_insight("Try oolong.")
    agent.archive(old)
    return agent, {"ideas": ideas, "tea": tea, "old": old}


def test_digests_give_every_session_its_figures(make_agent: AgentFactory) -> None:
    agent, ids = _setup(make_agent)
    found = {d.id: d for d in agent.digests()}
    assert list(found) == [agent.main_session_id, ids["ideas"], ids["tea"], ids["old"]]
    ideas = found[ids["ideas"]]
    assert (ideas.label, ideas.role, ideas.status) == ("Ideas", "standard", "active")
    assert (ideas.parent_id, ideas.turns, ideas.l2) == (agent.main_session_id, 4, "6 records")
    assert (ideas.stale_turns, ideas.insight) == (1, None)
    tea = found[ids["tea"]]
    assert (tea.parent_id, tea.turns, tea.l2, tea.stale_turns) == (ids["ideas"], 1, None, 1)
    assert tea.insight == "Try oolong."
    assert found[ids["old"]].status == "archived"
    main = found[agent.main_session_id]
    assert (main.role, main.parent_id) == ("main", None)
    assert ideas.last_activity >= agent.session(ids["ideas"]).meta.created_at


def test_digests_filter_by_status(make_agent: AgentFactory) -> None:
    agent, ids = _setup(make_agent)
    assert [d.id for d in agent.digests(status="archived")] == [ids["old"]]
    assert ids["old"] not in {d.id for d in agent.digests(status="active")}
    with pytest.raises(InvalidInputError, match="status must be 'active', 'archived' or None"):
        agent.digests(status="open")


def test_one_digest_is_the_same_as_in_the_bulk_read(make_agent: AgentFactory) -> None:
    agent, ids = _setup(make_agent)
    bulk = {d.id: d for d in agent.digests()}
    for session_id in (*ids.values(), agent.main_session_id):
        assert agent.digest(session_id) == bulk[session_id]
    with pytest.raises(SessionNotFoundError):
        agent.digest("nobody")


def test_an_outside_reflection_loop(make_agent: AgentFactory) -> None:
    agent, ids = _setup(make_agent)
    stale = [d for d in agent.digests(status="active") if d.role == "standard" and d.stale_turns]
    for digest in stale:
        agent.consolidate(digest.id)
        agent.child(digest.id).set_insight(f"Digest of {digest.label} read.")
    after = {d.id: d for d in agent.digests(status="active")}
    assert all(after[d.id].stale_turns == 0 and after[d.id].l2 for d in stale)
    assert after[ids["ideas"]].insight == "Digest of Ideas read."


async def test_async_twins(make_agent: AgentFactory) -> None:
    agent, ids = _setup(make_agent)
    assert await agent.adigests() == agent.digests()
    assert await agent.adigests(status="archived") == agent.digests(status="archived")
    digest = await agent.adigest(ids["tea"])
    assert isinstance(digest, SessionDigest) and digest == agent.digest(ids["tea"])


def test_a_digest_built_from_a_row_is_the_one_its_constructor_gives() -> None:
    """`digest_from_row` fills the slots directly: the digest must still be whole, equal,
    hashable, frozen and picklable as one made by `SessionDigest(...)`."""
    import dataclasses
    import pickle
    from datetime import UTC, datetime

    from stello_graph.digest import SessionDigest, digest_from_row

    row = ("s", "Label", "standard", "archived", "2026-01-02T03:04:05.000006+00:00", "m", 3,
           "L2", 1, None)  # fmt: skip
    built = digest_from_row(row)
    made = SessionDigest(
        id="s",
        label="Label",
        role="standard",
        status="archived",
        parent_id="m",
        turns=3,
        l2="L2",
        stale_turns=1,
        insight=None,
        last_activity=datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
    )
    assert built == made and hash(built) == hash(made) and repr(built) == repr(made)
    assert dataclasses.asdict(built) == dataclasses.asdict(made)
    assert pickle.loads(pickle.dumps(built)) == made
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.turns = 4  # type: ignore[misc]
    naive = digest_from_row((*row[:4], "2026-01-02T03:04:05", *row[5:]))
    assert naive.last_activity.tzinfo is UTC
    coded = digest_from_row((*row[:2], 0, 1, *row[4:]))  # role and status as their codes
    assert coded == made


def test_digests_share_one_string_per_role_and_status(make_agent: AgentFactory) -> None:
    """A whole-tree read of 100,000 digests must not hold 200,000 copies of 'standard' and
    'active': every backend hands out one string per value."""
    agent, ids = _setup(make_agent)
    for n in range(4):
        agent.fork(ids["ideas"], f"More {n}")
    found = agent.digests()
    assert {d.role for d in found} == {"main", "standard"}
    assert {d.status for d in found} == {"active", "archived"}
    for value in ("standard", "active"):
        held = [d.role if value == "standard" else d.status for d in found]
        assert len({id(v) for v in held if v == value}) == 1, value
