"""A fork that runs no function (`context="none"` or `"inherit"`) is one write transaction
with no read before it: its checks read the source in the transaction that writes the
child (on PostgreSQL every read before it was a round trip of its own). A context function
still gets the source's history before the transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from stello_graph import MainSession
from stello_graph._fork import ForkRequest, afork_session, fork_session
from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.errors import DuplicateLabelError, SessionNotFoundError
from stello_graph.models import TopologyNode


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[SqliteMainStorage]:
    with SqliteMainStorage(tmp_path / "a.db") as storage:
        yield storage


def _source(storage: SqliteMainStorage) -> str:
    main = MainSession.create(storage)
    storage.append_records(main.id, [HumanMessage("hello"), AIMessage("ok")], user_turn=True)
    return main.id


def _traced(storage: SqliteMainStorage) -> list[str]:
    seen: list[str] = []
    conn: sqlite3.Connection = storage._conn
    conn.set_trace_callback(lambda sql: seen.append(" ".join(sql.split())))
    return seen


def _own(seen: list[str]) -> list[str]:
    """The statements the fork sent (trigger bodies and savepoints left out)."""
    skipped = ("INSERT INTO stello_changes", "SAVEPOINT", "RELEASE", "PRAGMA data_version")
    return [s for s in seen if not s.startswith(skipped)]


@pytest.mark.parametrize("context", ["none", "inherit"])
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_fork_without_a_function_is_one_transaction(
    storage: SqliteMainStorage, context: str, mode: str
) -> None:
    source = _source(storage)
    seen = _traced(storage)
    request = ForkRequest.build(source, "Topic", context=context)
    if mode == "sync":
        child = fork_session(storage, request)
    else:
        child = await afork_session(storage, request)
    storage._conn.set_trace_callback(None)
    statements = _own(seen)
    assert statements[0].startswith("BEGIN") and statements[-1] == "COMMIT", statements
    assert sum(s.startswith("BEGIN") for s in statements) == 1, statements
    expected = ["hello", "ok"] if context == "inherit" else []
    assert [m.content for m in storage.list_records(child.id)] == expected
    assert storage.get_node(child.id) == TopologyNode(id=child.id, parent_id=source, label="Topic")


def test_a_context_function_reads_the_source_before_its_transaction(
    storage: SqliteMainStorage,
) -> None:
    source = _source(storage)
    got: list[int] = []

    def keep_last(records: list[BaseMessage]) -> list[BaseMessage]:
        got.append(len(records))
        return records[-1:]

    seen = _traced(storage)
    child = fork_session(storage, ForkRequest.build(source, "Topic", context=keep_last))
    storage._conn.set_trace_callback(None)
    assert got == [2]
    statements = _own(seen)
    assert not statements[0].startswith("BEGIN")  # the history the function gets, read first
    assert sum(s.startswith("BEGIN") for s in statements) == 1, statements
    assert [m.content for m in storage.list_records(child.id)] == ["ok"]


@pytest.mark.parametrize("context", ["none", "inherit"])
def test_the_checks_still_refuse_in_the_one_transaction(
    storage: SqliteMainStorage, context: str
) -> None:
    source = _source(storage)
    fork_session(storage, ForkRequest.build(source, "Topic"))
    before = storage.list_sessions()
    taken = ForkRequest.build(source, "topic", context=context, unique_label=True)
    with pytest.raises(DuplicateLabelError):
        fork_session(storage, taken)
    with pytest.raises(SessionNotFoundError):
        fork_session(storage, ForkRequest.build("missing", "Other", context=context))
    assert storage.list_sessions() == before
