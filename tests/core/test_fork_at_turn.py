"""`Session.fork(..., at_turn=N)`: the child starts from the end of an earlier user turn.

On every storage backend, sync and async: the bounds of `at_turn` (1-based, negative from
the end, typed errors and nothing written otherwise), whole tool-call groups, the turns the
copied records keep, the lineage stored, and L2 / insight never inherited.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from stello_graph import ForkPoint, Session
from stello_graph.errors import InvalidInputError, TurnOutOfRangeError
from stello_graph.storage import MainStorage
from stello_graph.testing import ScriptedChatModel

pytestmark = pytest.mark.parametrize("mode", ["sync", "async"])


def _turn(n: int, *, tool: bool = False) -> list[BaseMessage]:
    """User turn `n`: a question and its answer, with a tool call in between if asked."""
    records: list[BaseMessage] = [HumanMessage(f"q{n}")]
    if tool:
        call = {"name": "look", "args": {"n": n}, "id": f"call-{n}"}
        records += [
            AIMessage("", tool_calls=[call]),
            ToolMessage(f"r{n}", tool_call_id=f"call-{n}"),
        ]
    return [*records, AIMessage(f"a{n}")]


def _source(storage: MainStorage, turns: int = 4, *, tool_at: int | None = None) -> Session:
    session = Session.create(storage, label="Source", model=ScriptedChatModel(default="ok"))
    for n in range(1, turns + 1):
        storage.append_records(session.id, _turn(n, tool=n == tool_at), user_turn=True)
    return session


async def _fork(mode: str, session: Session, label: str, **options: Any) -> Session:
    if mode == "sync":
        return session.fork(label, **options)
    return await session.afork(label, **options)


def _contents(session: Session) -> list[str]:
    return [str(m.content) or f"<{m.type}>" for m in session.messages()]


@pytest.mark.parametrize(
    ("at_turn", "expected"),
    [
        (1, ["q1", "a1"]),
        (2, ["q1", "a1", "q2", "a2"]),
        (4, ["q1", "a1", "q2", "a2", "q3", "a3", "q4", "a4"]),
        (-1, ["q1", "a1", "q2", "a2", "q3", "a3", "q4", "a4"]),
        (-3, ["q1", "a1", "q2", "a2"]),
        (-4, ["q1", "a1"]),
    ],
)
async def test_the_child_starts_at_the_end_of_the_turn(
    main_storage: MainStorage, mode: str, at_turn: int, expected: list[str]
) -> None:
    source = _source(main_storage)
    child = await _fork(mode, source, "Child", context="inherit", at_turn=at_turn)
    assert _contents(child) == expected
    turn = at_turn if at_turn > 0 else 5 + at_turn
    assert main_storage.get_lineage(child.id) == ForkPoint(child.id, source.id, turn)


@pytest.mark.parametrize("at_turn", [5, 9, -5, -100])
async def test_a_turn_out_of_range_is_refused_and_nothing_is_written(
    main_storage: MainStorage, mode: str, at_turn: int
) -> None:
    source = _source(main_storage)
    before = main_storage.list_sessions()
    with pytest.raises(TurnOutOfRangeError, match=r"4 user turn\(s\)") as caught:
        await _fork(mode, source, "Child", context="inherit", at_turn=at_turn)
    assert (caught.value.at_turn, caught.value.turns) == (at_turn, 4)
    assert isinstance(caught.value, InvalidInputError)
    assert main_storage.list_sessions() == before


@pytest.mark.parametrize(
    ("at_turn", "message"),
    [
        (0, "at_turn=0 names no turn"),
        (True, "at_turn must be an int"),
        (1.0, "at_turn must be an int"),
        ("2", "at_turn must be an int"),
    ],
)
async def test_a_bad_at_turn_is_a_typed_error(
    main_storage: MainStorage, mode: str, at_turn: object, message: str
) -> None:
    source = _source(main_storage)
    before = main_storage.list_sessions()
    with pytest.raises(InvalidInputError, match=message):
        await _fork(mode, source, "Child", context="inherit", at_turn=at_turn)
    assert main_storage.list_sessions() == before


async def test_at_turn_needs_a_context_that_inherits(main_storage: MainStorage, mode: str) -> None:
    source = _source(main_storage)
    with pytest.raises(InvalidInputError, match="context='none' inherits nothing"):
        await _fork(mode, source, "Child", at_turn=1)


async def test_a_source_without_user_turns_has_no_turn_to_start_from(
    main_storage: MainStorage, mode: str
) -> None:
    source = _source(main_storage, turns=0)
    with pytest.raises(TurnOutOfRangeError, match="it has no user turn yet"):
        await _fork(mode, source, "Child", context="inherit", at_turn=1)


async def test_tool_call_groups_stay_whole(main_storage: MainStorage, mode: str) -> None:
    source = _source(main_storage, tool_at=2)
    child = await _fork(mode, source, "Child", context="inherit", at_turn=2)
    assert [m.type for m in child.messages()] == ["human", "ai", "human", "ai", "tool", "ai"]
    before = await _fork(mode, source, "Before", context="inherit", at_turn=1)
    assert [m.type for m in before.messages()] == ["human", "ai"]


async def test_copied_records_keep_their_turns(main_storage: MainStorage, mode: str) -> None:
    source = _source(main_storage, tool_at=3)
    child = await _fork(mode, source, "Child", context="inherit", at_turn=3)
    turns = main_storage.list_record_turns(child.id)
    assert turns == main_storage.list_record_turns(source.id)[: len(turns)]
    assert len(turns) == 8
    # the child's own turn comes after them, as a new turn
    main_storage.append_records(child.id, _turn(9), user_turn=True)
    assert main_storage.list_record_turns(child.id)[8][0] not in {t for t, _ in turns}


async def test_l2_and_insight_are_never_inherited(main_storage: MainStorage, mode: str) -> None:
    source = _source(main_storage)
    main_storage.put_memory(source.id, "the L2", through=4)
    main_storage.put_insight(source.id, "an insight")
    child = await _fork(mode, source, "Child", context="inherit", at_turn=2)
    assert main_storage.get_memory(child.id) is None
    assert main_storage.get_memory_through(child.id) == 0
    assert main_storage.get_insight(child.id) is None
    assert main_storage.get_insight(source.id) == "an insight"


async def test_the_opening_line_follows_the_inherited_turns(
    main_storage: MainStorage, mode: str
) -> None:
    source = _source(main_storage)
    child = await _fork(
        mode, source, "Child", context="inherit", at_turn=1, prompt="Let us go on from here."
    )
    assert _contents(child) == ["q1", "a1", "Let us go on from here."]


async def test_an_unclean_history_is_sanitised_instead_of_copied(
    main_storage: MainStorage, mode: str
) -> None:
    source = _source(main_storage, turns=2)
    orphan = ToolMessage("stray", tool_call_id="nobody")
    main_storage.append_records(source.id, [orphan, HumanMessage("q3"), AIMessage("a3")])
    child = await _fork(mode, source, "Child", context="inherit", at_turn=2)
    assert _contents(child) == ["q1", "a1", "q2", "a2"]
    whole = await _fork(mode, source, "Whole", context="inherit")
    assert _contents(whole) == ["q1", "a1", "q2", "a2", "q3", "a3"]
    source_turns = main_storage.list_record_turns(source.id)
    kept = source_turns[:4] + source_turns[5:]  # the orphan is dropped, the others keep turns
    assert main_storage.list_record_turns(whole.id) == kept
    assert main_storage.get_lineage(whole.id) == ForkPoint(whole.id, source.id, 3)


async def test_a_context_function_gets_the_history_up_to_the_turn(
    main_storage: MainStorage, mode: str
) -> None:
    source = _source(main_storage)
    seen: list[int] = []

    def last_two(records: list[BaseMessage]) -> list[BaseMessage]:
        seen.append(len(records))
        return records[-2:]

    child = await _fork(mode, source, "Child", context=last_two, at_turn=3)
    assert seen == [6] and _contents(child) == ["q3", "a3"]
    assert main_storage.get_lineage(child.id) == ForkPoint(child.id, source.id, 3)


async def test_a_compressed_fork_summarises_up_to_the_turn(
    main_storage: MainStorage, mode: str
) -> None:
    source = _source(main_storage)

    def summarise(previous: str | None, records: list[BaseMessage]) -> str:
        return " ".join(str(m.content) for m in records)

    child = await _fork(mode, source, "Child", context="compress", at_turn=2, compress_fn=summarise)
    compression = main_storage.get_compression(child.id)
    assert compression is not None and compression.summary == "q1 a1 q2 a2"


async def test_forks_without_at_turn_record_where_they_were_made(
    main_storage: MainStorage, mode: str
) -> None:
    source = _source(main_storage, turns=3)
    whole = await _fork(mode, source, "Whole", context="inherit")
    empty = await _fork(mode, source, "Empty")
    assert len(whole.messages()) == 6
    assert main_storage.get_lineage(whole.id) == ForkPoint(whole.id, source.id, 3)
    assert main_storage.get_lineage(empty.id) == ForkPoint(empty.id, source.id, None)
    assert main_storage.get_lineage(source.id) is None
