"""`sanitize_history` against its definition, and `SanitizedHistory` against both."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from stello_graph._context import SanitizedHistory, sanitize_history

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


def _with_ids(history: list[BaseMessage], count: itertools.count[int]) -> list[BaseMessage]:
    """Copies with ids unique over the test, as L3 gives its records."""
    return [m.model_copy(update={"id": f"m{next(count)}"}) for m in history]


@settings(max_examples=300, deadline=None)
@given(
    chunks=st.lists(records, min_size=1, max_size=6),
    trims=st.lists(st.integers(min_value=0, max_value=4), min_size=6, max_size=6),
    repeat=st.booleans(),
)
def test_sanitized_history_equals_sanitizing_the_whole_history_each_time(
    chunks: list[list[BaseMessage]], trims: list[int], repeat: bool
) -> None:
    """Histories grow by random chunks (open tool groups closed by a later chunk included),
    sometimes lose their oldest records, and are sometimes read twice in a row."""
    memo, count = SanitizedHistory(), itertools.count()
    history: list[BaseMessage] = []
    for chunk, trim in zip(chunks, trims, strict=False):
        history = history[trim:] + _with_ids(chunk, count)
        for _ in range(2 if repeat else 1):
            got = memo(history)
            assert [m.id for m in got] == [m.id for m in by_definition(history)]


def test_sanitized_history_recomputes_for_records_without_ids() -> None:
    memo = SanitizedHistory()
    call = AIMessage("", tool_calls=[{"name": "t", "args": {}, "id": "c1"}], id="a1")
    opened = [HumanMessage("h", id="h1"), call]
    assert memo(opened) == (opened[0],)  # the open group is left out
    closed = [*opened, ToolMessage("r", tool_call_id="c1")]  # the result has no id
    assert memo(closed) == tuple(closed)
    assert memo([]) == ()
