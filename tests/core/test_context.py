"""`sanitize_history` against its definition, on random histories."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from stello_graph._context import sanitize_history

ids = st.sampled_from(["c1", "c2", "c3", None])
records = st.lists(
    st.one_of(
        st.builds(HumanMessage, st.just("h")),
        st.builds(AIMessage, st.just("a")),
        st.builds(
            lambda calls: AIMessage(
                "", tool_calls=[{"name": "t", "args": {}, "id": c} for c in calls]
            ),
            st.lists(ids, min_size=1, max_size=3),
        ),
        st.builds(lambda c: ToolMessage("r", tool_call_id=c or "c4"), ids),
    ),
    max_size=14,
)


def by_definition(records: Sequence[BaseMessage]) -> list[BaseMessage]:
    """Keep an assistant message with tool calls only with all its results right after it."""
    out: list[BaseMessage] = []
    i = 0
    while i < len(records):
        msg = records[i]
        if isinstance(msg, AIMessage) and msg.tool_calls:
            j = i + 1
            while j < len(records) and isinstance(records[j], ToolMessage):
                j += 1
            results = [r for r in records[i + 1 : j] if isinstance(r, ToolMessage)]
            wanted = {call.get("id") for call in msg.tool_calls}
            if None not in wanted and wanted <= {r.tool_call_id for r in results}:
                out += [msg, *(r for r in results if r.tool_call_id in wanted)]
            i = j
            continue
        if not isinstance(msg, ToolMessage):
            out.append(msg)
        i += 1
    return out


@settings(max_examples=500, deadline=None)
@given(history=records)
def test_sanitize_history_keeps_exactly_the_complete_groups(history: list[BaseMessage]) -> None:
    assert [id(m) for m in sanitize_history(history)] == [id(m) for m in by_definition(history)]
