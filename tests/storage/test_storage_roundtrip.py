"""Property tests: whatever goes into a storage comes back equal, in both backends."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    message_to_dict,
)
from langchain_core.messages.tool import ToolCall

from stello_graph.checkpoints._serde import TURN_ID, TURN_SEQ, decode_message, encode_message
from stello_graph.models import SessionMeta
from stello_graph.storage import MainStorage

_ids = itertools.count()

FIXTURE_SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

NASTY = "\x00\x01'\";%_\\\n\u00e9\u4e2d\U0001f389\u202e\ufeff"
texts = st.text() | st.text(st.sampled_from(NASTY))  # no lone surrogates: not unicode text
big_texts = st.builds(
    lambda piece, size: (piece * (size // len(piece) + 1))[:size],
    st.text(min_size=1, max_size=64),
    st.sampled_from([10_000, 300_000, 1_000_000]),
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(texts, children, max_size=4),
    max_leaves=12,
)
json_dicts = st.dictionaries(texts, json_values, max_size=4)
# a record's turn marks are the storage's columns, not a message's metadata (`encode_message`
# leaves them out); Hypothesis draws keys from the code's own constants, so keep them out
metadata_dicts = st.dictionaries(
    texts.filter(lambda key: key not in (TURN_ID, TURN_SEQ)), json_values, max_size=4
)
tool_calls = st.builds(
    lambda name, args, call_id: ToolCall(name=name, args=args, id=call_id, type="tool_call"),
    st.text(min_size=1, max_size=20),
    json_dicts,
    st.text(min_size=1, max_size=20),
)
messages: st.SearchStrategy[BaseMessage] = st.one_of(
    st.builds(
        lambda content, kwargs, msg_id: HumanMessage(content, additional_kwargs=kwargs, id=msg_id),
        texts | big_texts,
        json_dicts,
        st.none() | st.text(max_size=10),
    ),
    st.builds(
        lambda content, calls, meta: AIMessage(content, tool_calls=calls, response_metadata=meta),
        texts,
        st.lists(tool_calls, max_size=3),
        metadata_dicts,
    ),
    st.builds(
        lambda content, msg_id, name, tokens, example: AIMessage(
            content,
            id=msg_id,
            name=name,
            example=example,
            usage_metadata=None
            if tokens is None
            else {"input_tokens": tokens, "output_tokens": 1, "total_tokens": tokens + 1},
        ),
        texts,
        st.none() | st.text(max_size=10),
        st.none() | st.text(max_size=10),
        st.none() | st.integers(min_value=0, max_value=10**6),
        st.booleans(),
    ),
    st.builds(
        lambda blocks: HumanMessage([{"type": "text", "text": text} for text in blocks]),
        st.lists(texts, min_size=1, max_size=3),
    ),
    st.builds(
        lambda content, call_id, status, artifact: ToolMessage(
            content, tool_call_id=call_id, status=status, artifact=artifact
        ),
        texts,
        st.text(min_size=1, max_size=20),
        st.sampled_from(["success", "error"]),
        json_values,
    ),
    st.builds(SystemMessage, texts),
)
metas = st.builds(
    lambda label, tags, metadata, created, status, role: SessionMeta(
        id=f"meta-{next(_ids)}",
        label=label,
        tags=tuple(tags),
        metadata=metadata,
        created_at=created,
        updated_at=created,
        status=status,
        role=role,
    ),
    texts,
    st.lists(texts, max_size=4),
    json_dicts,
    st.datetimes(
        min_value=datetime(1970, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
    ),
    st.sampled_from(["active", "archived"]),
    st.sampled_from(["standard", "main"]),
)


@FIXTURE_SETTINGS
@given(batch=st.lists(messages, min_size=1, max_size=5))
def test_messages_round_trip(main_storage: MainStorage, batch: list[BaseMessage]) -> None:
    session_id = f"records-{next(_ids)}"
    main_storage.put_session(SessionMeta(id=session_id, label=""))
    main_storage.append_records(session_id, batch[:1])
    main_storage.list_records(session_id)  # cached in SQLite: appends must keep it exact
    main_storage.append_records(session_id, batch[1:])
    assert main_storage.list_records(session_id) == batch
    assert main_storage.count_records(session_id) == len(batch)


@settings(max_examples=200, deadline=None)
@given(message=messages)
def test_message_codec_round_trips_and_reads_full_records(message: BaseMessage) -> None:
    role, data = encode_message(message)
    assert decode_message(data) == message
    assert type(decode_message(data)) is type(message)
    assert role == message.type
    # records written in LangChain's full format (before defaults were left out) still read
    assert decode_message(json.dumps(message_to_dict(message))) == message


@pytest.mark.parametrize(
    "message",
    [
        # tool calls only in the content blocks, or only in the provider's raw kwargs: the
        # empty `tool_calls` left out must not make decoding parse them into `tool_calls`
        AIMessage([{"type": "tool_call", "name": "t", "args": {}, "id": "c1"}]),
        AIMessage("", additional_kwargs={"tool_calls": [{"id": "c1", "type": "function"}]}),
        AIMessageChunk(content="", tool_call_chunks=[]),
    ],
)
def test_tool_call_lists_left_out_come_back_alike(message: BaseMessage) -> None:
    assert decode_message(encode_message(message)[1]) == message


def test_records_are_stored_compact() -> None:
    assert encode_message(HumanMessage("hi", id="m1"))[1] == '{"t":"h","c":"hi","i":"m1"}'
    tool = ToolMessage("out", tool_call_id="c1", status="error", name="t")
    assert json.loads(encode_message(tool)[1]) == {
        "t": "t", "c": "out", "n": "t", "ti": "c1", "s": "error"
    }  # fmt: skip
    reply = AIMessage(
        "",
        id="r1",
        response_metadata={"model_name": "m1", "finish_reason": "stop", "x": 1},
        tool_calls=[{"name": "look", "args": {"q": 1}, "id": "c1"}],
        usage_metadata={"input_tokens": 120, "output_tokens": 10, "total_tokens": 130},
    )
    assert json.loads(encode_message(reply)[1]) == {
        "t": "a", "c": "", "r": {"m": "m1", "f": "stop", "x": 1}, "i": "r1",
        "tc": [["look", {"q": 1}, "c1"]], "u": [120, 10],
    }  # fmt: skip
    assert decode_message(encode_message(reply)[1]) == reply


@pytest.mark.parametrize(
    "message",
    [
        # usage with details, or a total that is not the sum: kept as it is
        AIMessage("x", usage_metadata={"input_tokens": 1, "output_tokens": 2, "total_tokens": 4}),
        AIMessage(
            "x",
            usage_metadata={
                "input_tokens": 5,
                "output_tokens": 2,
                "total_tokens": 7,
                "input_token_details": {"cache_read": 3},
            },
        ),
        # extra fields named like the compact keys: the message is stored in the full form
        HumanMessage("x", c="extra", t="more"),
        HumanMessage("x", data={"type": "human"}),
        AIMessage("x", response_metadata={"m": "short", "model_name": "long"}),
    ],
)
def test_unusual_records_round_trip(message: BaseMessage) -> None:
    assert decode_message(encode_message(message)[1]) == message


def test_records_stored_in_earlier_forms_still_read() -> None:
    earlier = '{"type":"human","data":{"content":"hi","id":"m1"}}'  # defaults left out
    assert decode_message(earlier) == HumanMessage("hi", id="m1")
    reply = AIMessage("a", id="r", tool_calls=[{"name": "t", "args": {}, "id": "c"}])
    assert decode_message(json.dumps(message_to_dict(reply))) == reply  # LangChain's own


@FIXTURE_SETTINGS
@given(meta=metas, prompt=texts, insight=texts, memory=texts | big_texts)
def test_session_values_round_trip(
    main_storage: MainStorage, meta: SessionMeta, prompt: str, insight: str, memory: str
) -> None:
    main_storage.put_session(meta)
    main_storage.put_system_prompt(meta.id, prompt)
    main_storage.put_insight(meta.id, insight)
    main_storage.put_memory(meta.id, memory, through=0)  # the session has no records
    assert main_storage.get_session(meta.id) == meta
    assert main_storage.get_system_prompt(meta.id) == prompt
    assert main_storage.get_insight(meta.id) == insight
    assert main_storage.get_memory(meta.id) == memory
    if meta.tags:
        assert meta.id in {found.id for found in main_storage.list_sessions(tags=meta.tags)}


@FIXTURE_SETTINGS
@given(key=st.text(min_size=1), value=json_values)
def test_globals_round_trip(main_storage: MainStorage, key: str, value: Any) -> None:
    main_storage.put_global(key, value)
    assert main_storage.get_global(key) == value
