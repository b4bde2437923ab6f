"""Bad addresses, servers that are down or go away, and databases that are not stello's."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import psycopg
import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.base import empty_checkpoint
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from stello_graph import StelloAgent
from stello_graph.checkpoints import PostgresMainStorage
from stello_graph.checkpoints._postgres_saver import StelloPostgresSaver, postgres_saver
from stello_graph.checkpoints._postgres_schema import SCHEMA_VERSION
from stello_graph.errors import (
    ForeignDatabaseError,
    InvalidInputError,
    SchemaVersionError,
    StorageError,
    StorageUnavailableError,
)
from stello_graph.models import SessionMeta
from stello_graph.testing import ScriptedChatModel


def _schema_of(dsn: str) -> str:
    options = conninfo_to_dict(dsn)["options"]
    assert isinstance(options, str)
    return options.rsplit("=", 1)[1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


_OTHERS = (
    "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
    "AND backend_type = 'client backend'"
)


def _terminate_others(dsn: str, *, wait: bool = False) -> int:
    """End every other connection to the database (the server side of a lost connection);
    with `wait`, until their backends are gone (their goodbye sent to the client)."""
    with psycopg.connect(dsn, autocommit=True) as admin:
        rows = admin.execute(f"SELECT pg_terminate_backend(pid) {_OTHERS}").fetchall()
        for _ in range(500 if wait else 0):
            if not admin.execute(f"SELECT 1 {_OTHERS}").fetchall():
                break
            time.sleep(0.01)
    return len(rows)


def test_a_server_that_is_not_there(postgres_dsn: str) -> None:
    dsn = make_conninfo(postgres_dsn, port=str(_free_port()), connect_timeout="2")
    with pytest.raises(StorageUnavailableError) as caught:
        PostgresMainStorage(dsn)
    message = str(caught.value)
    assert "Cannot connect to PostgreSQL at 'postgresql://stello@127.0.0.1:" in message
    assert "server is running" in message
    assert isinstance(caught.value, StorageError)


def test_a_database_that_does_not_exist(postgres_dsn: str) -> None:
    with pytest.raises(StorageUnavailableError, match='database "no_such_db" does not exist'):
        PostgresMainStorage(make_conninfo(postgres_dsn, dbname="no_such_db"))


def test_a_password_is_never_shown(postgres_dsn: str) -> None:
    dsn = make_conninfo(postgres_dsn, port=str(_free_port()), password="s3cret")
    with pytest.raises(StorageUnavailableError) as caught:
        PostgresMainStorage(dsn)
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize("conninfo", ["host", "postgresql://[::1", 42])
def test_what_is_not_a_connection_string(conninfo: Any) -> None:
    with pytest.raises(InvalidInputError):
        PostgresMainStorage(conninfo)


def test_a_connection_lost_mid_transaction_stores_nothing_and_the_next_call_reconnects(
    postgres_dsn: str,
) -> None:
    with PostgresMainStorage(postgres_dsn) as storage:
        storage.put_session(SessionMeta(id="s", label="S"))
        lost = pytest.raises(StorageUnavailableError, match="was lost")
        with lost as caught, storage.transaction():
            storage.append_records("s", [HumanMessage("hi"), AIMessage("yo")])
            assert _terminate_others(postgres_dsn) >= 1
            storage.put_insight("s", "never stored")
        assert "retry" in str(caught.value)
        assert storage.count_records("s") == 0  # the next call reconnects
        assert storage.get_insight("s") is None
        assert storage.append_records("s", [HumanMessage("again")]) == 1


def test_a_connection_the_server_ended_between_calls_is_replaced_unseen(
    postgres_dsn: str,
) -> None:
    """A restart, or a terminated backend, between two calls costs no failed call: the
    connection's socket shows the server's goodbye, and it is replaced before use."""
    with PostgresMainStorage(postgres_dsn) as storage:
        storage.put_session(SessionMeta(id="s", label="S"))
        asyncio.run(storage.aget_session("s"))
        assert _terminate_others(postgres_dsn, wait=True) >= 1
        assert storage.get_session("s") is not None
        assert asyncio.run(storage.aget_session("s")) is not None
        storage.put_insight("s", "stored")
        assert storage.get_insight("s") == "stored"


async def test_an_async_connection_the_server_ended_is_replaced_unseen(
    postgres_dsn: str,
) -> None:
    with PostgresMainStorage(postgres_dsn) as storage:
        await storage.aput_session(SessionMeta(id="s", label="S"))
        assert _terminate_others(postgres_dsn, wait=True) >= 1
        assert await storage.aget_session("s") is not None


def test_a_pool_given_gets_its_ended_connections_replaced(postgres_dsn: str) -> None:
    pool: ConnectionPool[Any] = ConnectionPool(postgres_dsn, min_size=2, max_size=2, open=True)
    try:
        with PostgresMainStorage(pool) as storage:
            storage.put_session(SessionMeta(id="s", label="S"))
            assert _terminate_others(postgres_dsn, wait=True) >= 1
            assert storage.get_session("s") is not None
    finally:
        pool.close()


async def test_an_async_connection_lost_mid_transaction(postgres_dsn: str) -> None:
    with PostgresMainStorage(postgres_dsn) as storage:
        storage.put_session(SessionMeta(id="s", label="S"))
        hooks = storage.async_transaction_hooks
        assert await hooks.begin(wait=True)
        await storage.aop_set_fields("s", {"insight": "never stored"})
        _terminate_others(postgres_dsn)
        with pytest.raises(StorageUnavailableError):
            await storage.aop_set_fields("s", {"memory": "never stored"})
        await hooks.rollback()
        found = await storage.aop_read_session("s", ("insight", "memory"), False)
        assert found is not None and found[1] == (None, None)


@pytest.mark.parametrize(
    "ddl",
    [
        "CREATE TABLE stello_sessions (name text)",
        "CREATE TABLE stello_schema (id int, body text)",
    ],
    ids=["stello-named-table", "foreign-schema-table"],
)
def test_another_applications_tables_are_refused_and_left_alone(
    postgres_dsn: str, ddl: str
) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(ddl)
        conn.execute("CREATE TABLE users (name text)")  # not stello's name: fine alone
        before = conn.execute(_TABLES).fetchall()
    with pytest.raises(ForeignDatabaseError) as caught:
        PostgresMainStorage(postgres_dsn)
    assert "did not make (another application's)" in str(caught.value)
    assert isinstance(caught.value, StorageError)
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        assert conn.execute(_TABLES).fetchall() == before


_TABLES = """SELECT table_name, column_name FROM information_schema.columns
    WHERE table_schema = current_schema() ORDER BY table_name, column_name"""


def test_other_tables_of_the_database_are_not_foreign(postgres_dsn: str) -> None:
    """A server database is shared with the application (and LangGraph's checkpointer)."""
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE users (name text)")
        conn.execute("INSERT INTO users VALUES ('ada')")
    with PostgresMainStorage(postgres_dsn) as storage:
        storage.put_session(SessionMeta(id="s", label="S"))
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT name FROM users").fetchall() == [("ada",)]


def test_a_newer_schema_is_refused(postgres_dsn: str) -> None:
    PostgresMainStorage(postgres_dsn).close()
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO stello_schema VALUES (99, 'later')")
    with pytest.raises(SchemaVersionError, match="version 99"):
        PostgresMainStorage(postgres_dsn)


def test_opened_at_once_the_schema_is_migrated_once(postgres_dsn: str) -> None:
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def open_it() -> None:
        try:
            start.wait(timeout=10)
            PostgresMainStorage(postgres_dsn).close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        versions = conn.execute("SELECT version FROM stello_schema ORDER BY version").fetchall()
    assert versions == [(v,) for v in range(1, SCHEMA_VERSION + 1)]


def test_a_pool_given_is_used_and_left_open(postgres_dsn: str) -> None:
    with ConnectionPool(postgres_dsn, min_size=1, max_size=2, open=True) as pool:
        with PostgresMainStorage(pool, tree_id="alice") as storage:
            storage.put_session(SessionMeta(id="s", label="S"))
            with storage.transaction():
                storage.put_insight("s", "i")
            assert storage.get_insight("s") == "i"
        assert not pool.closed
        with pool.connection() as conn:
            assert conn.execute("SELECT insight FROM stello_sessions").fetchall() == [("i",)]


def test_the_tree_lock_times_out_with_a_clear_error(postgres_dsn: str) -> None:
    with (
        PostgresMainStorage(postgres_dsn) as holder,
        PostgresMainStorage(postgres_dsn, lock_timeout=0.2) as waiter,
    ):
        with holder.transaction():
            holder.put_session(SessionMeta(id="s", label="S"))
            with pytest.raises(StorageError, match="stayed locked by another connection"):
                waiter.put_session(SessionMeta(id="t", label="T"))
        assert waiter.get_session("t") is None
        assert _schema_of(postgres_dsn).startswith("stello_t")


# -- the checkpointer: a server gone away reaches the caller typed --------------------------
def _saver_calls(saver: Any, config: Any) -> dict[str, Any]:
    """Each call of the saver that reads or writes the database."""
    stored = {"configurable": {**config["configurable"], "checkpoint_id": "c1"}}
    checkpoint = {**empty_checkpoint(), "id": "c2"}
    return {
        "get_tuple": lambda: saver.get_tuple(config),
        "list": lambda: list(saver.list(config)),
        "put": lambda: saver.put(config, checkpoint, {"source": "loop", "step": 1}, {}),
        "put_writes": lambda: saver.put_writes(stored, [("channel", "value")], "task"),
        "delete_thread": lambda: saver.delete_thread("t"),
    }


def _saver_on_unchecked_pool(dsn: str) -> StelloPostgresSaver:
    """The saver on a pool of the user's that does not check its connections (the saver's
    own pool replaces one the server ended before it is used)."""
    pool: ConnectionPool[Any] = ConnectionPool(
        dsn,
        min_size=1,
        max_size=1,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        open=True,
    )
    saver = StelloPostgresSaver(pool)
    saver.setup()
    return saver


@pytest.mark.parametrize("call", ["get_tuple", "list", "put", "put_writes", "delete_thread"])
def test_a_checkpointer_that_lost_its_connection_raises_storage_unavailable(
    postgres_dsn: str, call: str
) -> None:
    saver = _saver_on_unchecked_pool(postgres_dsn)
    try:
        config: RunnableConfig = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        saver.put(config, {**empty_checkpoint(), "id": "c1"}, {"source": "input", "step": -1}, {})
        assert _terminate_others(postgres_dsn, wait=True) >= 1
        with pytest.raises(StorageUnavailableError, match="was lost or refused") as caught:
            _saver_calls(saver, config)[call]()
        assert isinstance(caught.value.__cause__, psycopg.OperationalError)
        assert "retry" in str(caught.value)
        _saver_calls(saver, config)[call]()  # the pool replaced the connection
    finally:
        saver.close()
        saver.conn.close()


@pytest.mark.parametrize("call", ["get_tuple", "list", "put", "put_writes", "delete_thread"])
def test_the_checkpointers_own_pool_replaces_an_ended_connection_unseen(
    postgres_dsn: str, call: str
) -> None:
    saver = postgres_saver(postgres_dsn)
    try:
        config: RunnableConfig = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        saver.put(config, {**empty_checkpoint(), "id": "c1"}, {"source": "input", "step": -1}, {})
        assert _terminate_others(postgres_dsn, wait=True) >= 1
        _saver_calls(saver, config)[call]()
    finally:
        saver.close()


def test_a_turn_goes_on_when_the_server_ends_its_idle_connections(postgres_dsn: str) -> None:
    """Every connection ended by the server in the middle of a turn's tool round (the
    storage's, the checkpointer's pool's, the lease keeper's), then between two turns: each
    is replaced before its next use, and the turns are stored once."""
    model = ScriptedChatModel(
        respond=lambda messages: (
            ScriptedChatModel.tool_call("_lookup", {"query": "x"})
            if messages[-1].type == "human"
            else "done"
        )
    )
    with StelloAgent(model=model, storage=postgres_dsn, tools=[_lookup]) as agent:
        sid = agent.main_session_id
        assert agent.turn(sid, "first").content == "done"
        _END_IN_CALL.append(postgres_dsn)
        assert agent.turn(sid, "second").content == "done"
        assert not _END_IN_CALL and _ENDED[-1] >= 2  # the storage's connection, the pool's
        assert _terminate_others(postgres_dsn, wait=True) >= 1
        assert agent.turn(sid, "third").content == "done"
        assert agent.storage.get_turn_count(sid) == 3
        texts = [m.text for m in agent.session(sid).messages() if m.type in ("human", "tool")]
        assert texts == ["first", "fact about x", "second", "fact about x", "third", "fact about x"]


_END_IN_CALL: list[str] = []
"""A database whose connections the next `_lookup` call ends (`_ENDED`: how many it ended)."""
_ENDED: list[int] = []


@tool
def _lookup(query: str) -> str:
    """Look a fact up."""
    if _END_IN_CALL:
        _ENDED.append(_terminate_others(_END_IN_CALL.pop(), wait=True))
    return f"fact about {query}"
