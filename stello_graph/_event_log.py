"""The agent's writer of the stored event log: its tree-changing events, appended off-thread.

An event is emitted wherever its work runs: a sync node in a worker thread, an async node on
the event loop, a scheduled job in the scheduler's thread. From sync code, `EventRecorder.record`
(an `EventBus` listener) appends it at once (inside the caller's transaction, if any); on the
event loop a storage write would block the loop, so it queues it instead, and one writer
thread appends what is queued, in order, batched into one transaction. `flush` waits until
everything queued so far is stored (the agent's `drain` and `close` call it); an event that
cannot be stored (the storage failed or was closed) is counted in `failed` and never breaks
the work that emitted it.
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
from typing import TYPE_CHECKING, Any

from stello_graph._cancelled import running_loop
from stello_graph.events import STORED_EVENT_TYPES, StelloEvent

if TYPE_CHECKING:
    from stello_graph.storage import MainStorage

__all__ = ["EventRecorder"]

_BATCH = 100
"""The most events appended in one transaction."""


class EventRecorder:
    """Appends the stored events (`STORED_EVENT_TYPES`) that reach it to `storage`'s event
    log, in order."""

    def __init__(self, storage: MainStorage) -> None:
        self._storage = storage
        self._queue: queue.SimpleQueue[StelloEvent | None] = queue.SimpleQueue()
        self._state = threading.Condition()  # an RLock: never contended for long
        self._pending = 0
        self._writer: threading.Thread | None = None
        self._closed = False
        self.failed = 0
        """Events that could not be stored."""

    def record(self, event: StelloEvent) -> None:
        """Store `event` if it is one of the stored kinds (an `EventBus` listener): at once
        from sync code, through the writer thread from the event loop (or while the writer
        still has events to store, which keeps them in order)."""
        if event.type not in STORED_EVENT_TYPES:
            return
        with self._state:
            if self._closed:
                return
            inline = not self._pending and running_loop() is None
            if not inline:
                self._pending += 1
                if self._writer is None:
                    self._writer = threading.Thread(
                        target=self._run, name="stello-event-log", daemon=True
                    )
                    self._writer.start()
        if inline:
            try:
                self._append(event)
            except Exception:  # a failing log must not break the work that emitted it
                self.failed += 1
            return
        self._queue.put(event)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every event queued so far is stored (or failed); False on timeout."""
        with self._state:
            return self._state.wait_for(lambda: not self._pending, timeout)

    def settle(self) -> None:
        """At the end of a sync operation: when it ran on the event loop (so its events were
        queued), wait until they are stored, so a sync call's events are stored when it
        returns wherever it ran (it blocked the loop anyway)."""
        if self._pending and running_loop() is not None:
            self.flush(10.0)

    async def aflush(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109
        """Async twin of `flush`: waits in a worker thread."""
        with self._state:
            if not self._pending:
                return True
        return await asyncio.to_thread(self.flush, timeout)

    def close(self, timeout: float | None = 10.0) -> None:
        """Store what is queued (waiting at most `timeout`), then stop the writer."""
        self.flush(timeout)
        with self._state:
            self._closed = True
            writer, self._writer = self._writer, None
        if writer is not None:
            self._queue.put(None)
            writer.join(timeout)

    # -- the writer thread ----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch, stop = [first], False
            while len(batch) < _BATCH:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                batch.append(more)
            self._write(batch)
            with self._state:
                self._pending -= len(batch)
                self._state.notify_all()
            if stop:
                return

    def _write(self, batch: list[StelloEvent]) -> None:
        try:
            with self._storage.transaction():
                for event in batch:
                    self._append(event)
        except Exception:  # store the others one by one: one bad event must not lose them
            for event in batch:
                try:
                    self._append(event)
                except Exception:
                    self.failed += 1

    def _append(self, event: StelloEvent) -> None:
        self._storage.append_event(event.type, event.session_id, _jsonable(event.data), at=event.at)


def _jsonable(data: dict[str, Any]) -> dict[str, Any]:
    """`data` as JSON can hold it (values JSON cannot encode become their `str`)."""
    try:
        json.dumps(data)
    except (TypeError, ValueError):
        converted: dict[str, Any] = json.loads(json.dumps(data, default=str))
        return converted
    return data
