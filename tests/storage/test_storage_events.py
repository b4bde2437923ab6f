"""The stored event log: append-only, a cursor per tree, shared by every storage of a file."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.errors import InvalidInputError
from stello_graph.events import StoredEvent, StoredEvents
from tests.conftest import Api


async def test_cursors_grow_and_events_come_back_in_order(api: Api) -> None:
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    first = await api("append_event", "session_forked", "s1", {"label": "One", "n": [1, 2]})
    second = await api("append_event", "consolidated", None, None, at=at)
    third = await api("append_event", "integrated", "main", {"synthesis": "é ✓"})
    assert 0 < first < second < third
    events: list[StoredEvent] = await api("events_after", 0)
    assert [(e.cursor, e.type, e.session_id) for e in events] == [
        (first, "session_forked", "s1"),
        (second, "consolidated", None),
        (third, "integrated", "main"),
    ]
    assert events[0].data == {"label": "One", "n": [1, 2]}
    assert events[1].data == {} and events[1].at == at
    assert events[2].data == {"synthesis": "é ✓"}
    assert events[0].as_dict() == {
        "event": "session_forked",
        "session_id": "s1",
        "cursor": first,
        "label": "One",
        "n": [1, 2],
    }


async def test_pages_after_a_cursor(api: Api) -> None:
    cursors = [await api("append_event", "consolidated", f"s{i}") for i in range(7)]
    page = await api("events_after", cursors[1], limit=3)
    assert [e.cursor for e in page] == cursors[2:5]
    assert [e.cursor for e in await api("events_after", cursors[4], limit=100)] == cursors[5:]
    assert await api("events_after", cursors[-1]) == []


async def test_an_event_is_written_with_its_transaction(api: Api) -> None:
    kept = await api("append_event", "consolidated", "s1")

    async def aborted() -> None:
        async with api.transaction():
            await api("append_event", "integrated", "main")
            raise RuntimeError("undo")

    with pytest.raises(RuntimeError):
        await aborted()
    async with api.transaction():
        with pytest.raises(RuntimeError):
            await aborted()  # a savepoint of this transaction: only it is undone
        after = await api("append_event", "insight_delivered", "s1")
    events = await api("events_after", 0)
    assert [(e.cursor, e.type) for e in events] == [
        (kept, "consolidated"),
        (after, "insight_delivered"),
    ]
    assert after > kept


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (("",), {}),
        ((5,), {}),
        (("consolidated", 7), {}),
        (("consolidated", None, ["not", "a", "mapping"]), {}),
        (("consolidated", None, {"x": object()}), {}),
        (("consolidated", None, {1: "int key"}), {}),
        (("consolidated",), {"at": "yesterday"}),
    ],
)
async def test_bad_events_are_refused_and_nothing_is_written(
    api: Api, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    with pytest.raises(InvalidInputError):
        await api("append_event", *args, **kwargs)
    assert await api("events_after", 0) == []


@pytest.mark.parametrize(
    ("cursor", "limit"), [(-1, 10), ("0", 10), (0, 0), (0, 10_001), (0, True), (1.5, 10)]
)
async def test_bad_pages_are_refused(api: Api, cursor: Any, limit: Any) -> None:
    with pytest.raises(InvalidInputError):
        await api("events_after", cursor, limit=limit)


def test_trees_of_one_file_keep_their_own_logs(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    with (
        SqliteMainStorage(path, tree_id="alice") as alice,
        SqliteMainStorage(path, tree_id="bob") as bob,
    ):
        alice.append_event("consolidated", "a1")
        alice.append_event("integrated", "main")
        assert bob.append_event("session_forked", "b1") == 1  # cursors are per tree
        assert [e.session_id for e in alice.events_after(0)] == ["a1", "main"]
        assert [e.session_id for e in bob.events_after(0)] == ["b1"]


async def test_another_connection_follows_the_log(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    with SqliteMainStorage(path) as writer, SqliteMainStorage(path) as reader:
        follower = StoredEvents(reader, interval=0.01)
        assert follower.poll() == []
        writer.append_event("session_forked", "s1")
        writer.append_event("consolidated", "s1")
        assert [e.type for e in follower.poll()] == ["session_forked", "consolidated"]
        assert follower.cursor == 2
        await writer.aappend_event("integrated", "main")
        seen = [e.type async for e in follower.afollow(idle_timeout=0.05)]
        assert seen == ["integrated"]
        resumed = StoredEvents(reader, cursor=1)
        assert [e.cursor for e in resumed.follow(idle_timeout=0.02)] == [2, 3]


def test_a_reader_refuses_bad_arguments(tmp_path: Path) -> None:
    with SqliteMainStorage(tmp_path / "s.db") as storage:
        with pytest.raises(InvalidInputError):
            StoredEvents(storage, cursor=-1)
        with pytest.raises(InvalidInputError):
            StoredEvents(storage, interval=0)
