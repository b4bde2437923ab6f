"""The turn's two storage calls: `read_session` (one read) and `commit_records` (one commit).

Run over every backend, sync and async: what the one read returns is what the per-field
reads return, a later write shows in the next read, and the commit refuses exactly what
the separate checks refused (a lost lease, an archived session) without storing anything.
"""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from stello_graph.errors import LeaseLostError, SessionArchivedError, SessionNotFoundError
from stello_graph.models import Compression, SessionMeta
from stello_graph.storage import SessionSnapshot
from tests.conftest import Api


async def _session(api: Api, sid: str = "s1") -> None:
    await api("put_session", SessionMeta(id=sid, label="Topic", tags=["a"]))


async def test_read_session_is_the_per_field_reads_at_once(api: Api) -> None:
    await _session(api)
    await api("put_system_prompt", "s1", "Be brief.")
    await api("put_insight", "s1", "a hint")
    await api("put_memory", "s1", "the L2")
    await api("put_subtree_synthesis", "s1", "the branch")
    await api("put_settings", "s1", {"profile": "research"})
    await api("append_records", "s1", [HumanMessage("q"), AIMessage("a")], user_turn=True)
    await api("put_compression", "s1", Compression(summary="older", through=1))

    snap = await api("read_session", "s1")
    assert isinstance(snap, SessionSnapshot)
    assert snap.meta == await api("get_session", "s1")
    assert snap.settings == {"profile": "research"}
    assert (snap.system_prompt, snap.insight, snap.memory) == ("Be brief.", "a hint", "the L2")
    assert snap.subtree_synthesis == "the branch"
    assert snap.compression == Compression(summary="older", through=1)
    assert snap.turn_count == 1
    assert [m.content for m in snap.records] == ["q", "a"]
    assert list(snap.records) == list(await api("shared_records", "s1"))


async def test_read_session_of_a_fresh_and_of_a_missing_session(api: Api) -> None:
    await _session(api)
    snap = await api("read_session", "s1")
    assert snap.settings == {} and snap.compression is None and snap.turn_count == 0
    assert (snap.system_prompt, snap.insight, snap.memory, snap.subtree_synthesis) == (
        None,
        None,
        None,
        None,
    )
    assert list(snap.records) == []
    assert await api("read_session", "missing") is None


async def test_read_session_sees_every_later_write(api: Api) -> None:
    await _session(api)
    assert list((await api("read_session", "s1")).records) == []  # cached empty
    await api("append_records", "s1", [HumanMessage("q")])
    await api("put_insight", "s1", "new")
    snap = await api("read_session", "s1")
    assert [m.content for m in snap.records] == ["q"] and snap.insight == "new"
    await api("trim_records", "s1", 0)
    assert list((await api("read_session", "s1")).records) == []
    assert list((await api("read_session", "s1", records=False)).records) == []


async def test_commit_records_appends_consumes_and_counts(api: Api) -> None:
    await _session(api)
    await api("put_insight", "s1", "shown")
    turns = await api(
        "commit_records", "s1", [HumanMessage("q"), AIMessage("a")], user_turn=True,
        turn_id="t1", insight="shown",
    )  # fmt: skip
    assert turns == 1 == await api("get_turn_count", "s1")
    assert await api("get_insight", "s1") is None
    assert await api("list_record_turns", "s1") == [("t1", 0), ("t1", 1)]
    # a newer insight than the one shown is kept; a turn that is not a user turn counts none
    await api("put_insight", "s1", "newer")
    assert await api("commit_records", "s1", [AIMessage("b")], insight="shown") == 1
    assert await api("get_insight", "s1") == "newer"


async def test_commit_records_checks_and_frees_the_lease(api: Api) -> None:
    await _session(api)
    lease = await api("acquire_lease", "s1", "me", 30.0)
    await api("commit_records", "s1", [HumanMessage("q")], lease=lease)
    assert await api("get_lease", "s1") == lease  # kept without `release`
    await api("commit_records", "s1", [HumanMessage("q2")], lease=lease, release=True)
    assert await api("get_lease", "s1") is None
    with pytest.raises(LeaseLostError):  # freed: the lease holds the session no more
        await api("commit_records", "s1", [HumanMessage("late")], lease=lease)
    assert [m.content for m in await api("list_records", "s1")] == ["q", "q2"]


