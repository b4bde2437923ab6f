"""The event feed: changes made through another storage object (another process) appear."""

from __future__ import annotations

from pathlib import Path

from stello_graph.agent import StelloAgent
from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.cli import _offline
from stello_graph.inspector import PollingEventSource
from stello_graph.schedule import BackgroundFailure, StorageFailureLog


def _types(events: list[dict[str, object]]) -> list[object]:
    return [e["type"] for e in events]


def test_changes_by_another_connection_become_events(tmp_path: Path) -> None:
    db = tmp_path / "tree.db"
    writer = StelloAgent(
        model=_offline.echo_model(),
        storage=db,
        consolidate_fn=_offline.summarise,
        integrate_fn=_offline.integrate,
    )
    with SqliteMainStorage(db) as reader, writer:
        source = PollingEventSource(reader)
        events, cursor = source.events_after(0)
        assert events == [] and cursor == 0  # the first read is the baseline
        a = writer.fork(writer.main_session_id, "A").id
        writer.turn(a, "hello")
        events, cursor = source.events_after(cursor)
        assert _types(events) == ["session_added"]  # seen at once: added, with its turn
        assert events[0]["session_id"] == a and events[0]["label"] == "A"
        writer.turn(a, "again")
        writer.consolidate(a)
        b = writer.fork(writer.main_session_id, "B").id
        writer.turn(b, "hi")
        writer.consolidate(b)
        writer.integrate()
        StorageFailureLog(writer.storage).append(
            BackgroundFailure(
                kind="integrate", session_id=None, error_type="E", message="m", attempts=1
            )
        )
        writer.archive(a)
        events, newest = source.events_after(cursor)
        by_type = {e["type"]: e for e in events}
        assert {"turns_changed", "l2_changed", "insight_set", "synthesis_changed"} <= set(by_type)
        assert {"session_added", "status_changed", "failure"} <= set(by_type)
        assert by_type["turns_changed"] == {**by_type["turns_changed"], "turns": 2, "previous": 1}
        assert by_type["failure"]["kind"] == "integrate" and by_type["failure"]["message"] == "m"
        assert [e["seq"] for e in events] == list(range(cursor + 1, newest + 1))
        assert source.events_after(newest) == ([], newest)
        writer.remove(a)
        assert _types(source.events_after(newest)[0]) == ["session_removed"]
