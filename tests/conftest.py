"""Shared fixtures: one per real resource, parametrised over the storage backends."""

from __future__ import annotations

import importlib
import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import pytest

from stello_graph.checkpoints import BackendStorage, InMemoryMainStorage, SqliteMainStorage
from stello_graph.storage import MainStorage
from tests._postgres import POSTGRES

Mode = Literal["sync", "async"]
Storage = BackendStorage

_THIRD_PARTY = os.environ.get("STELLO_TEST_STORAGE", "")
"""`module:function` of a storage to hold to the suites as well: `function(tmp_path,
tree_id)` returns a fresh `BackendStorage` (see `stello_graph.checkpoints.backend`)."""

BACKENDS = [
    "memory",
    "sqlite",
    "composed",
    *(["postgres"] if POSTGRES.wanted else []),
    *(["third-party"] if _THIRD_PARTY else []),
]
"""Every storage the suites parametrised over backends run on. `composed` is a
`BackendStorage` over a separate backend object with the required primitives only, as a
minimal third-party backend is used;
`postgres` runs when a PostgreSQL is there (see `tests._postgres`)."""


def _third_party_factory() -> Callable[[Path, str], Storage]:
    module, _, name = _THIRD_PARTY.partition(":")
    factory: Callable[[Path, str], Storage] = getattr(importlib.import_module(module), name)
    return factory


def open_storage(backend: str, tmp_path: Path, *, tree_id: str = "default") -> Storage:
    """A fresh storage of the named backend (one of `BACKENDS`; files go in `tmp_path`)."""
    if backend == "memory":
        return InMemoryMainStorage(tree_id=tree_id)
    if backend == "composed":
        from tests.storage._third_party import RequiredOnly

        minimal: Any = RequiredOnly(InMemoryMainStorage(tree_id=tree_id))
        return BackendStorage(minimal, tree_id=tree_id)
    if backend == "third-party":
        return _third_party_factory()(tmp_path, tree_id)
    if backend == "postgres":
        from stello_graph.checkpoints import PostgresMainStorage

        return PostgresMainStorage(POSTGRES.dsn_for(tmp_path), tree_id=tree_id)
    return SqliteMainStorage(tmp_path / "stello.db", tree_id=tree_id)


def pytest_report_header() -> str:
    return f"postgresql: {POSTGRES.describe()}"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not POSTGRES.available:
        terminalreporter.write_line(
            f"PostgreSQL tests SKIPPED: {POSTGRES.reason}. Install the server binaries "
            "(bash .ci/postgres.sh) or set STELLO_TEST_POSTGRES_DSN; "
            "STELLO_REQUIRE_POSTGRES=1 makes this a failure.",
            yellow=True,
            bold=True,
        )


def pytest_sessionfinish() -> None:
    POSTGRES.stop()


@pytest.fixture
def postgres_dsn(tmp_path: Path) -> str:
    """A DSN on an empty schema of the session's PostgreSQL (skipped, or failed when
    required, without one)."""
    return POSTGRES.dsn_for(tmp_path)


@pytest.fixture(params=BACKENDS)
def main_storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MainStorage]:
    """A `MainStorage` of each backend, closed after the test."""
    with open_storage(request.param, tmp_path) as storage:
        yield storage


class Api:
    """Drives a storage through its sync methods or through their async twins, by name.

    Written once, a test runs both ways: `await api("get_session", "s1")` calls
    `storage.get_session("s1")` in sync mode and `await storage.aget_session("s1")` in async
    mode.
    """

    def __init__(self, storage: MainStorage, mode: Mode) -> None:
        self.storage = storage
        self.mode = mode

    def __repr__(self) -> str:
        return f"Api({self.storage!r}, {self.mode!r})"

    async def __call__(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if self.mode == "sync":
            return getattr(self.storage, method)(*args, **kwargs)
        return await getattr(self.storage, f"a{method}")(*args, **kwargs)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        if self.mode == "sync":
            with self.storage.transaction():
                yield
        else:
            async with self.storage.atransaction():
                yield


@pytest.fixture(params=["sync", "async"])
def api(request: pytest.FixtureRequest, main_storage: MainStorage) -> Api:
    """`main_storage`, driven through its sync methods or its async twins."""
    return Api(main_storage, request.param)
