"""Removing sessions from a PostgreSQL database removes their turn threads' checkpoint rows in
the same transaction, and `open_postgres`'s saver writes nothing of a thread whose session is
gone, not even one whose write began while the removal was under way: a kill between the
steps of a removal left the rows for good, and a turn that ran on while its session was
removed (by another process) stored its text after the removal.
"""

from __future__ import annotations

import threading
import time
from contextlib import suppress

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint

from stello_graph._ids import legacy_thread_id, thread_id
from stello_graph.checkpoints import PostgresMainStorage, StelloPostgresSaver, open_postgres
from stello_graph.checkpoints._postgres_saver import postgres_saver
from stello_graph.models import SessionMeta, TopologyNode

ODD_TREE, ODD_SESSION = "team:x/ü", "notes é:1 €😀"  # ids whose thread id escapes them


def _rows(dsn: str, thread: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM checkpoints WHERE thread_id = %(t)s)"
            " + (SELECT count(*) FROM checkpoint_blobs WHERE thread_id = %(t)s)"
            " + (SELECT count(*) FROM checkpoint_writes WHERE thread_id = %(t)s)",
            {"t": thread},
        ).fetchone()
    assert row is not None
    return int(row[0])


def _put(saver: StelloPostgresSaver, thread: str) -> None:
    """A checkpoint with a blob (the user's text) and a pending write: 3 rows."""
    config: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"messages": ["the secret plan"]}
    checkpoint["channel_versions"] = {"messages": "1"}
    stored = saver.put(config, checkpoint, {"source": "loop", "step": 0}, {"messages": "1"})
    saver.put_writes(stored, [("messages", "the secret plan, step two")], "task-1")


def _sessions(dsn: str, tree: str, *ids: str) -> None:
    with PostgresMainStorage(dsn, tree_id=tree) as storage:
        storage.put_session(SessionMeta(id="main", label="main", role="main"))
        storage.put_node(TopologyNode(id="main", parent_id=None, label="main"))
        for sid in ids:
            storage.put_session(SessionMeta(id=sid, label=sid, role="standard"))
            storage.put_node(TopologyNode(id=sid, parent_id="main", label=sid))


def test_removing_sessions_deletes_their_threads_in_its_transaction(postgres_dsn: str) -> None:
    _sessions(postgres_dsn, "default", "a", "b")
    storage, saver = open_postgres(postgres_dsn)
    threads = [thread_id("default", "a"), legacy_thread_id("default", "a")]
    for thread in [*threads, thread_id("default", "b"), "someone-else's"]:
        _put(saver, thread)
    assert [_rows(postgres_dsn, thread) for thread in threads] == [3, 3]
    with suppress(RuntimeError), storage.transaction():
        storage.remove_node("a")
        raise RuntimeError("rolled back")  # the deletes go with the removal's transaction
    assert storage.get_session("a") is not None
    assert [_rows(postgres_dsn, thread) for thread in threads] == [3, 3]
    assert storage.remove_node("a") == ["a"]  # the storage alone: no saver call after it
    assert [_rows(postgres_dsn, thread) for thread in threads] == [0, 0]
    assert _rows(postgres_dsn, thread_id("default", "b")) == 3
    assert _rows(postgres_dsn, "someone-else's") == 3
    storage.close()
    saver.close()


def test_the_saver_writes_nothing_of_a_removed_sessions_thread(postgres_dsn: str) -> None:
    _sessions(postgres_dsn, "default", "a", "b")
    _sessions(postgres_dsn, ODD_TREE, ODD_SESSION, "gone")
    storage, saver = open_postgres(postgres_dsn)
    storage.remove_node("a")
    with PostgresMainStorage(postgres_dsn, tree_id=ODD_TREE) as odd:
        odd.remove_node("gone")
    written = [
        thread_id("default", "b"),
        thread_id(ODD_TREE, ODD_SESSION),  # its ids read back from the escaped thread id
        thread_id("other-tree", "b"),  # a tree stored elsewhere
        "someone-else's",
        "stello/not/a/session",
        "stello/%FF/x",  # no text's escapes: no stello thread
        "stello/a%00/b",
    ]
    for thread in [thread_id("default", "a"), thread_id(ODD_TREE, "gone"), *written]:
        _put(saver, thread)
    assert _rows(postgres_dsn, thread_id("default", "a")) == 0
    assert _rows(postgres_dsn, thread_id(ODD_TREE, "gone")) == 0
    assert [_rows(postgres_dsn, thread) for thread in written] == [3] * len(written)
    storage.close()
    saver.close()


def _waits_for_a_lock(dsn: str, writer: threading.Thread) -> None:
    """Until a statement of another connection waits for a lock (or `writer` is done)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(500):
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database()"
            ).fetchone()
            if (row is not None and row[0]) or not writer.is_alive():
                return
            time.sleep(0.01)


def test_a_write_that_began_during_the_removal_stores_nothing(postgres_dsn: str) -> None:
    _sessions(postgres_dsn, "default", "a")
    storage, saver = open_postgres(postgres_dsn)
    thread = thread_id("default", "a")
    failed: list[BaseException] = []

    def write() -> None:
        try:
            _put(saver, thread)
        except BaseException as exc:
            failed.append(exc)

    writer = threading.Thread(target=write)
    with storage.transaction():
        assert storage.remove_node("a") == ["a"]  # deleted, not yet committed
        writer.start()  # as a turn of another process, writing its next step
        _waits_for_a_lock(postgres_dsn, writer)  # it reads the session only once we commit
    writer.join(30)
    assert not writer.is_alive() and not failed
    assert _rows(postgres_dsn, thread) == 0
    storage.close()
    saver.close()


def test_a_saver_on_a_database_without_the_storage_writes_every_thread(
    postgres_dsn: str,
) -> None:
    saver = postgres_saver(postgres_dsn)
    _put(saver, thread_id("default", "a"))
    saver.close()
    assert _rows(postgres_dsn, thread_id("default", "a")) == 3
