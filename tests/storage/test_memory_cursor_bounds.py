"""The memory cursor (`through`) never points past the end of L3."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from stello_graph import InvalidInputError, SessionNotFoundError
from stello_graph.models import SessionMeta
from tests.conftest import Api


async def test_through_beyond_l3_is_refused_and_nothing_changes(api: Api) -> None:
    await api("put_session", SessionMeta(id="s1", label="S1"))
    await api("append_records", "s1", [HumanMessage("hi"), AIMessage("hello")])
    await api("put_memory", "s1", "old L2", through=1)
    for through in (3, 10**6):
        with pytest.raises(InvalidInputError, match=f"through={through} is beyond the 2 record"):
            await api("put_memory", "s1", "new L2", through=through)
    assert await api("get_memory", "s1") == "old L2"
    assert await api("get_memory_through", "s1") == 1


async def test_through_up_to_l3_is_accepted(api: Api) -> None:
    await api("put_session", SessionMeta(id="s1", label="S1"))
    await api("put_memory", "s1", "empty", through=0)
    await api("append_records", "s1", [HumanMessage("hi"), AIMessage("hello")])
    await api("put_memory", "s1", "L2", through=2)
    await api("put_memory", "s1", "L2 again")  # the cursor is kept
    assert await api("get_memory_through", "s1") == 2


async def test_the_count_is_read_inside_the_write_transaction(api: Api) -> None:
    await api("put_session", SessionMeta(id="s1", label="S1"))
    async with api.transaction():
        await api("append_records", "s1", [HumanMessage("hi")])
        await api("put_memory", "s1", "L2", through=1)
    assert await api("get_memory_through", "s1") == 1


async def test_unknown_session(api: Api) -> None:
    with pytest.raises(SessionNotFoundError, match="'nope' does not exist"):
        await api("put_memory", "nope", "L2", through=1)
