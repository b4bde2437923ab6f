"""Text the user did not send (a model's reply, a tool's result, what a consolidate,
integrate or compress function returned) may hold a lone surrogate ("\\ud800", e.g. from a
provider that split a UTF-16 pair): it is stored with U+FFFD in its place, and the turn or
the memory operation goes on. Text the user sent with one is still refused."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from stello_graph import IntegrationResult, InvalidInputError, MainSession, Session
from stello_graph.compression import CompressionPolicy
from stello_graph.storage import MainStorage
from stello_graph.testing import ScriptedChatModel

BAD = "half \ud83d of a pair"
FIXED = "half \ufffd of a pair"
PAIR = "a smile \ud83d\ude00 in two halves"  # a whole pair, split in two code points


def _texts(storage: MainStorage, session_id: str) -> list[str]:
    return [m.text for m in storage.list_records(session_id)]


async def _send(s: Session, mode: str, text: str) -> str:
    result = s.send(text) if mode == "sync" else await s.asend(text)
    return result.content


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_reply_with_a_lone_surrogate_is_stored_with_a_replacement(
    main_storage: MainStorage, mode: str
) -> None:
    s = Session.create(main_storage, model=ScriptedChatModel([BAD, PAIR]))
    assert await _send(s, mode, "first") == FIXED
    assert await _send(s, mode, "second") == "a smile \U0001f600 in two halves"
    assert _texts(main_storage, s.id) == [
        "first",
        FIXED,
        "second",
        "a smile \U0001f600 in two halves",
    ]


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_streamed_reply_with_a_lone_surrogate_is_stored(
    main_storage: MainStorage, mode: str
) -> None:
    s = Session.create(main_storage, model=ScriptedChatModel([BAD], chunk_size=3))
    if mode == "sync":
        stream = s.stream("hi")
        "".join(stream)
    else:
        astream = s.astream("hi")
        "".join([chunk async for chunk in astream])
    assert _texts(main_storage, s.id) == ["hi", FIXED]


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_tool_calls_and_results_with_lone_surrogates_are_stored(
    main_storage: MainStorage, mode: str
) -> None:
    call = ScriptedChatModel.tool_call("look", {"q": BAD}, id="c1", content=BAD)
    s = Session.create(main_storage, model=ScriptedChatModel([call, "done"]))
    await _send(s, mode, "look it up")
    result = ToolMessage(content=BAD, tool_call_id="c1", artifact={"raw": BAD})
    if mode == "sync":
        s.send_tool_results([result])
    else:
        await s.asend_tool_results([result])
    reply, tool = main_storage.list_records(s.id)[1:3]
    assert isinstance(reply, AIMessage) and reply.tool_calls[0]["args"] == {"q": FIXED}
    assert reply.text == FIXED
    assert isinstance(tool, ToolMessage) and (tool.text, tool.artifact) == (FIXED, {"raw": FIXED})


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_memory_functions_returning_lone_surrogates_are_stored(
    main_storage: MainStorage, mode: str
) -> None:
    main = MainSession.create(main_storage)
    s = Session.create(main_storage)
    main_storage.append_records(s.id, [HumanMessage("x"), AIMessage("y")])

    def consolidate(current: str | None, records: list[BaseMessage]) -> str:
        return BAD

    def integrate(children: Any, current: str | None) -> IntegrationResult:
        return IntegrationResult(synthesis=BAD, insights={s.id: BAD})

    if mode == "sync":
        assert s.consolidate(consolidate) == FIXED
        result = main.integrate(integrate)
    else:
        assert await s.aconsolidate(consolidate) == FIXED
        result = await main.aintegrate(integrate)
    assert result == IntegrationResult(synthesis=FIXED, insights={s.id: FIXED})
    assert (s.memory(), main.synthesis(), s.insight()) == (FIXED, FIXED, FIXED)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_compress_functions_returning_lone_surrogates_are_stored(
    main_storage: MainStorage, mode: str
) -> None:
    def compress(previous: str | None, records: list[BaseMessage]) -> str:
        return BAD

    policy = CompressionPolicy(context_window=1000, threshold=0.5, compress_fn=compress)
    s = Session.create(main_storage, model=ScriptedChatModel(default="ok"), compression=policy)
    main_storage.append_records(s.id, [HumanMessage("q" * 400), AIMessage("a" * 400)] * 4)
    await _send(s, mode, "go on")
    stored = main_storage.get_compression(s.id)
    assert stored is not None and stored.summary == FIXED
    child = (
        s.fork("C", context="compress", compress_fn=compress)
        if mode == "sync"
        else await s.afork("C", context="compress", compress_fn=compress)
    )
    forked = main_storage.get_compression(child.id)
    assert forked is not None and forked.summary == FIXED


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_user_text_with_a_lone_surrogate_is_still_refused(
    main_storage: MainStorage, mode: str
) -> None:
    s = Session.create(main_storage, model=ScriptedChatModel(default="ok"))
    with pytest.raises(InvalidInputError, match="surrogate"):
        await _send(s, mode, BAD)
    assert main_storage.list_records(s.id) == []
