"""The inspector's event feed: what changed in the tree, after a cursor.

`EventSource` is the seam: `events_after(cursor)` returns the events with a sequence number
above `cursor`. Today's source, `PollingEventSource`, compares snapshots of the storage (so
changes made by any process appear); a stored event log with a cursor can replace it without
touching the server or the page.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from stello_graph.inspector._views import session_stats
from stello_graph.models import SessionStats, utcnow
from stello_graph.schedule import StorageFailureLog
from stello_graph.storage import MainStorage

__all__ = ["EVENT_TYPES", "EventSource", "PollingEventSource"]

EVENT_TYPES = (
    "session_added",
    "session_removed",
    "moved",
    "relabelled",
    "status_changed",
    "turns_changed",
    "l2_changed",
    "insight_set",
    "insight_cleared",
    "subtree_synthesis_changed",
    "synthesis_changed",
    "failure",
)
"""Every `type` an event can have."""

_KEPT = 2000


class EventSource(Protocol):
    """Where the server reads the tree's events from."""

    def events_after(self, cursor: int) -> tuple[list[dict[str, Any]], int]:
        """The events numbered above `cursor` (oldest first) and the newest number."""
        ...


@dataclass(frozen=True, slots=True)
class _Seen:
    parent_id: str | None
    label: str
    status: str
    turns: int
    memory: tuple[bool, int]
    insight: bool
    subtree: bool


def _seen(stats: SessionStats) -> _Seen:
    return _Seen(
        parent_id=stats.parent_id,
        label=stats.label,
        status=stats.status,
        turns=stats.turns,
        memory=(stats.has_memory, stats.memory_through),
        insight=stats.has_insight,
        subtree=stats.has_subtree_synthesis,
    )


class PollingEventSource:
    """Events found by comparing snapshots of the storage, taken at most once per call.

    The first snapshot is the baseline (its stored failures become the first events, so the
    timeline shows them). What it sees: sessions added and removed, moves and relabels,
    status, turn-count, L2 (a new one or its cursor), insight, subtree synthesis and main
    synthesis changes, and new stored background failures. Thread-safe.
    """

    def __init__(self, storage: MainStorage) -> None:
        self._storage = storage
        self._lock = threading.Lock()
        self._events: deque[dict[str, Any]] = deque(maxlen=_KEPT)
        self._seq = 0
        self._sessions: dict[str, _Seen] | None = None
        self._synthesis: str | None = None
        self._failures: set[tuple[str, ...]] = set()

    def events_after(self, cursor: int) -> tuple[list[dict[str, Any]], int]:
        with self._lock:
            self._poll()
            return [e for e in self._events if e["seq"] > cursor], self._seq

    # -- snapshots --------------------------------------------------------------------------
    def _emit(self, type_: str, session_id: str | None, **detail: Any) -> None:
        self._seq += 1
        at = detail.pop("at", None) or utcnow().isoformat()
        self._events.append(
            {"seq": self._seq, "type": type_, "session_id": session_id, "at": at, **detail}
        )

    def _poll(self) -> None:
        storage = self._storage
        stats = session_stats(storage)
        now = {s.id: _seen(s) for s in stats if s.in_tree}
        main = next((s.id for s in stats if s.role == "main"), None)
        synthesis = storage.get_memory(main) if main is not None else None
        first = self._sessions is None
        if not first:
            self._diff(self._sessions or {}, now)
            if synthesis != self._synthesis:
                self._emit("synthesis_changed", main, synthesis=synthesis)
        self._sessions, self._synthesis = now, synthesis
        self._new_failures()

    def _diff(self, before: dict[str, _Seen], after: dict[str, _Seen]) -> None:
        for sid in before.keys() - after.keys():
            self._emit("session_removed", sid, label=before[sid].label)
        for sid, new in after.items():
            old = before.get(sid)
            if old is None:
                self._emit("session_added", sid, label=new.label, parent_id=new.parent_id)
                continue
            self._changes(sid, old, new)

    def _changes(self, sid: str, old: _Seen, new: _Seen) -> None:
        if old.parent_id != new.parent_id:
            self._emit("moved", sid, parent_id=new.parent_id, previous=old.parent_id)
        if old.label != new.label:
            self._emit("relabelled", sid, label=new.label, previous=old.label)
        if old.status != new.status:
            self._emit("status_changed", sid, status=new.status, previous=old.status)
        if old.turns != new.turns:
            self._emit("turns_changed", sid, turns=new.turns, previous=old.turns)
        if old.memory != new.memory and new.memory[0]:
            self._emit("l2_changed", sid, memory_through=new.memory[1])
        if old.insight != new.insight:
            self._emit("insight_set" if new.insight else "insight_cleared", sid)
        if old.subtree != new.subtree and new.subtree:
            self._emit("subtree_synthesis_changed", sid)

    def _new_failures(self) -> None:
        for failure in StorageFailureLog(self._storage).read():
            data = failure.as_dict()
            key = (data["at"], data["kind"], str(data["session_id"]), data["message"])
            if key not in self._failures:
                self._failures.add(key)
                data.pop("session_id")
                self._emit("failure", failure.session_id, **data)
