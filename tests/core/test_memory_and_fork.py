"""consolidate, fork and archive semantics on every backend."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from stello_graph import (
    ConsolidationError,
    DuplicateSessionError,
    FunctionNotConfiguredError,
    InvalidInputError,
    MainSession,
    Session,
    SessionArchivedError,
    llm_consolidator,
)
from stello_graph._fork import ForkRequest, fork_session
from stello_graph.models import TopologyNode
from stello_graph.storage import MainStorage
from stello_graph.testing import ScriptedChatModel


class Recorder:
    """A consolidate function that records what it was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[str | None, list[str]]] = []

    def __call__(self, current: str | None, records: list[BaseMessage]) -> str:
        self.calls.append((current, [m.text for m in records]))
        return f"L2 v{len(self.calls)}"


def test_consolidate_is_incremental_and_idempotent(main_storage: MainStorage) -> None:
    model = ScriptedChatModel(["a1", "a2"])
    fn = Recorder()
    s = Session.create(main_storage, model=model, consolidate_fn=fn)
    assert s.consolidate() is None  # nothing to consolidate
    assert fn.calls == []
    s.send("q1")
    assert s.consolidate() == "L2 v1"
    assert s.consolidate() == "L2 v1"  # idempotent: no new records, no call
    s.send("q2")
    assert s.consolidate() == "L2 v2"
    assert fn.calls == [(None, ["q1", "a1"]), ("L2 v1", ["q2", "a2"])]
    assert s.memory() == "L2 v2"
    assert main_storage.get_memory_through(s.id) == 4


def test_consolidate_errors(main_storage: MainStorage) -> None:
    s = Session.create(main_storage, model=ScriptedChatModel(["a"]))
    s.send("q")
    with pytest.raises(FunctionNotConfiguredError, match="consolidate_fn"):
        s.consolidate()

    def boom(current: str | None, records: list[BaseMessage]) -> str:
        raise ValueError("bad summary")

    with pytest.raises(ConsolidationError, match="bad summary"):
        s.consolidate(boom)
    with pytest.raises(ConsolidationError, match="expected str"):
        s.consolidate(lambda c, r: 42)  # type: ignore[arg-type]
    with pytest.raises(ConsolidationError, match="empty"):
        s.consolidate(lambda c, r: "  ")
    assert s.memory() is None
    assert main_storage.get_memory_through(s.id) == 0


def test_async_fn_from_sync_and_sync_fn_from_async(main_storage: MainStorage) -> None:
    s = Session.create(main_storage, model=ScriptedChatModel(["a"]))
    s.send("q")

    async def summarise(current: str | None, records: list[BaseMessage]) -> str:
        return f"async summary of {len(records)}"

    assert s.consolidate(summarise) == "async summary of 2"


async def test_aconsolidate(main_storage: MainStorage) -> None:
    s = await Session.acreate(main_storage, model=ScriptedChatModel(["a", "b"]))
    await s.asend("q")
    fn = Recorder()
    assert await s.aconsolidate(fn) == "L2 v1"
    await s.asend("q2")

    async def summarise(current: str | None, records: list[BaseMessage]) -> str:
        return f"{current} + {len(records)}"

    assert await s.aconsolidate(summarise) == "L2 v1 + 2"


def test_llm_consolidator(main_storage: MainStorage) -> None:
    summariser = ScriptedChatModel(["<think>hmm, let me see</think>\nUser likes green tea."])
    s = Session.create(
        main_storage,
        model=ScriptedChatModel(["Green tea it is."]),
        consolidate_fn=llm_consolidator(summariser),
    )
    s.send("I like green tea")
    assert s.consolidate() == "User likes green tea."
    prompt = summariser.prompts[0]
    assert "I like green tea" in prompt[-1].text
    assert "Green tea it is." in prompt[-1].text


async def test_llm_consolidator_async(main_storage: MainStorage) -> None:
    summariser = ScriptedChatModel(["Summary."])
    s = await Session.acreate(main_storage, model=ScriptedChatModel(["r"]))
    await s.asend("q")
    assert await s.aconsolidate(llm_consolidator(summariser)) == "Summary."


def test_fork_context_modes(main_storage: MainStorage) -> None:
    model = ScriptedChatModel(["a1", "a2"])
    parent = Session.create(main_storage, model=model, system_prompt="PARENT")
    parent.send("q1")
    parent.send("q2")
    main_storage.put_memory(parent.id, "parent L2")
    main_storage.put_insight(parent.id, "parent insight")

    none = parent.fork("none")
    assert none.messages() == []
    assert none.system_prompt() == "PARENT"
    inherit = parent.fork("inherit", context="inherit", prompt="Let's dig in.")
    assert [m.text for m in inherit.messages()] == ["q1", "a1", "q2", "a2", "Let's dig in."]
    assert isinstance(inherit.messages()[-1], AIMessage)
    picked = parent.fork("last two", context=lambda records: records[-2:], system_prompt="OWN")
    assert [m.text for m in picked.messages()] == ["q2", "a2"]
    assert picked.system_prompt() == "OWN"
    for child in (none, inherit, picked):
        assert child.memory() is None
        assert child.insight() is None
        assert child.meta.role == "standard"
    # the parent is unchanged
    assert len(parent.messages()) == 4
    assert parent.insight() == "parent insight"


