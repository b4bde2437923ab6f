"""Multi-step operations written once, driven sync or async (httpx's `Auth.auth_flow`).

An operation that reads, computes and writes (a turn's context, a commit, a consolidation)
is a generator that yields the `Step`s it needs and receives each one's result; `run` drives
it with the sync storage methods and `arun` with their async twins. The logic between the
steps exists once, so the sync and the async operation cannot drift apart:

    >>> def flow(session_id):
    ...     count = yield Storage(MainStorage.count_records, session_id)
    ...     return count + 1
    >>> from stello_graph.checkpoints import InMemoryMainStorage
    >>> from stello_graph.storage import MainStorage
    >>> run(flow("s1"), InMemoryMainStorage())
    1
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

__all__ = ["Atomic", "Call", "Flow", "Step", "Storage", "arun", "run"]

T = TypeVar("T")
P = ParamSpec("P")


class Storage:
    """A call of a storage method, named by the protocol's own function:
    `Storage(MainStorage.get_session, session_id)` calls the storage's `get_session` when
    driven sync and its `aget_session` twin when driven async. mypy checks the arguments
    against the protocol's signature, and a reader's go-to-definition lands on it."""

    __slots__ = ("args", "kwargs", "name")

    def __init__(
        self, method: Callable[Concatenate[Any, P], object], /, *args: P.args, **kwargs: P.kwargs
    ) -> None:
        self.name = method.__name__
        self.args = args
        self.kwargs = kwargs

    def run(self, storage: object) -> Any:
        return getattr(storage, self.name)(*self.args, **self.kwargs)

    async def arun(self, storage: object) -> Any:
        return await getattr(storage, f"a{self.name}")(*self.args, **self.kwargs)


@dataclass(frozen=True, slots=True)
class Call:
    """Any other I/O: `sync(*args)` when driven sync, `await async_(*args)` when async."""

    sync: Callable[..., Any]
    async_: Callable[..., Awaitable[Any]]
    args: tuple[Any, ...] = ()

    def run(self, storage: object) -> Any:
        return self.sync(*self.args)

    async def arun(self, storage: object) -> Any:
        return await self.async_(*self.args)


@dataclass(frozen=True, slots=True)
class Atomic:
    """A nested flow run in one storage transaction (`transaction()` / `atransaction()`).

    The flow is all or nothing: a failed step ends it (no flow goes on after one), so on
    the stello storages the transaction sets no savepoint per step (`savepoints=False`)."""

    flow: Generator[Step, Any, Any]

    def run(self, storage: Any) -> Any:
        with storage.transaction(**_whole(storage, "transaction")):
            return run(self.flow, storage)

    async def arun(self, storage: Any) -> Any:
        async with storage.atransaction(**_whole(storage, "atransaction")):
            return await arun(self.flow, storage)


def _whole(storage: object, method: str) -> dict[str, bool]:
    """The arguments of an all-or-nothing transaction, where the storage's `method` (not
    overridden by a subclass) takes them."""
    marked = getattr(getattr(type(storage), method, None), "stello_whole_blocks", False)
    return {"savepoints": False} if marked else {}


Step = Storage | Call | Atomic


class Runs(Protocol):
    """What a driver needs of a step: run it sync or async against its target. The storage's
    own primitive flows (`checkpoints._flows.Op`) are driven by the same two drivers."""

    def run(self, target: Any, /) -> Any: ...

    async def arun(self, target: Any, /) -> Any: ...


Flow = Generator[Step, Any, T]
"""An operation: yields steps, receives their results, returns its own."""


def run(flow: Generator[Runs, Any, T], storage: object) -> T:
    """Drive `flow` with the sync methods of `storage`; return what it returns."""
    try:
        step = next(flow)
        while True:
            try:
                value = step.run(storage)
            except Exception as exc:  # raised where the flow yielded, as in plain code
                step = flow.throw(exc)
                continue
            step = flow.send(value)
    except StopIteration as stop:
        result: T = stop.value
        return result
    finally:
        flow.close()


async def arun(flow: Generator[Runs, Any, T], storage: object) -> T:
    """Drive `flow` with the async twins of the methods of `storage`."""
    try:
        step = next(flow)
        while True:
            try:
                value = await step.arun(storage)
            except Exception as exc:  # raised where the flow yielded, as in plain code
                step = flow.throw(exc)
                continue
            step = flow.send(value)
    except StopIteration as stop:
        result: T = stop.value
        return result
    finally:
        flow.close()
