"""Session meta, per-session values, listings and globals: both backends, sync and async."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from stello_graph.errors import InvalidInputError, SessionNotFoundError
from stello_graph.models import ChildL2, SessionMeta, TopologyNode
from stello_graph.storage import MainStorage
from tests.conftest import Api

NASTY = "Robert'); DROP TABLE stello_sessions; -- \" % _ \\ \x00 é 中文 🎉 \u202e"


async def test_put_and_get_session_round_trip(api: Api) -> None:
    meta = SessionMeta(
        id="s1",
        label="Pricing",
        tags=("a", "b"),
        metadata={"k": [1, 2.5, None, True], "nested": {"x": "y"}},
        created_at=datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
        updated_at=datetime(2024, 1, 3, tzinfo=UTC),
    )
    await api("put_session", meta)
    assert await api("get_session", "s1") == meta


async def test_sql_metacharacters_and_unicode_round_trip(api: Api) -> None:
    meta = SessionMeta(id=NASTY, label=NASTY, tags=(NASTY, "%"), metadata={NASTY: NASTY})
    await api("put_session", meta)
    await api("put_system_prompt", NASTY, NASTY)
    await api("put_insight", NASTY, NASTY)
    await api("put_memory", NASTY, NASTY)
    await api("put_global", NASTY, {NASTY: [NASTY]})
    assert await api("get_session", NASTY) == meta
    assert await api("list_sessions", tags=[NASTY]) == [meta]
    assert await api("get_system_prompt", NASTY) == NASTY
    assert await api("get_insight", NASTY) == NASTY
    assert await api("get_memory", NASTY) == NASTY
    await api("append_records", NASTY, [HumanMessage(NASTY)])  # (moves updated_at)
    assert await api("list_records", NASTY) == [HumanMessage(NASTY)]
    assert await api("get_global", NASTY) == {NASTY: [NASTY]}
    assert await api("get_session", "Robert") is None


async def test_datetimes_come_back_aware_in_utc(api: Api) -> None:
    plus_two = timezone(timedelta(hours=2))
    meta = SessionMeta(
        id="s1",
        label="",
        created_at=datetime(2024, 5, 1, 12, 0),  # naive: taken as UTC
        updated_at=datetime(2024, 5, 1, 12, 0, tzinfo=plus_two),
    )
    await api("put_session", meta)
    got = await api("get_session", "s1")
    assert got.created_at == datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    assert got.updated_at == datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
    assert got.created_at.tzinfo is not None
    assert got.updated_at.utcoffset() == timedelta(0)


async def test_replacing_meta_keeps_everything_else(api: Api) -> None:
    await api("put_session", SessionMeta(id="first", label=""))
    await api("put_session", SessionMeta(id="s1", label="old"))
    await api("put_node", TopologyNode(id="s1", label="old"))
    await api("append_records", "s1", [HumanMessage("q"), AIMessage("a")], user_turn=True)
    await api("put_system_prompt", "s1", "SYS")
    await api("put_insight", "s1", "INS")
    await api("put_memory", "s1", "MEM", through=2)

    await api("put_session", SessionMeta(id="s1", label="new", status="archived"))

    assert (await api("get_session", "s1")).label == "new"
    assert (await api("get_node", "s1")).label == "new"
    assert await api("count_records", "s1") == 2
    assert await api("get_turn_count", "s1") == 1
    assert await api("get_system_prompt", "s1") == "SYS"
    assert await api("get_insight", "s1") == "INS"
    assert await api("get_memory", "s1") == "MEM"
    assert await api("get_memory_through", "s1") == 2
    assert [m.id for m in await api("list_sessions")] == ["first", "s1"]  # creation order kept


async def test_list_sessions_filters_in_creation_order(api: Api) -> None:
    for sid, status, role, tags in [
        ("zeta", "active", "standard", ("x", "y")),
        ("main", "active", "main", ("x",)),
        ("alpha", "archived", "standard", ("y",)),
        ("mid", "active", "standard", ("y", "x", "z")),
    ]:
        await api("put_session", SessionMeta(id=sid, label="", status=status, role=role, tags=tags))

    async def ids(**filters: Any) -> list[str]:
        return [meta.id for meta in await api("list_sessions", **filters)]

    assert await ids() == ["zeta", "main", "alpha", "mid"]
    assert await ids(status="active") == ["zeta", "main", "mid"]
    assert await ids(status="archived") == ["alpha"]
    assert await ids(role="standard") == ["zeta", "alpha", "mid"]
    assert await ids(role="standard", status="active") == ["zeta", "mid"]
    assert await ids(tags=["x"]) == ["zeta", "main", "mid"]
    assert await ids(tags=("x", "y")) == ["zeta", "mid"]
    assert await ids(tags=["x", "nope"]) == []
    assert (await api("get_main_session")).id == "main"


async def test_get_main_session_none_without_main(api: Api) -> None:
    await api("put_session", SessionMeta(id="s1", label=""))
    assert await api("get_main_session") is None


async def test_all_session_l2s(api: Api) -> None:
    sessions = [
        SessionMeta(id="c", label="C"),
        SessionMeta(id="main", label="Main", role="main"),
        SessionMeta(id="a", label="A"),
        SessionMeta(id="archived", label="Old", status="archived"),
        SessionMeta(id="no-l2", label="Fresh"),
        SessionMeta(id="b", label="B"),
    ]
    for meta in sessions:
        await api("put_session", meta)
        if meta.id != "no-l2":
            await api("put_memory", meta.id, f"L2 of {meta.id}")
    assert await api("get_all_session_l2s") == [
        ChildL2(session_id="c", label="C", l2="L2 of c"),
        ChildL2(session_id="a", label="A", l2="L2 of a"),
        ChildL2(session_id="b", label="B", l2="L2 of b"),
    ]


async def test_missing_reads_return_empty(api: Api) -> None:
    assert await api("get_session", "nope") is None
    assert await api("list_records", "nope") == []
    assert await api("count_records", "nope") == 0
    assert await api("get_turn_count", "nope") == 0
    assert await api("get_system_prompt", "nope") is None
    assert await api("get_insight", "nope") is None
    assert await api("get_memory", "nope") is None
    assert await api("get_memory_through", "nope") == 0
    assert await api("get_node", "nope") is None
    assert await api("get_children", "nope") == []
    assert await api("get_ancestors", "nope") == []
    assert await api("get_global", "nope") is None
    assert await api("list_sessions") == []
    assert await api("get_all_session_l2s") == []
    assert await api("get_tree") == []


MISSING_WRITES: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("append_records", ("nope", [HumanMessage("x")]), {}),
    ("append_records", ("nope", []), {"user_turn": True}),
    ("trim_records", ("nope", 0), {}),
    ("put_system_prompt", ("nope", "p"), {}),
    ("put_system_prompt", ("nope", None), {}),
    ("put_insight", ("nope", "i"), {}),
    ("clear_insight", ("nope",), {}),
    ("clear_insight", ("nope",), {"expected": "i"}),
    ("put_memory", ("nope", "m"), {}),
    ("put_memory", ("nope", "m"), {"through": 3}),
    ("put_node", (TopologyNode(id="nope"),), {}),
]


@pytest.mark.parametrize(("method", "args", "kwargs"), MISSING_WRITES)
async def test_writes_to_missing_session_raise(
    api: Api, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    with pytest.raises(SessionNotFoundError, match="'nope'") as caught:
        await api(method, *args, **kwargs)
    assert caught.value.session_id == "nope"
    assert await api("get_session", "nope") is None
    assert await api("get_tree") == []


async def test_system_prompt_set_and_removed(api: Api) -> None:
    await api("put_session", SessionMeta(id="s1", label=""))
    assert await api("get_system_prompt", "s1") is None
    await api("put_system_prompt", "s1", "You are terse.")
    assert await api("get_system_prompt", "s1") == "You are terse."
    await api("put_system_prompt", "s1", None)
    assert await api("get_system_prompt", "s1") is None


async def test_insight_replaced_and_compare_and_clear(api: Api) -> None:
    await api("put_session", SessionMeta(id="s1", label=""))
    assert await api("clear_insight", "s1") is False
    await api("put_insight", "s1", "first")
    await api("put_insight", "s1", "second")
    assert await api("get_insight", "s1") == "second"  # replaced, never appended
    assert await api("clear_insight", "s1", expected="first") is False
    assert await api("get_insight", "s1") == "second"
    assert await api("clear_insight", "s1", expected="second") is True
    assert await api("get_insight", "s1") is None
    await api("put_insight", "s1", "third")
    assert await api("clear_insight", "s1") is True
    assert await api("clear_insight", "s1") is False


async def test_memory_and_its_cursor(api: Api) -> None:
    await api("put_session", SessionMeta(id="s1", label=""))
    assert await api("get_memory_through", "s1") == 0
    await api("append_records", "s1", [HumanMessage("q"), AIMessage("a")] * 2)
    await api("put_memory", "s1", "v1", through=4)
    await api("put_memory", "s1", "v2")  # through=None keeps the cursor
    assert await api("get_memory", "s1") == "v2"
    assert await api("get_memory_through", "s1") == 4
    await api("put_memory", "s1", "v3", through=0)
    assert await api("get_memory_through", "s1") == 0


@pytest.mark.parametrize(
    "value",
    [None, 0, -1.5, "text", [1, "two", None], {"a": {"b": [True, False]}}, 10**30],
)
async def test_globals_hold_json_values(api: Api, value: Any) -> None:
    await api("put_global", "k", "overwritten")
    await api("put_global", "k", value)
    assert await api("get_global", "k") == value


async def test_global_values_are_copies(api: Api) -> None:
    value = {"list": [1]}
    await api("put_global", "k", value)
    value["list"].append(2)
    got = await api("get_global", "k")
    got["list"].append(3)
    assert await api("get_global", "k") == {"list": [1]}


BAD_CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("get_session", ("",), {}),
    ("get_session", (7,), {}),
    ("put_session", ({"id": "s1"},), {}),
    ("put_session", (SessionMeta(id="", label=""),), {}),
    ("put_session", (SessionMeta(id="s1", label="bad \ud800 surrogate"),), {}),
    ("put_session", (SessionMeta(id="s1", label="", metadata={"x": object()}),), {}),
    ("append_records", ("s1", "not a list"), {}),
    ("append_records", ("s1", [HumanMessage("ok"), "not a message"]), {}),
    ("append_records", ("s1", HumanMessage("not in a list")), {}),
    ("append_records", ("s1", [HumanMessage("x", additional_kwargs={"o": object()})]), {}),
    ("list_records", ("s1",), {"limit": -1}),
    ("list_records", ("s1",), {"limit": True}),
    ("list_records", ("s1",), {"offset": "1"}),
    ("list_records", ("s1",), {"offset": -2}),
    ("list_records", ("s1",), {"role": "robot"}),
    ("trim_records", ("s1", -1), {}),
    ("trim_records", ("s1", 1.0), {}),
    ("put_system_prompt", ("s1", 3), {}),
    ("put_insight", ("s1", None), {}),
    ("clear_insight", ("s1",), {"expected": 1}),
    ("put_memory", ("s1", None), {}),
    ("put_memory", ("s1", "m"), {"through": -1}),
    ("list_sessions", (), {"status": "deleted"}),
    ("list_sessions", (), {"role": "child"}),
    ("list_sessions", (), {"tags": "abc"}),
    ("list_sessions", (), {"tags": [1]}),
    ("put_node", ({"id": "s1"},), {}),
    ("put_node", (TopologyNode(id=""),), {}),
    ("put_node", (TopologyNode(id="s1", parent_id=""),), {}),
    ("get_children", (None,), {}),
    ("remove_node", ("",), {}),
    ("put_global", ("k", object()), {}),
    ("put_global", ("", 1), {}),
    ("get_global", (None,), {}),
]


@pytest.mark.parametrize(("method", "args", "kwargs"), BAD_CALLS)
async def test_bad_input_is_refused_and_changes_nothing(
    api: Api, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    await api("put_session", SessionMeta(id="s1", label="kept"))
    await api("append_records", "s1", [HumanMessage("kept")])
    with pytest.raises(InvalidInputError):
        await api(method, *args, **kwargs)
    assert [m.label for m in await api("list_sessions")] == ["kept"]
    assert await api("list_records", "s1") == [HumanMessage("kept")]
    assert await api("get_global", "k") is None
    assert await api("get_tree") == []


BAD_TREE_IDS: dict[str, tuple[Any, str]] = {
    "empty": ("", "tree_id must not be empty"),
    "int": (5, "tree_id must be a str, got int"),
    "None": (None, "tree_id must be a str, got NoneType"),
    "NUL": ("alice\x00", "contains the control character '\\x00'"),
    "newline": ("alice\nbob", "contains the control character '\\n'"),
    "DEL": ("alice\x7f", "contains the control character '\\x7f'"),
    "257 characters": ("t" * 257, "has 257 characters; the limit is 256"),
}


@pytest.mark.parametrize("case", list(BAD_TREE_IDS))
@pytest.mark.parametrize("backend", ["memory", "sqlite", "postgres", "third-party", "agent"])
def test_tree_id_is_validated(case: str, backend: str, tmp_path: Path) -> None:
    from stello_graph import StelloAgent
    from stello_graph.checkpoints import (
        BackendStorage,
        InMemoryMainStorage,
        PostgresMainStorage,
        SqliteMainStorage,
    )
    from stello_graph.testing import ScriptedChatModel

    tree_id, message = BAD_TREE_IDS[case]

    def open_storage() -> object:
        if backend == "memory":
            return InMemoryMainStorage(tree_id=tree_id)
        if backend == "third-party":
            return BackendStorage(InMemoryMainStorage(), tree_id=tree_id)
        if backend == "agent":
            model = ScriptedChatModel()
            return StelloAgent(model=model, storage=tmp_path / "a.db", tree_id=tree_id)
        if backend == "postgres":  # checked before connecting: no server is needed
            return PostgresMainStorage("postgresql://nobody@127.0.0.1:9/none", tree_id=tree_id)
        return SqliteMainStorage(tmp_path / "a.db", tree_id=tree_id)

    with pytest.raises(InvalidInputError, match="tree_id") as caught:
        open_storage()
    assert message in str(caught.value)
    assert not (tmp_path / "a.db").exists()  # refused before the file is made


def test_a_long_tree_id_is_shown_cut_short() -> None:
    from stello_graph.checkpoints import InMemoryMainStorage

    with pytest.raises(InvalidInputError) as caught:
        InMemoryMainStorage(tree_id="t" * 100_000)
    assert len(str(caught.value)) < 300


@pytest.mark.parametrize("tree_id", ["t" * 256, "acme.com/team:x 100%", "ünïcödé 🌳", " "])
def test_tree_ids_within_the_rules_are_kept(tree_id: str, tmp_path: Path) -> None:
    from stello_graph import StelloAgent
    from stello_graph.testing import ScriptedChatModel

    with StelloAgent(
        model=ScriptedChatModel(default="ok"), storage=tmp_path / "a.db", tree_id=tree_id
    ) as agent:
        assert agent.storage.tree_id == tree_id
        assert agent.turn(agent.main_session_id, "hi").content == "ok"


def test_both_backends_have_every_protocol_method_and_async_twin(
    main_storage: MainStorage,
) -> None:
    import inspect

    from stello_graph import storage as protocol

    names = {
        name
        for cls in (protocol.SessionStorage, protocol.MainStorage)
        for name, _ in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }
    assert len(names) > 50
    for name in sorted(names):
        assert callable(getattr(main_storage, name)), name
        if name.startswith("a") and name[1:] in names:
            sync_name = name[1:]
            twin = getattr(main_storage, name)
            if sync_name != "transaction":
                assert inspect.iscoroutinefunction(twin) or inspect.isasyncgenfunction(twin), name
            assert inspect.signature(twin).parameters.keys() == (
                inspect.signature(getattr(main_storage, sync_name)).parameters.keys()
            ), name
    assert main_storage.tree_id == "default"