def test_fork_drops_incomplete_tool_groups(main_storage: MainStorage) -> None:
    parent = Session.create(main_storage)
    main_storage.append_records(
        parent.id,
        [
            HumanMessage(content="q"),
            AIMessage(content="", tool_calls=[{"name": "t", "args": {}, "id": "x"}]),
        ],
    )
    child = parent.fork("c", context="inherit")
    assert [m.text for m in child.messages()] == ["q"]


async def test_afork_with_async_context_fn(main_storage: MainStorage) -> None:
    parent = await Session.acreate(main_storage, model=ScriptedChatModel(["a"]))
    await parent.asend("q")

    async def first(records: list[BaseMessage]) -> list[BaseMessage]:
        return records[:1]

    child = await parent.afork("c", context=first, tags=["x"])
    assert [m.text for m in await child.amessages()] == ["q"]
    assert (await child.ameta()).tags == ("x",)
    assert child.model is parent.model


def test_fork_writes_node_under_parent_node(main_storage: MainStorage) -> None:
    main = MainSession.create(main_storage)
    branch_meta = fork_session(main_storage, ForkRequest.build(main.id, "Branch"))
    assert main_storage.get_node(branch_meta.id) == TopologyNode(
        id=branch_meta.id, parent_id=main.id, label="Branch"
    )
    branch = Session.load(branch_meta.id, main_storage)
    leaf = branch.fork("Leaf")
    assert main_storage.get_node(leaf.id) == TopologyNode(
        id=leaf.id, parent_id=branch.id, label="Leaf"
    )
    # a session outside the tree: see test_fork_outside_the_tree.py


def test_fork_from_main_does_not_inherit_prompt_unless_asked(main_storage: MainStorage) -> None:
    main = MainSession.create(main_storage, system_prompt="MAIN PROMPT")
    plain = fork_session(main_storage, ForkRequest.build(main.id, "a"))
    assert main_storage.get_system_prompt(plain.id) is None
    asked = fork_session(main_storage, ForkRequest.build(main.id, "b", inherit_system_prompt=True))
    assert main_storage.get_system_prompt(asked.id) == "MAIN PROMPT"


def test_fork_duplicate_id_writes_nothing(main_storage: MainStorage) -> None:
    parent = Session.create(main_storage, id="p")
    parent.fork("first", id="child")
    with pytest.raises(DuplicateSessionError, match="'child'"):
        parent.fork("second", id="child", context="inherit")
    assert main_storage.get_session("child") is not None
    assert main_storage.get_session("child").label == "first"  # type: ignore[union-attr]


def test_fork_is_atomic_with_its_node(main_storage: MainStorage, monkeypatch: Any) -> None:
    main = MainSession.create(main_storage)

    def fail(node: TopologyNode) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(main_storage, "put_node", fail)
    with pytest.raises(RuntimeError, match="disk full"):
        fork_session(main_storage, ForkRequest.build(main.id, "doomed", system_prompt="p"))
    assert [m.id for m in main_storage.list_sessions()] == [main.id]


def test_fork_validates(main_storage: MainStorage) -> None:
    parent = Session.create(main_storage)
    with pytest.raises(InvalidInputError, match="context"):
        parent.fork("x", context="everything")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="list of messages"):
        parent.fork("x", context=lambda r: "nope")
    assert len(main_storage.list_sessions()) == 1


def test_archive_is_idempotent_and_listed(main_storage: MainStorage) -> None:
    s = Session.create(main_storage)
    first = s.archive()
    second = s.archive()
    assert first.status == second.status == "archived"
    assert [m.id for m in main_storage.list_sessions(status="archived")] == [s.id]
    with pytest.raises(SessionArchivedError, match="fork"):
        s.fork("x")


def test_send_tool_results_validates(main_storage: MainStorage) -> None:
    s = Session.create(main_storage, model=ScriptedChatModel(default="ok"))
    with pytest.raises(InvalidInputError, match="ToolMessage"):
        s.send_tool_results([])
    with pytest.raises(InvalidInputError, match="ToolMessage"):
        s.send_tool_results(["text"])  # type: ignore[list-item]
    with pytest.raises(InvalidInputError, match="do not answer"):
        s.send_tool_results(ToolMessage(content="x", tool_call_id="none-open"))