async def test_commit_records_refuses_a_taken_over_lease_and_an_archived_session(
    api: Api,
) -> None:
    await _session(api)
    old = await api("acquire_lease", "s1", "old", 30.0)
    await api("acquire_lease", "s1", "new", 30.0, replace="old")
    with pytest.raises(LeaseLostError):
        await api("commit_records", "s1", [HumanMessage("q")], lease=old, release=True)
    assert (await api("get_lease", "s1")).owner == "new"  # not freed by the refused commit
    await api("put_session", SessionMeta(id="s1", label="Topic", status="archived"))
    with pytest.raises(SessionArchivedError):
        await api("commit_records", "s1", [HumanMessage("q")], user_turn=True)
    with pytest.raises(SessionNotFoundError):
        await api("commit_records", "missing", [HumanMessage("q")])
    assert await api("count_records", "s1") == 0
    assert await api("get_turn_count", "s1") == 0


async def test_commit_records_inside_a_transaction_rolls_back_with_it(api: Api) -> None:
    await _session(api)

    async def commit_then_fail() -> None:
        async with api.transaction():
            await api("commit_records", "s1", [HumanMessage("q")], user_turn=True)
            raise RuntimeError("the caller fails after the commit")

    with pytest.raises(RuntimeError):
        await commit_then_fail()
    assert await api("count_records", "s1") == 0
    assert (await api("read_session", "s1")).turn_count == 0


async def test_lease_session_takes_the_lease_and_reads_the_session(api: Api) -> None:
    await _session(api)
    await api("put_insight", "s1", "a hint")
    await api("append_records", "s1", [HumanMessage("q"), AIMessage("a")], user_turn=True)
    taken = await api("lease_session", "s1", "me", 30.0)
    assert taken is not None
    lease, snap = taken
    assert await api("get_lease", "s1") == lease and lease.owner == "me"
    assert snap == await api("read_session", "s1")
    assert snap.insight == "a hint" and [m.content for m in snap.records] == ["q", "a"]
    again = await api("lease_session", "s1", "me", 30.0)  # its owner renews it
    assert again is not None and again[0].token == lease.token


async def test_lease_session_refused_while_held_queues_the_asker(api: Api) -> None:
    await _session(api)
    held = await api("acquire_lease", "s1", "holder", 30.0)
    assert await api("lease_session", "s1", "second", 30.0) is None
    assert await api("acquire_lease", "s1", "third", 30.0) is None
    await api("release_lease", held)
    assert await api("acquire_lease", "s1", "third", 30.0) is None  # "second" asked first
    taken = await api("lease_session", "s1", "second", 30.0)
    assert taken is not None and taken[0].token == held.token + 1


async def test_lease_session_refuses_a_missing_or_archived_session_writing_nothing(
    api: Api,
) -> None:
    await _session(api)
    held = await api("acquire_lease", "s1", "holder", 30.0)
    await api("put_session", SessionMeta(id="s1", label="Topic", status="archived"))
    with pytest.raises(SessionArchivedError, match="refuses a turn"):
        await api("lease_session", "s1", "asker", 30.0)
    with pytest.raises(SessionNotFoundError):
        await api("lease_session", "missing", "asker", 30.0)
    assert await api("get_lease", "s1") == held
    await api("release_lease", held)
    # the refused asker was not queued: the next one takes the (archived) session at once,
    # as removing it does
    assert await api("acquire_lease", "s1", "next", 30.0) is not None


async def test_lease_session_inside_a_transaction_rolls_back_with_it(api: Api) -> None:
    await _session(api)

    async def lease_then_fail() -> None:
        async with api.transaction():
            assert await api("lease_session", "s1", "me", 30.0) is not None
            raise RuntimeError("the caller fails after the lease")

    with pytest.raises(RuntimeError):
        await lease_then_fail()
    assert await api("get_lease", "s1") is None
