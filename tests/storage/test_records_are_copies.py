"""`list_records` hands out copies: changing a returned message (its text, its tool calls,
its metadata, its content blocks) never changes what the storage holds, what the next read
returns, nor what the next prompt shows. Both backends, sync and async."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from stello_graph.models import SessionMeta
from tests.conftest import Api


def records() -> list[BaseMessage]:
    return [
        HumanMessage(content=[{"type": "text", "text": "look"}], id="h1"),
        AIMessage(
            content="",
            id="a1",
            tool_calls=[{"name": "find", "args": {"q": ["x"]}, "id": "c1"}],
            usage_metadata={"input_tokens": 3, "output_tokens": 2, "total_tokens": 5},
            response_metadata={"model": "m", "flags": ["a"]},
            additional_kwargs={"k": {"v": 1}},
        ),
        ToolMessage(content="found", tool_call_id="c1", id="t1", artifact={"rows": [1]}),
    ]


def vandalise(found: list[BaseMessage]) -> None:
    """Change everything a caller could change, in place."""
    human, ai, tool = found
    assert isinstance(human.content, list) and isinstance(human.content[0], dict)
    human.content[0]["text"] = "CHANGED"
    assert isinstance(ai, AIMessage) and ai.usage_metadata is not None
    ai.tool_calls[0]["args"]["q"].append("CHANGED")
    ai.tool_calls.append({"name": "x", "args": {}, "id": "c2"})
    ai.usage_metadata["input_tokens"] = 999
    ai.response_metadata["flags"].append("CHANGED")
    ai.additional_kwargs["k"]["v"] = 2
    ai.content = "CHANGED"
    assert isinstance(tool, ToolMessage)
    tool.artifact["rows"].append(2)
    found.append(HumanMessage("CHANGED"))


@pytest.mark.parametrize("page", [{}, {"offset": 0, "limit": 3}, {"role": None}])
async def test_changing_listed_records_changes_nothing_stored(
    api: Api, page: dict[str, Any]
) -> None:
    await api("put_session", SessionMeta(id="s1", label=""))
    await api("append_records", "s1", records())
    first = await api("list_records", "s1", **page)  # read once: the cache holds them now
    assert first == records()
    vandalise(first)
    assert await api("list_records", "s1") == records()
    assert await api("list_records", "s1", role="ai") == [records()[1]]


async def test_changing_one_read_does_not_change_another(api: Api) -> None:
    await api("put_session", SessionMeta(id="s1", label=""))
    await api("append_records", "s1", records())
    one, two = await api("list_records", "s1"), await api("list_records", "s1")
    vandalise(one)
    assert two == records()
