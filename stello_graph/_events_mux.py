"""The agent's event multiplexer: background events into the `custom` streams of turns.

Events a graph run emits reach its own `custom` stream through LangGraph's stream writer.
Events emitted outside any run (a scheduled consolidation, an archive) are forwarded to the
custom streams running at that moment, or kept (the newest 100) for the next one. The
agent's own operations (fork, consolidate, integrate) run outside a graph but were asked
for by the caller, who gets their result: `quiet()` keeps their events off the streams, as
a graph run of them would.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from stello_graph.events import StelloEvent

__all__ = ["EventMux"]

_QUIET: contextvars.ContextVar[bool] = contextvars.ContextVar("stello_quiet", default=False)


class EventMux:
    """Background events of one agent, fanned out to the custom streams of its turns."""

    def __init__(self, keep: int = 100) -> None:
        self._streams: list[queue.SimpleQueue[StelloEvent]] = []
        self._lock = threading.Lock()
        self._undelivered: deque[StelloEvent] = deque(maxlen=keep)

    @staticmethod
    @contextmanager
    def quiet() -> Iterator[None]:
        """Keep the events emitted inside (in this context) off the custom streams."""
        token = _QUIET.set(True)
        try:
            yield
        finally:
            _QUIET.reset(token)

    @staticmethod
    def is_quiet() -> bool:
        """Whether the running code is inside `quiet()`: one of the agent's own operations,
        asked for by its caller, whose events are its result rather than background work."""
        return _QUIET.get()

    def forward(self, event: StelloEvent) -> None:
        """Background events go to the custom streams running now, else to the next one."""
        if event.streamed or self.is_quiet():
            return
        with self._lock:
            targets = list(self._streams)
            if not targets:
                self._undelivered.append(event)
        for q in targets:
            q.put(event)

    def open(self) -> queue.SimpleQueue[StelloEvent]:
        """A queue of the background events for one stream (the kept ones first)."""
        q: queue.SimpleQueue[StelloEvent] = queue.SimpleQueue()
        with self._lock:
            while self._undelivered:
                q.put(self._undelivered.popleft())
            self._streams.append(q)
        return q

    def close(self, q: queue.SimpleQueue[StelloEvent]) -> None:
        with self._lock:
            self._streams.remove(q)

    @staticmethod
    def from_model(item: Any, multi: bool) -> bool:
        """Whether a stream item may be shown: `messages` items only from the `model` node,
        and only its replies (not the user message the turn's first round records)."""
        from langchain_core.messages import AIMessage

        mode, data = item if multi else ("messages", item)
        if mode != "messages":
            return True
        message, metadata = data
        return bool(metadata.get("langgraph_node") == "model") and isinstance(message, AIMessage)

    @staticmethod
    def drain(q: queue.SimpleQueue[StelloEvent], modes: list[str], multi: bool) -> Iterator[Any]:
        """The events queued for a stream so far, as its `custom` items."""
        if "custom" not in modes:
            return
        while not q.empty():  # the stream's own queue: nothing else takes from it
            event = q.get_nowait()
            yield ("custom", event.as_dict()) if multi else event.as_dict()
