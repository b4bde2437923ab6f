"""Session semantics (DESIGN.md §3 "Session"), on every storage backend."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from stello_graph import (
    InvalidInputError,
    MainSession,
    ModelCallError,
    ModelNotConfiguredError,
    Session,
    SessionArchivedError,
    SessionNotFoundError,
    StreamNotFinishedError,
)
from stello_graph.storage import MainStorage
from stello_graph.testing import ScriptedChatModel


def system_text(prompt: list[BaseMessage]) -> str:
    assert isinstance(prompt[0], SystemMessage)
    assert not any(isinstance(m, SystemMessage) for m in prompt[1:])
    return prompt[0].text


def test_create_and_load(main_storage: MainStorage) -> None:
    s = Session.create(main_storage, label="Ideas", tags=["a", "b"], metadata={"k": 1})
    loaded = Session.load(s.id, main_storage)
    assert loaded.meta == s.meta
    assert loaded.meta.role == "standard"
    assert loaded.meta.status == "active"
    assert loaded.meta.tags == ("a", "b")
    assert loaded.meta.metadata == {"k": 1}


def test_load_missing_and_wrong_role(main_storage: MainStorage) -> None:
    with pytest.raises(SessionNotFoundError, match="'nope'"):
        Session.load("nope", main_storage)
    main = MainSession.create(main_storage)
    with pytest.raises(InvalidInputError, match=r"MainSession\.load"):
        Session.load(main.id, main_storage)


def test_send_one_call_and_records(main_storage: MainStorage) -> None:
    model = ScriptedChatModel(["Hello back."])
    s = Session.create(main_storage, model=model, label="Greeting")
    result = s.send("Hello")
    assert result.content == "Hello back."
    assert result.tool_calls == []
    assert result.usage is not None and result.usage["total_tokens"] > 0
    assert model.call_count == 1
    records = s.messages()
    assert [type(m) for m in records] == [HumanMessage, AIMessage]
    assert records[0].content == "Hello"
    assert main_storage.get_turn_count(s.id) == 1


def test_context_order(main_storage: MainStorage) -> None:
    model = ScriptedChatModel(["one", "two"])
    s = Session.create(main_storage, model=model, label="Pricing", system_prompt="SYS")
    s.send("first")
    s.set_insight("INSIGHT")
    s.send("second")
    prompt = model.prompts[1]
    text = system_text(prompt)
    assert text.index("SYS") < text.index("Pricing") < text.index("INSIGHT")
    assert [m.content for m in prompt[1:]] == ["first", "one", "second"]
    assert isinstance(prompt[-1], HumanMessage)


def test_identity_line_only_with_label(main_storage: MainStorage) -> None:
    model = ScriptedChatModel(["ok"])
    s = Session.create(main_storage, model=model, label="")
    s.send("hi")
    assert not isinstance(model.prompts[0][0], SystemMessage)


def test_insight_shown_once_after_success(main_storage: MainStorage) -> None:
    model = ScriptedChatModel(["a", "b"])
    s = Session.create(main_storage, model=model)
    s.set_insight("Look at costs.")
    assert s.insight() == "Look at costs."  # reading does not consume
    s.send("x")
    assert "Look at costs." in system_text(model.prompts[0])
    assert s.insight() is None
    s.send("y")
    assert "Look at costs." not in model.prompts[1][0].text


def test_failed_call_keeps_insight_and_l3(main_storage: MainStorage) -> None:
    model = ScriptedChatModel([RuntimeError("provider down"), "ok"])
    s = Session.create(main_storage, model=model)
    s.set_insight("keep me")
    with pytest.raises(ModelCallError, match="provider down") as info:
        s.send("x")
    assert isinstance(info.value.__cause__, RuntimeError)
    assert s.insight() == "keep me"
    assert s.messages() == []
    s.send("x")
    assert s.insight() is None
    assert "keep me" in model.prompts[1][0].text


def test_newer_insight_written_during_turn_is_kept(main_storage: MainStorage) -> None:
    s = Session.create(main_storage)

    def reply(_: list[BaseMessage]) -> str:
        main_storage.put_insight(s.id, "newer")
        return "done"

    s = Session.load(s.id, main_storage, model=ScriptedChatModel([reply]))
    s.set_insight("older")
    s.send("x")
    assert s.insight() == "newer"


def test_l2_never_shown_to_its_own_session(main_storage: MainStorage) -> None:
    model = ScriptedChatModel(
        [ScriptedChatModel.tool_call("lookup", {"q": "x"}), "final"],
    )
    s = Session.create(main_storage, model=model, label="L")
    main_storage.put_memory(s.id, "SECRET-L2")
    s.send("go")
    s.send_tool_results([ToolMessage(content="r", tool_call_id="call_1", name="lookup")])
    for prompt in model.prompts:
        assert all("SECRET-L2" not in m.text for m in prompt)


def test_json_looking_text_is_user_text(main_storage: MainStorage) -> None:
    model = ScriptedChatModel(["ok"])
    s = Session.create(main_storage, model=model)
    text = json.dumps({"toolResults": [{"toolCallId": "x", "success": True}]})
    s.send(text)
    records = s.messages()
    assert isinstance(records[0], HumanMessage)
    assert records[0].content == text
    assert model.prompts[0][-1].content == text


def test_tool_continuation(main_storage: MainStorage) -> None:
    model = ScriptedChatModel(
        [ScriptedChatModel.tool_call("add", {"a": 1, "b": 2}, id="c1"), "It is 3."]
    )
    s = Session.create(main_storage, model=model)
    first = s.send("1+2?")
    assert first.tool_calls[0]["name"] == "add"
    with pytest.raises(InvalidInputError, match="do not answer"):
        s.send_tool_results([ToolMessage(content="3", tool_call_id="wrong")])
    assert len(s.messages()) == 2
    second = s.send_tool_results(ToolMessage(content="3", tool_call_id="c1"))
    assert second.content == "It is 3."
    prompt = model.prompts[1]
    assert [type(m) for m in prompt] == [SystemMessage, HumanMessage, AIMessage, ToolMessage]
    assert [type(m) for m in s.messages()] == [HumanMessage, AIMessage, ToolMessage, AIMessage]
    assert main_storage.get_turn_count(s.id) == 1


def test_incomplete_tool_groups_are_sanitised(main_storage: MainStorage) -> None:
    model = ScriptedChatModel(["ok"])
    s = Session.create(main_storage, model=model)
    broken = AIMessage(content="", tool_calls=[{"name": "t", "args": {}, "id": "a"}])
    main_storage.append_records(
        s.id,
        [
            HumanMessage(content="q1"),
            broken,
            ToolMessage(content="orphan", tool_call_id="zzz"),
            AIMessage(content="a1"),
        ],
    )
    s.send("q2")
    assert [m.content for m in model.prompts[0][1:]] == ["q1", "a1", "q2"]


def test_stream_yields_text_then_result(main_storage: MainStorage) -> None:
    model = ScriptedChatModel(["The answer is forty two."])
    s = Session.create(main_storage, model=model)
    stream = s.stream("question")
    with pytest.raises(StreamNotFinishedError):
        _ = stream.result
    chunks = list(stream)
    assert len(chunks) > 1
    assert all(isinstance(c, str) for c in chunks)
    assert "".join(chunks) == stream.result.content == "The answer is forty two."
    assert [m.content for m in s.messages()] == ["question", "The answer is forty two."]


def test_stream_keeps_tool_calls(main_storage: MainStorage) -> None:
    model = ScriptedChatModel([ScriptedChatModel.tool_call("f", {"x": 1}, id="t1", content="Hm")])
    s = Session.create(main_storage, model=model)
    stream = s.stream("go")
    assert "".join(stream) == "Hm"
    assert stream.result.tool_calls[0]["args"] == {"x": 1}
    stored = s.messages()[1]
    assert isinstance(stored, AIMessage) and stored.tool_calls[0]["id"] == "t1"


def test_stream_closed_early_commits_nothing(main_storage: MainStorage) -> None:
    model = ScriptedChatModel(["many words in this reply"])
    s = Session.create(main_storage, model=model)
    s.set_insight("pending")
    stream = s.stream("x")
    next(stream)
    stream.close()
    assert s.messages() == []
    assert s.insight() == "pending"


async def test_async_send_and_stream(main_storage: MainStorage) -> None:
    model = ScriptedChatModel(["first reply", "second reply"])
    s = await Session.acreate(main_storage, model=model, label="A")
    await s.aset_insight("hint")
    result = await s.asend("one")
    assert result.content == "first reply"
    assert await s.ainsight() is None
    stream = s.astream("two")
    chunks = [c async for c in stream]
    assert "".join(chunks) == stream.result.content == "second reply"
    assert [m.content for m in await s.amessages()] == ["one", "first reply", "two", "second reply"]
    loaded = await Session.aload(s.id, main_storage)
    assert (await loaded.ameta()).label == "A"


async def test_async_stream_closed_early(main_storage: MainStorage) -> None:
    s = await Session.acreate(main_storage, model=ScriptedChatModel(["a b c d e"]))
    stream = s.astream("x")
    await anext(stream)
    await stream.aclose()
    assert await s.amessages() == []


Op = Callable[[Session], Any]
ARCHIVED_OPS: dict[str, Op] = {
    "send": lambda s: s.send("x"),
    "stream": lambda s: s.stream("x"),
    "send_tool_results": lambda s: s.send_tool_results(ToolMessage(content="", tool_call_id="i")),
    "consolidate": lambda s: s.consolidate(lambda cur, recs: "l2"),
    "fork": lambda s: s.fork("child"),
    "update_meta": lambda s: s.update_meta(label="new"),
    "set_system_prompt": lambda s: s.set_system_prompt("p"),
    "set_insight": lambda s: s.set_insight("i"),
}


@pytest.mark.parametrize("op", sorted(ARCHIVED_OPS))
def test_archived_session_refuses(main_storage: MainStorage, op: str) -> None:
    model = ScriptedChatModel(default="ok")
    s = Session.create(main_storage, model=model)
    # archived through another object: the session enforces it whatever path archived it
    Session.load(s.id, main_storage).archive()
    with pytest.raises(SessionArchivedError, match=s.id):
        ARCHIVED_OPS[op](s)
    assert model.call_count == 0
    assert s.meta.status == "archived"


async def test_archived_session_refuses_async(main_storage: MainStorage) -> None:
    s = await Session.acreate(main_storage, model=ScriptedChatModel(default="ok"))
    await s.aarchive()
    with pytest.raises(SessionArchivedError):
        await s.asend("x")
    with pytest.raises(SessionArchivedError):
        await anext(s.astream("x"))
    with pytest.raises(SessionArchivedError):
        await s.afork("c")


@pytest.mark.parametrize("bad", ["", "   \n\t", 42, None, b"bytes", "x" * 1_000_001, "a\ud800"])
def test_bad_content_is_refused(main_storage: MainStorage, bad: object) -> None:
    model = ScriptedChatModel(default="ok")
    s = Session.create(main_storage, model=model)
    with pytest.raises(InvalidInputError):
        s.send(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        s.stream(bad)  # type: ignore[arg-type]
    assert s.messages() == []
    assert model.call_count == 0


def test_no_model(main_storage: MainStorage) -> None:
    s = Session.create(main_storage)
    with pytest.raises(ModelNotConfiguredError, match="model="):
        s.send("hello")
    assert s.messages() == []


def test_messages_paging_role_and_copies(main_storage: MainStorage) -> None:
    model = ScriptedChatModel(["r1", "r2", "r3"])
    s = Session.create(main_storage, model=model)
    for text in ("q1", "q2", "q3"):
        s.send(text)
    assert [m.content for m in s.messages(role="user")] == ["q1", "q2", "q3"]
    assert [m.content for m in s.messages(role="assistant", offset=1)] == ["r2", "r3"]
    assert [m.content for m in s.messages(limit=2, offset=1)] == ["r1", "q2"]
    copy = s.messages()[0]
    copy.content = "changed"
    assert s.messages()[0].content == "q1"


def test_update_meta_and_system_prompt(main_storage: MainStorage) -> None:
    s = Session.create(main_storage, label="old", system_prompt="p1")
    before = s.meta.updated_at
    new = s.update_meta(label="new", tags=["t"], metadata={"a": [1, 2]})
    assert (new.label, new.tags, new.metadata) == ("new", ("t",), {"a": [1, 2]})
    assert new.updated_at >= before
    assert Session.load(s.id, main_storage).meta.label == "new"
    assert s.system_prompt() == "p1"
    s.set_system_prompt(None)
    assert s.system_prompt() is None
    with pytest.raises(InvalidInputError, match="tags"):
        s.update_meta(tags="not-a-list")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"label": 3}, "label must be a str"),
        ({"label": "a\nb"}, "control character"),
        ({"tags": ["ok", ""]}, "tag is empty"),
        ({"metadata": {"x": object()}}, "JSON"),
        ({"metadata": {1: "x"}}, "keys must be strings"),
        ({"id": ""}, "session id is empty"),
        ({"system_prompt": 5}, "system_prompt must be"),
    ],
)
def test_create_validates(main_storage: MainStorage, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        Session.create(main_storage, **kwargs)
    assert main_storage.list_sessions() == []


def test_sql_metacharacters_and_unicode_round_trip(main_storage: MainStorage) -> None:
    label = "Robert'); DROP TABLE sessions;-- 🌳 ∑ \u200b"
    s = Session.create(main_storage, label=label, tags=["' OR 1=1 --", "ünï"])
    loaded = Session.load(s.id, main_storage)
    assert loaded.meta.label == label
    assert loaded.meta.tags == ("' OR 1=1 --", "ünï")
