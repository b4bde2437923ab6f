"""An LRU cache of decoded L3 records, so a turn does not decode the whole history again.

The cache mirrors what one SQLite connection sees of one tree. It stays exact because:

* this connection's own writes update it (`extend`, `drop_oldest`, `discard`), and its
  commits record the tree's change counter they leave (`committed`);
* another connection's commit changes `PRAGMA data_version`; `sync` then reads the tree's
  change counter (`stello_changes`, kept by triggers on every write to L3) and drops the
  cache only if it moved: a checkpointer writing its own tables in the file costs nothing;
* a rollback drops every session written since the transaction began (`forget_touched`),
  since the cache may hold changes that were just undone.

Lists in the cache are replaced, never mutated, so a list handed out earlier never changes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

__all__ = ["Lru", "RecordCache"]

V = TypeVar("V")


class Lru(Generic[V]):
    """Up to `size` values by session, the least recently used dropped first (0 keeps none)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: OrderedDict[str, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def get(self, session_id: str) -> V | None:
        value = self._entries.get(session_id)
        if value is not None:
            self._entries.move_to_end(session_id)
        return value

    def put(self, session_id: str, value: V) -> None:
        if self._size <= 0:
            return
        self._entries[session_id] = value
        self._entries.move_to_end(session_id)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def pop(self, session_id: str) -> V | None:
        return self._entries.pop(session_id, None)


class RecordCache(Lru["list[BaseMessage]"]):
    """Decoded records of up to `size` sessions (0 disables the cache)."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self._data_version: int | None = None
        self._version: int | None = None
        self._touched: set[str] = set()

    @property
    def enabled(self) -> bool:
        return self._size > 0

    @property
    def touched(self) -> bool:
        """Whether this connection changed some session's records since the last settle."""
        return bool(self._touched)

    def sync(self, data_version: int, read_version: Callable[[], int]) -> None:
        """Drop everything if another connection changed the tree's L3 since the last call.

        `read_version()` (the tree's change counter) is only called when `data_version`
        shows that another connection committed something.
        """
        if data_version == self._data_version:
            return
        self._data_version = data_version
        version = read_version()
        if version != self._version:
            self._entries.clear()
            self._version = version

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
        """The transaction ended: nothing it touched can be undone any more."""
        self._touched.clear()

    def committed(self, version: int | None) -> None:
        """This connection committed, leaving the tree's change counter at `version` (`None`:
        not read, as the transaction touched no session's records)."""
        if version is not None:
            self._version = version
        self.settle()

    def forget_touched(self) -> None:
        """A transaction (or savepoint) rolled back: drop what it may have changed."""
        for session_id in self._touched:
            self._entries.pop(session_id, None)
