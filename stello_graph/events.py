"""Stello events: what happened in a topology, for streams, listeners and logs.

Inside a graph run, nodes write each event to LangGraph's `custom` stream as a dict
(`{"event": "session_forked", "session_id": ..., ...}`). Every event, including those of
background work that runs outside any graph run, also goes to the listeners of an `EventBus`
(`StelloAgent.subscribe`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from stello_graph.models import utcnow

__all__ = ["EventBus", "EventType", "StelloEvent", "emit"]

EventType = Literal[
    "turn_started",
    "tool_call",
    "tool_result",
    "turn_committed",
    "session_forked",
    "session_archived",
    "consolidated",
    "integrated",
    "insight_pushed",
    "insight_delivered",
    "skill_activated",
    "background_error",
]


@dataclass(frozen=True, slots=True)
class StelloEvent:
    """One event. `data` holds the event's details (JSON-serialisable)."""

    type: EventType
    session_id: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    at: datetime = field(default_factory=utcnow)
    streamed: bool = False
    """Whether the event was also written to a graph run's `custom` stream."""

    def as_dict(self) -> dict[str, Any]:
        """The form written to LangGraph's `custom` stream."""
        return {"event": self.type, "session_id": self.session_id, **self.data}


Listener = Callable[[StelloEvent], None]


class EventBus:
    """Thread-safe fan-out of events to listeners; a failing listener never breaks the sender."""

    def __init__(self) -> None:
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call `listener` for every event; return a function that unsubscribes it."""
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def publish(self, event: StelloEvent) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            with contextlib.suppress(Exception):  # a listener's bug must not break a turn
                listener(event)


def _stream_writer() -> Callable[[Any], None] | None:
    try:
        from langgraph.config import get_stream_writer

        return get_stream_writer()
    except (ImportError, RuntimeError, KeyError):
        return None


def emit(
    bus: EventBus | None,
    type: EventType,
    session_id: str | None = None,
    *,
    stream: bool = True,
    **data: Any,
) -> StelloEvent:
    """Publish an event to `bus` and, inside a graph run, to the `custom` stream."""
    writer = _stream_writer() if stream else None
    event = StelloEvent(type=type, session_id=session_id, data=data, streamed=writer is not None)
    if writer is not None:
        writer(event.as_dict())
    if bus is not None:
        bus.publish(event)
    return event
