"""An LRU cache of decoded L3 records, so a turn does not decode the whole history again.

The cache mirrors what one SQLite connection sees. It stays exact because:

* this connection's own writes update it (`extend`, `drop_oldest`, `discard`);
* another connection's commit changes `PRAGMA data_version`, and `sync` then drops it all;
* a rollback drops every session written since the transaction began (`forget_touched`),
  since the cache may hold changes that were just undone.

Lists in the cache are replaced, never mutated, so a list handed out earlier never changes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from langchain_core.messages import BaseMessage

__all__ = ["RecordCache"]


class RecordCache:
    """Decoded records of up to `size` sessions (0 disables the cache)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: OrderedDict[str, list[BaseMessage]] = OrderedDict()
        self._data_version: int | None = None
        self._touched: set[str] = set()

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self._data_version = None

    def sync(self, data_version: int) -> None:
        """Drop everything if another connection committed since the last call."""
        if data_version != self._data_version:
            self._entries.clear()
            self._data_version = data_version

    def get(self, session_id: str) -> list[BaseMessage] | None:
        records = self._entries.get(session_id)
        if records is not None:
            self._entries.move_to_end(session_id)
        return records

    def put(self, session_id: str, records: list[BaseMessage]) -> None:
        if self._size <= 0:
            return
        self._entries[session_id] = records
        self._entries.move_to_end(session_id)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def extend(self, session_id: str, decode: Callable[[], list[BaseMessage]]) -> None:
        """Add appended records to a cached session (`decode` is only called if cached)."""
        self._touched.add(session_id)
        records = self._entries.get(session_id)
        if records is not None:
            self._entries[session_id] = records + decode()

    def drop_oldest(self, session_id: str, count: int) -> None:
        self._touched.add(session_id)
        records = self._entries.get(session_id)
        if records is not None:
            self._entries[session_id] = records[count:]

    def discard(self, session_id: str) -> None:
        self._touched.add(session_id)
        self._entries.pop(session_id, None)

    def settle(self) -> None:
        """The transaction committed: what the cache holds is now durable."""
        self._touched.clear()

    def forget_touched(self) -> None:
        """A transaction (or savepoint) rolled back: drop what it may have changed."""
        for session_id in self._touched:
            self._entries.pop(session_id, None)
