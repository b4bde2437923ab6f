"""The LangGraph store stello mirrors its memory to: which store, and how it is written.

The store is the one `StelloConfig.store` names, else the one of the run (the store the
graph was compiled with, or the one LangGraph Server gives every run: `get_store()`), else
the one a background job was queued with (a job queued by a turn keeps its run's store).

Writes (`StoreWrite`: put a value, or delete with `None`) are computed once and applied by
`write_store` (sync methods) or `awrite_store` (async methods, so `AsyncPostgresStore` works
on its loop). The memory they mirror is already written when they run, so a store that fails
is a background failure (`kind="store"`, kept and announced as `background_error`), never a
failed consolidation or integration. A sync write that an async-only store refuses because
it is made on that store's event loop (`AsyncPostgresStore`, LangGraph Server's store: a
sync helper inside an async node) is handed to the loop as a task instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import traceback
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from langgraph.config import get_store
from langgraph.store.base import BaseStore, Item

from stello_graph._cancelled import running_loop
from stello_graph._flow import Flow, Storage, arun, run
from stello_graph._ids import store_label
from stello_graph.events import emit
from stello_graph.schedule import BackgroundFailure, StorageFailureLog

if TYPE_CHECKING:
    from stello_graph.nodes.deps import StelloRuntime

__all__ = [
    "DeleteIf",
    "StoreWrite",
    "awrite_store",
    "current_store",
    "job_store",
    "namespace",
    "write_store",
]


@dataclass(frozen=True, slots=True)
class DeleteIf:
    """A write that deletes the key only while its stored `field` still equals `value`."""

    field: str
    value: Any

    def holds(self, item: Item | None) -> bool:
        return item is not None and item.value.get(self.field) == self.value


StoreWrite: TypeAlias = tuple[tuple[str, ...], str, "dict[str, Any] | DeleteIf | None"]
"""`(namespace, key, value)`: put `value` under `key`, delete the key when it is `None`, or
delete it on a condition (`DeleteIf`)."""

_job_store: ContextVar[BaseStore | None] = ContextVar("stello_job_store", default=None)
_pending: set[asyncio.Task[None]] = set()  # writes handed to a loop, kept until they end
_pending_lock = threading.Lock()


def namespace(deps: StelloRuntime, *kind: str) -> tuple[str, ...]:
    """The store namespace of the tree's `kind` entries: `("stello", tree, *kind)`."""
    return ("stello", store_label(deps.storage.tree_id), *kind)


def current_store(deps: StelloRuntime) -> BaseStore | None:
    """The store to mirror to now (see the module docstring), or `None`."""
    if deps.store is not None:
        return deps.store
    with contextlib.suppress(RuntimeError):  # outside a run: no runnable context
        found = get_store()
        if found is not None:
            return found
    return _job_store.get()


@contextlib.contextmanager
def job_store(store: BaseStore | None) -> Iterator[None]:
    """Run a background job with the store of the run that queued it."""
    token = _job_store.set(store)
    try:
        yield
    finally:
        _job_store.reset(token)


def _report(deps: StelloRuntime, exc: Exception, session_id: str | None) -> None:
    if deps.scheduler is not None:
        deps.scheduler._record("store", session_id, exc, 1)
        return
    failure = BackgroundFailure(
        kind="store", session_id=session_id, error_type=type(exc).__name__,
        message=f"The store failed after the memory was written: {exc}", attempts=1,
        traceback="".join(traceback.format_exception(exc)),
    )  # fmt: skip
    with contextlib.suppress(Exception):  # a failing storage must not hide the store's error
        StorageFailureLog(deps.storage).append(failure)
    emit(deps.bus, "background_error", session_id, stream=False, kind="store",
         error_type=failure.error_type, message=failure.message, attempts=1)  # fmt: skip


def _apply(store: BaseStore, writes: Sequence[StoreWrite]) -> None:
    run(_apply_flow(writes), store)


async def _aapply(store: BaseStore, writes: Sequence[StoreWrite]) -> None:
    try:
        await arun(_apply_flow(writes), store)
    except NotImplementedError:  # a sync-only store (`SqliteStore`): its own API, off the loop
        await asyncio.to_thread(_apply, store, writes)


def _apply_flow(writes: Sequence[StoreWrite]) -> Flow[None]:
    """The writes as store calls (`BaseStore.get`, `.aget` when driven async, ...)."""
    for ns, key, value in writes:
        if isinstance(value, DeleteIf):
            if value.holds((yield Storage(BaseStore.get, ns, key))):
                yield Storage(BaseStore.delete, ns, key)
        elif value is None:
            yield Storage(BaseStore.delete, ns, key)
        else:
            yield Storage(BaseStore.put, ns, key, value)


def write_store(
    deps: StelloRuntime, writes: Sequence[StoreWrite], session_id: str | None = None
) -> None:
    """Apply `writes` to the current store; a failure is reported, never raised."""
    store = current_store(deps)
    if store is None or not writes:
        return
    try:
        _apply(store, writes)
    except asyncio.InvalidStateError as exc:  # an async store, called on its loop
        loop = running_loop()
        if loop is None:
            _report(deps, exc, session_id)
            return
        task = loop.create_task(_awrite(deps, store, list(writes), session_id))
        with _pending_lock:
            _pending.add(task)
        task.add_done_callback(_pending.discard)
    except Exception as exc:
        _report(deps, exc, session_id)


async def _awrite(
    deps: StelloRuntime, store: BaseStore, writes: Sequence[StoreWrite], session_id: str | None
) -> None:
    try:
        await _aapply(store, writes)
    except Exception as exc:
        await asyncio.to_thread(_report, deps, exc, session_id)  # the report writes storage


async def awrite_store(
    deps: StelloRuntime, writes: Sequence[StoreWrite], session_id: str | None = None
) -> None:
    """Async twin of `write_store`: the store's async methods, awaited."""
    store = current_store(deps)
    if store is not None and writes:
        await _awrite(deps, store, writes, session_id)


async def settled() -> None:
    """Wait for the writes `write_store` handed to this loop (for tests and shutdown)."""
    with _pending_lock:
        tasks = list(_pending)
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
