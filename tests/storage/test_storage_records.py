"""L3 records: order, paging, role filter, turn count, trim: both backends, sync and async."""

from __future__ import annotations

import pytest
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from stello_graph.models import SessionMeta
from tests.conftest import Api


def conversation(turns: int, start: int = 0) -> list[BaseMessage]:
    """`turns` pairs of (human, ai) messages numbered from `start`."""
    messages: list[BaseMessage] = []
    for n in range(start, start + turns):
        messages += [HumanMessage(f"q{n}"), AIMessage(f"a{n}")]
    return messages


def contents(messages: list[BaseMessage]) -> list[str]:
    return [str(message.content) for message in messages]


@pytest.fixture
async def session(api: Api) -> str:
    await api("put_session", SessionMeta(id="s1", label=""))
    return "s1"


async def test_append_returns_count_and_keeps_order(api: Api, session: str) -> None:
    assert await api("append_records", session, conversation(1)) == 2
    assert await api("append_records", session, []) == 2
    assert await api("append_records", session, conversation(2, start=1)) == 6
    assert contents(await api("list_records", session)) == [
        *("q0", "a0", "q1", "a1", "q2", "a2"),
    ]
    assert await api("count_records", session) == 6


async def test_user_turn_counts_one_turn_per_call(api: Api, session: str) -> None:
    await api("append_records", session, conversation(1), user_turn=True)
    await api("append_records", session, [ToolMessage("r", tool_call_id="c")])
    await api("append_records", session, conversation(1, start=1), user_turn=True)
    assert await api("get_turn_count", session) == 2
    assert await api("count_records", session) == 5


async def test_paging(api: Api, session: str) -> None:
    await api("append_records", session, conversation(5))  # q0 a0 ... q4 a4
    assert contents(await api("list_records", session, limit=3)) == ["q0", "a0", "q1"]
    assert contents(await api("list_records", session, offset=8)) == ["q4", "a4"]
    assert contents(await api("list_records", session, offset=2, limit=2)) == ["q1", "a1"]
    assert await api("list_records", session, limit=0) == []
    assert await api("list_records", session, offset=10) == []
    assert await api("list_records", session, offset=50, limit=5) == []


@pytest.mark.parametrize(
    ("role", "expected"),
    [
        ("human", ["q0", "q1"]),
        ("user", ["q0", "q1"]),
        ("ai", ["a0", "chunk", "a1"]),
        ("assistant", ["a0", "chunk", "a1"]),
        ("tool", ["tool"]),
        ("system", ["sys"]),
        (None, ["sys", "q0", "a0", "chunk", "tool", "q1", "a1"]),
    ],
)
async def test_role_filter(api: Api, session: str, role: str | None, expected: list[str]) -> None:
    await api(
        "append_records",
        session,
        [
            SystemMessage("sys"),
            HumanMessage("q0"),
            AIMessage("a0"),
            AIMessageChunk(content="chunk"),
            ToolMessage("tool", tool_call_id="c1"),
            HumanMessage("q1"),
            AIMessage("a1"),
        ],
    )
    assert contents(await api("list_records", session, role=role)) == expected


async def test_role_filter_then_paging(api: Api, session: str) -> None:
    await api("append_records", session, conversation(4))
    got = await api("list_records", session, role="ai", offset=1, limit=2)
    assert contents(got) == ["a1", "a2"]


async def test_returned_lists_are_fresh(api: Api, session: str) -> None:
    await api("append_records", session, conversation(2))
    first = await api("list_records", session)
    first.clear()
    assert len(await api("list_records", session)) == 4


async def test_stored_messages_do_not_follow_caller_mutations(api: Api, session: str) -> None:
    message = HumanMessage("original", additional_kwargs={"k": [1]})
    await api("append_records", session, [message])
    message.additional_kwargs["k"].append(2)
    assert await api("list_records", session) == [
        HumanMessage("original", additional_kwargs={"k": [1]})
    ]


async def test_trim_drops_oldest_and_moves_memory_cursor(api: Api, session: str) -> None:
    await api("append_records", session, conversation(5))
    await api("put_memory", session, "L2", through=3)
    assert await api("trim_records", session, 4) == 6
    assert contents(await api("list_records", session)) == ["q3", "a3", "q4", "a4"]
    assert await api("count_records", session) == 4
    assert await api("get_memory_through", session) == 0
    assert await api("trim_records", session, 4) == 0
    assert await api("trim_records", session, 10) == 0


async def test_trim_moves_cursor_back_by_dropped(api: Api, session: str) -> None:
    await api("append_records", session, conversation(5))
    await api("put_memory", session, "L2", through=8)
    assert await api("trim_records", session, 7) == 3
    assert await api("get_memory_through", session) == 5
    assert await api("get_memory", session) == "L2"


async def test_trim_everything_then_append_keeps_order(api: Api, session: str) -> None:
    await api("append_records", session, conversation(3), user_turn=True)
    assert await api("trim_records", session, 0) == 6
    assert await api("list_records", session) == []
    assert await api("get_turn_count", session) == 1  # turns are history, not records
    await api("append_records", session, conversation(1, start=7))
    await api("append_records", session, conversation(1, start=8))
    assert contents(await api("list_records", session)) == ["q7", "a7", "q8", "a8"]
    assert await api("trim_records", session, 1) == 3
    await api("append_records", session, conversation(1, start=9))
    assert contents(await api("list_records", session)) == ["a8", "q9", "a9"]


async def test_large_session_list_and_page(api: Api, session: str) -> None:
    for start in range(0, 300, 50):
        await api("append_records", session, conversation(50, start=start), user_turn=True)
    records = await api("list_records", session)
    assert len(records) == 600
    assert contents(records[-2:]) == ["q299", "a299"]
    assert contents(await api("list_records", session, offset=598)) == ["q299", "a299"]
    assert await api("get_turn_count", session) == 6


async def test_megabyte_message_round_trip(api: Api, session: str) -> None:
    text = ("中文 🎉 \x00 'quote' \"dq\" % _ \\ " * 40_000)[:1_000_000]
    big = AIMessage(text, tool_calls=[{"name": "f", "args": {"text": text[:1000]}, "id": "c1"}])
    await api("append_records", session, [HumanMessage(text), big])
    assert await api("list_records", session) == [HumanMessage(text), big]
    assert await api("list_records", session, role="ai", limit=1) == [big]


async def test_appending_records_moves_updated_at(api: Api, session: str) -> None:
    before = await api("get_session", session)
    await api("append_records", session, [])
    assert await api("get_session", session) == before
    await api("append_records", session, conversation(1), user_turn=True)
    after = await api("get_session", session)
    assert after.updated_at > before.updated_at
    assert after.model_copy(update={"updated_at": before.updated_at}) == before
