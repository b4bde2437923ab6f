"""What the core hands to code outside it (a caller of `list_records` / `messages`, a
consolidate or compress function) is a copy: changing it never changes the next prompt."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from stello_graph import Session
from stello_graph.compression import CompressionPolicy
from stello_graph.storage import MainStorage
from stello_graph.testing import ScriptedChatModel


def _vandalise(found: list[BaseMessage]) -> None:
    for message in found:
        message.content = "CHANGED"
        message.additional_kwargs["changed"] = True


def _history(model: ScriptedChatModel) -> list[str]:
    return [m.text for m in model.prompts[-1][1:-1]]  # between system message and new input


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_changing_listed_records_does_not_change_the_next_prompt(
    main_storage: MainStorage, mode: str
) -> None:
    model = ScriptedChatModel(default="ok")
    s = Session.create(main_storage, model=model, label="S")
    s.send("first")  # the records are in the storage's cache from now on
    if mode == "sync":
        _vandalise(main_storage.list_records(s.id))
        _vandalise(s.messages())
    else:
        _vandalise(await main_storage.alist_records(s.id))
        _vandalise(await s.amessages())
    s.send("second")
    assert _history(model) == ["first", "ok"]
    assert not any(m.additional_kwargs for m in model.prompts[-1])


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_consolidate_function_changing_its_records_changes_nothing(
    main_storage: MainStorage, mode: str
) -> None:
    model = ScriptedChatModel(default="ok")
    s = Session.create(main_storage, model=model, label="S")
    s.send("first")

    def consolidate(current: str | None, records: list[BaseMessage]) -> str:
        _vandalise(records)
        return "summary"

    if mode == "sync":
        s.consolidate(consolidate)
    else:
        await s.aconsolidate(consolidate)
    s.send("second")
    assert _history(model) == ["first", "ok"]


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_compress_function_changing_its_records_changes_nothing(
    main_storage: MainStorage, mode: str
) -> None:
    seen: list[str] = []

    def compress(previous: str | None, records: list[BaseMessage]) -> str:
        seen.extend(m.text for m in records)
        _vandalise(records)
        return "summary"

    policy = CompressionPolicy(context_window=1000, threshold=0.5, compress_fn=compress)
    model = ScriptedChatModel(default="ok")
    s = Session.create(main_storage, model=model, label="S", compression=policy)
    main_storage.append_records(s.id, [HumanMessage("q" * 400), AIMessage("a" * 400)] * 4)
    main_storage.list_records(s.id)  # in the cache
    if mode == "sync":
        s.send("go")
    else:
        await s.asend("go")
    assert seen and "CHANGED" not in seen
    assert "CHANGED" not in [m.text for m in main_storage.list_records(s.id)]
    assert [m.text for m in main_storage.list_records(s.id)][:2] == ["q" * 400, "a" * 400]
