"""Schema version 2: subtree synthesis, compression summary and settings, on both backends."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from stello_graph.errors import InvalidInputError, SessionNotFoundError
from stello_graph.models import Compression, SessionMeta
from tests.conftest import Api


async def make(api: Api, sid: str = "s1", records: int = 6) -> None:
    await api("put_session", SessionMeta(id=sid, label=sid))
    pairs = [[HumanMessage(f"q{i}"), AIMessage(f"a{i}")] for i in range(records // 2)]
    await api("append_records", sid, [m for pair in pairs for m in pair])


async def test_subtree_synthesis_round_trip(api: Api) -> None:
    await make(api)
    assert await api("get_subtree_synthesis", "s1") is None
    await api("put_subtree_synthesis", "s1", "the branch adds up to X")
    assert await api("get_subtree_synthesis", "s1") == "the branch adds up to X"
    assert await api("get_memory", "s1") is None  # a separate slot from L2
    with pytest.raises(SessionNotFoundError):
        await api("put_subtree_synthesis", "missing", "x")
    with pytest.raises(InvalidInputError):
        await api("put_subtree_synthesis", "s1", 42)


async def test_compression_round_trip_and_trim(api: Api) -> None:
    await make(api)
    assert await api("get_compression", "s1") is None
    await api("put_compression", "s1", Compression(summary="first four", through=4))
    assert await api("get_compression", "s1") == Compression(summary="first four", through=4)
    assert await api("trim_records", "s1", 3) == 3  # drops 3 of the 4 covered records
    assert await api("get_compression", "s1") == Compression(summary="first four", through=1)
    await api("put_compression", "s1", None)
    assert await api("get_compression", "s1") is None
    with pytest.raises(InvalidInputError, match="Compression"):
        await api("put_compression", "s1", {"summary": "x", "through": 1})


async def test_settings_round_trip(api: Api) -> None:
    await make(api)
    assert await api("get_settings", "s1") == {}
    await api("put_settings", "s1", {"skills": ["a", "b"], "last_fork_turn": 3})
    assert await api("get_settings", "s1") == {"skills": ["a", "b"], "last_fork_turn": 3}
    assert await api("get_settings", "missing") == {}
    with pytest.raises(InvalidInputError, match="settings"):
        await api("put_settings", "s1", ["not", "a", "dict"])
    with pytest.raises(SessionNotFoundError):
        await api("put_settings", "missing", {})
