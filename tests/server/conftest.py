"""The server suite's fixtures: one `langgraph dev` for the whole run (`make test-server`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient

from tests.server.langgraph_dev import DevServer, running_server

MAX_OPEN_TREES = 3
"""The server's `STELLO_MAX_OPEN_TREES`: small, so the suite's trees are closed and reopened."""


@pytest.fixture(scope="session")
def dev_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    """`langgraph dev` serving `stello` on a SQLite file, with the suite's tools, keeping
    `MAX_OPEN_TREES` trees open."""
    workdir: Path = tmp_path_factory.mktemp("langgraph-dev")
    with running_server(
        workdir,
        STELLO_MODEL="scripted",
        STELLO_DATABASE_URI=str(workdir / "trees.db"),
        STELLO_TOOLS="tests.server._tools:TOOLS",
        STELLO_MAX_OPEN_TREES=str(MAX_OPEN_TREES),
    ) as server:
        yield server


@pytest.fixture
async def client(dev_server: DevServer) -> AsyncIterator[LangGraphClient]:
    """A `langgraph-sdk` client of the server, closed after the test."""
    found = get_client(url=dev_server.url, timeout=30.0)
    try:
        yield found
    finally:
        await found.http.client.aclose()
