"""The storage of a tree: `MainStorage`, also named `SessionStorage` where a session's data is
all that is used.

`MainStorage` is one class (`stello_graph.checkpoints.BackendStorage` is the same class), the
type the core and the orchestration are written against. Every method has an async twin
prefixed with `a` (`get_session` / `aget_session`). The reference storages subclass it:
`SqliteMainStorage`, `InMemoryMainStorage` (SQLite `:memory:`) and `PostgresMainStorage`.
A new database is not another `MainStorage`: it implements the primitives of
`stello_graph.checkpoints.backend.StorageBackend`, and `MainStorage(backend)` builds all of this
on them.

Rules every storage keeps (the test suite holds the reference backends to them, and can be
pointed at a third):

* Reads of something missing return `None` (or an empty list); writes to a session that does
  not exist raise `SessionNotFoundError`.
* L3 is append-only apart from `trim_records`; records come back in the order they were
  appended, as LangChain message objects that belong to the caller: changing one changes
  nothing stored (`shared_records` is the one exception, for the core's prompts).
* `transaction()` makes every write inside it atomic and is re-entrant: a nested
  `transaction()` joins (as a savepoint) the outer one, so the orchestration can create a
  session and its `TopologyNode` atomically around calls that open transactions of their own.
* A `MainStorage` is bound to one tree: it never reads or writes another tree's data.
* The tree's event log (`append_event` / `events_after`) is append-only, ordered by a cursor
  that only grows, and shared by every process that opens the tree (`StoredEvents` follows
  it).
"""

from __future__ import annotations

from stello_graph.checkpoints._shell import MainStorage
from stello_graph.checkpoints._validate import RecordRole, normalize_role
from stello_graph.models import SessionSnapshot

__all__ = ["MainStorage", "RecordRole", "SessionSnapshot", "SessionStorage", "normalize_role"]

SessionStorage = MainStorage
"""`MainStorage`, by the seed's name for what a `Session` uses of it: one session's meta, L3
records, system prompt, insight, L2 and lease."""
