"""The inspector's feed reads the stored event log: details, and changes snapshots miss."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stello_graph.agent import StelloAgent
from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.inspector import PollingEventSource
from stello_graph.models import IntegrationResult
from stello_graph.testing import ScriptedChatModel


def _integrate(children: Any, synthesis: Any) -> IntegrationResult:
    return IntegrationResult(synthesis="whole", insights={c.session_id: "hint" for c in children})


def test_logged_events_are_shown_once_with_their_details(tmp_path: Path) -> None:
    db = tmp_path / "tree.db"
    with (
        StelloAgent(
            model=ScriptedChatModel(default="ok"),
            storage=db,
            consolidate_fn=lambda l2, records: "l2",
            integrate_fn=_integrate,
        ) as writer,
        SqliteMainStorage(db) as reader,
    ):
        source = PollingEventSource(reader)
        assert source.events_after(0) == ([], 0)
        child = writer.fork(writer.main_session_id, "A").id
        events, cursor = source.events_after(0)
        assert [e["type"] for e in events] == ["session_added"]  # the log's, not twice
        assert events[0]["by"] == "user" and events[0]["label"] == "A" and events[0]["cursor"]
        writer.turn(child, "hello")
        writer.consolidate(child)
        writer.integrate()  # pushes an insight ...
        writer.turn(child, "again")  # ... delivered before the next poll
        events, cursor = source.events_after(cursor)
        types = [e["type"] for e in events]
        assert [e["session_id"] for e in events if e["type"] == "l2_changed"].count(child) == 1
        assert types.count("synthesis_changed") == 1
        # snapshots alone see no insight here (set and cleared between two polls)
        assert "insight_set" in types and "insight_cleared" in types
        synthesis = next(e for e in events if e["type"] == "synthesis_changed")
        assert synthesis["synthesis"] == "whole"
        writer.archive(child)
        events, _ = source.events_after(cursor)
        assert [e["type"] for e in events] == ["status_changed"]
        assert events[0]["status"] == "archived"
