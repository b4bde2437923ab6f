"""Stello events: what happened in a topology, for streams, listeners and logs.

Inside a graph run, nodes write each event to LangGraph's `custom` stream as a dict
(`{"event": "session_forked", "session_id": ..., ...}`). Every event, including those of
background work that runs outside any graph run, also goes to the listeners of an `EventBus`
(`StelloAgent.subscribe`): those of this process.

The events that change the tree (`STORED_EVENT_TYPES`: forks, archives, consolidations,
integrations, insights pushed and delivered, background failures) are also appended to the
tree's stored event log (`MainStorage.append_event`), each with a cursor that only grows. A
listener in another process, or one that was not running at the time, follows them with
`StoredEvents` (`StelloAgent.follow_events`), sync or async:

    >>> from stello_graph.checkpoints import InMemoryMainStorage
    >>> storage = InMemoryMainStorage()
    >>> storage.append_event("consolidated", None, {"l2": "..."})
    1
    >>> [(e.cursor, e.type) for e in StoredEvents(storage).poll()]
    [(1, 'consolidated')]
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from stello_graph.errors import InvalidInputError
from stello_graph.models import utcnow

if TYPE_CHECKING:
    from stello_graph.storage import MainStorage

__all__ = [
    "STORED_EVENT_TYPES",
    "EventBus",
    "EventType",
    "StelloEvent",
    "StoredEvent",
    "StoredEvents",
    "emit",
]

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


STORED_EVENT_TYPES: frozenset[EventType] = frozenset(
    {
        *("session_forked", "session_archived", "consolidated", "integrated"),
        *("insight_pushed", "insight_delivered", "background_error"),
    }
)
"""The events an agent appends to the stored event log (the others - turns, tool calls,
skills - stay in its process: streams and `subscribe`)."""


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


def emit(
    bus: EventBus | None,
    type: EventType,
    session_id: str | None = None,
    *,
    stream: bool = True,
    **data: Any,
) -> StelloEvent:
    """Publish an event to `bus` and, inside a graph run, to the `custom` stream."""
    writer: Callable[[Any], None] | None = None
    with contextlib.suppress(ImportError, RuntimeError, KeyError):  # outside a graph run
        if stream:
            from langgraph.config import get_stream_writer

            writer = get_stream_writer()
    event = StelloEvent(type=type, session_id=session_id, data=data, streamed=writer is not None)
    if writer is not None:
        writer(event.as_dict())
    if bus is not None:
        bus.publish(event)
    return event


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One event of a tree's stored log (`MainStorage.events_after`)."""

    cursor: int
    """Its place in the log: strictly increasing within the tree; follow from the last seen."""
    type: str
    """What happened: one of `STORED_EVENT_TYPES` for the events an agent stores."""
    session_id: str | None
    """The session it is about, if any."""
    data: dict[str, Any]
    """Its details (as `StelloEvent.data`)."""
    at: datetime
    """When it happened."""

    def as_dict(self) -> dict[str, Any]:
        """The form of `StelloEvent.as_dict`, with the cursor."""
        return {
            "event": self.type,
            "session_id": self.session_id,
            "cursor": self.cursor,
            **self.data,
        }


class StoredEvents:
    """A reader that follows a tree's stored event log from a cursor, in any process.

    `poll()` / `apoll()` return the events after the cursor and move it on; `follow()` /
    `afollow()` iterate over the events as they are appended, polling every `interval`
    seconds (until `idle_timeout` seconds pass with nothing new, when given). Keep `cursor` to
    resume where a reader stopped.

    Args:
        storage: the tree's storage (another process's storage of the same tree works).
        cursor: the last cursor already seen (0: from the start of the log).
        interval: seconds between polls while following.
    """

    def __init__(self, storage: MainStorage, cursor: int = 0, *, interval: float = 0.25) -> None:
        if isinstance(cursor, bool) or not isinstance(cursor, int) or cursor < 0:
            raise InvalidInputError(f"cursor must be an int >= 0, got {cursor!r}.")
        if isinstance(interval, bool) or not isinstance(interval, int | float) or interval <= 0:
            raise InvalidInputError(f"interval must be positive seconds, got {interval!r}.")
        self._storage = storage
        self._cursor = cursor
        self.interval = float(interval)

    @property
    def cursor(self) -> int:
        """The cursor of the last event returned (where the next poll starts)."""
        return self._cursor

    def poll(self, limit: int = 100) -> list[StoredEvent]:
        """The next events after the cursor (at most `limit`), oldest first."""
        return self._advance(self._storage.events_after(self._cursor, limit=limit))

    async def apoll(self, limit: int = 100) -> list[StoredEvent]:
        """Async twin of `poll`."""
        return self._advance(await self._storage.aevents_after(self._cursor, limit=limit))

    def follow(self, *, idle_timeout: float | None = None) -> Iterator[StoredEvent]:
        """Every event after the cursor, then each new one as it is appended; with
        `idle_timeout`, stop once that many seconds passed without a new event."""
        idle_since = time.monotonic()
        while True:
            found = self.poll()
            yield from found
            if found:
                idle_since = time.monotonic()
            elif idle_timeout is not None and time.monotonic() - idle_since >= idle_timeout:
                return
            else:
                time.sleep(self.interval)

    async def afollow(self, *, idle_timeout: float | None = None) -> AsyncIterator[StoredEvent]:
        """Async twin of `follow`."""
        loop = asyncio.get_running_loop()
        idle_since = loop.time()
        while True:
            found = await self.apoll()
            for event in found:
                yield event
            if found:
                idle_since = loop.time()
            elif idle_timeout is not None and loop.time() - idle_since >= idle_timeout:
                return
            else:
                await asyncio.sleep(self.interval)

    def _advance(self, events: list[StoredEvent]) -> list[StoredEvent]:
        if events:
            self._cursor = events[-1].cursor
        return events
