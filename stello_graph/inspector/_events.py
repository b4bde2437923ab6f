"""The inspector's event feed: what changed in the tree, after a cursor.

`EventSource` is the seam: `events_after(cursor)` returns the events with a sequence number
above `cursor`. `PollingEventSource` reads the tree's stored event log (forks, archives,
consolidations, integrations, insights: what any agent of the tree, in any process, did)
and compares snapshots of the storage for what the log does not hold (moves, relabels,
removals, turns, changes made without an agent). A change seen both ways is shown once,
with the log's details: the log also shows what snapshots cannot (an insight set and
delivered between two polls).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from stello_graph.events import StoredEvent
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
_SAME_CHANGE_WINDOW = 5.0
"""Seconds within which a snapshot change and a logged event of the same type and session
are taken for one change (the log is written just after the change it records)."""
_LOG_PAGE = 1000

_LOGGED_AS = {
    "session_forked": "session_added",
    "session_archived": "status_changed",
    "consolidated": "l2_changed",
    "insight_pushed": "insight_set",
    "insight_delivered": "insight_cleared",
    "integrated": "synthesis_changed",  # or subtree_synthesis_changed, below the main
}
"""The feed's type of each stored event type it shows."""


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
        self._log_cursor = 0
        self._shown: dict[tuple[str, str | None], tuple[bool, float]] = {}
        """(type, session) -> (shown from the log?, when): one change is shown once."""

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
        logged = self._read_log()
        first = self._sessions is None
        if not first:  # the baseline shows nothing before it (but stored failures)
            for event in logged:
                self._from_log(event, now, main)
            self._diff(self._sessions or {}, now)
            if synthesis != self._synthesis:
                self._seen_change("synthesis_changed", main, synthesis=synthesis)
        self._sessions, self._synthesis = now, synthesis
        self._new_failures()

    # -- the stored log ---------------------------------------------------------------------
    def _read_log(self) -> list[StoredEvent]:
        read = self._storage.events_after
        found: deque[StoredEvent] = deque(maxlen=_KEPT)
        while True:
            page: list[StoredEvent] = read(self._log_cursor, limit=_LOG_PAGE)
            if page:
                self._log_cursor = page[-1].cursor
                found.extend(page)
            if len(page) < _LOG_PAGE:
                return list(found)

    def _from_log(self, event: StoredEvent, now: dict[str, _Seen], main: str | None) -> None:
        type_ = _LOGGED_AS.get(event.type)
        if type_ is None:
            return  # background failures come from the failure log, with their traceback
        sid, data = event.session_id, event.data
        detail: dict[str, Any] = {"at": event.at.isoformat(), "cursor": event.cursor}
        if type_ == "session_added":
            detail.update(label=data.get("label", ""), parent_id=data.get("parent_id"))
            detail.update(by=data.get("by"))
        elif type_ == "status_changed":
            detail.update(status="archived", previous="active")
        elif type_ == "l2_changed" and sid in now:
            detail.update(memory_through=now[sid].memory[1])
        elif type_ == "synthesis_changed":
            if sid != main:
                type_ = "subtree_synthesis_changed"
            else:
                detail.update(synthesis=data.get("synthesis"))
        if self._first_to_show(type_, sid, from_log=True):
            self._emit(type_, sid, **detail)

    def _seen_change(self, type_: str, session_id: str | None, **detail: Any) -> None:
        """A change the snapshots found, unless the log showed it just now."""
        if self._first_to_show(type_, session_id, from_log=False):
            self._emit(type_, session_id, **detail)

    def _first_to_show(self, type_: str, session_id: str | None, *, from_log: bool) -> bool:
        """Whether the other way (log or snapshots) did not just show this change."""
        key, now = (type_, session_id), time.monotonic()
        shown = self._shown.pop(key, None)
        self._shown[key] = (from_log, now)
        if len(self._shown) > _KEPT:
            self._shown.pop(next(iter(self._shown)))
        return shown is None or shown[0] == from_log or now - shown[1] >= _SAME_CHANGE_WINDOW

    def _diff(self, before: dict[str, _Seen], after: dict[str, _Seen]) -> None:
        for sid in before.keys() - after.keys():
            # none of a removed session's text stays: its earlier events go, and this one
            # names it by id (as its events in the stored log, whose details are gone)
            self._events = deque((e for e in self._events if e["session_id"] != sid), _KEPT)
            self._seen_change("session_removed", sid)
        for sid, new in after.items():
            old = before.get(sid)
            if old is None:
                self._seen_change("session_added", sid, label=new.label, parent_id=new.parent_id)
                continue
            self._changes(sid, old, new)

    def _changes(self, sid: str, old: _Seen, new: _Seen) -> None:
        if old.parent_id != new.parent_id:
            self._seen_change("moved", sid, parent_id=new.parent_id, previous=old.parent_id)
        if old.label != new.label:
            self._seen_change("relabelled", sid, label=new.label, previous=old.label)
        if old.status != new.status:
            self._seen_change("status_changed", sid, status=new.status, previous=old.status)
        if old.turns != new.turns:
            self._seen_change("turns_changed", sid, turns=new.turns, previous=old.turns)
        if old.memory != new.memory and new.memory[0]:
            self._seen_change("l2_changed", sid, memory_through=new.memory[1])
        if old.insight != new.insight:
            self._seen_change("insight_set" if new.insight else "insight_cleared", sid)
        if old.subtree != new.subtree and new.subtree:
            self._seen_change("subtree_synthesis_changed", sid)

    def _new_failures(self) -> None:
        for failure in StorageFailureLog(self._storage).read():
            data = failure.as_dict()
            key = (data["at"], data["kind"], str(data["session_id"]), data["message"])
            if key not in self._failures:
                self._failures.add(key)
                data.pop("session_id")
                self._emit("failure", failure.session_id, **data)
