"""Transactions, threads and asyncio: both backends."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from stello_graph.errors import SessionNotFoundError, StorageError
from stello_graph.models import SessionMeta, TopologyNode
from stello_graph.storage import MainStorage
from tests.conftest import Api


class Boom(Exception):
    """Raised on purpose inside transactions."""


Body = Callable[[], Awaitable[None]]


def _sync_io_on_loop(storage: MainStorage) -> bool:
    """Whether the storage's sync side can join an async transaction on the loop's own thread:
    every backend but a database server's, whose async transaction is on a connection that
    only the loop can drive (PostgreSQL)."""
    return type(storage).__name__ != "PostgresMainStorage"


def contents(messages: list[BaseMessage]) -> list[str]:
    return [str(message.content) for message in messages]


def run_threads(count: int, work: Callable[[int], None]) -> None:
    """Run `work(i)` in `count` threads started together; re-raise the first failure."""
    barrier = threading.Barrier(count)
    errors: list[BaseException] = []

    def target(index: int) -> None:
        try:
            barrier.wait()
            work(index)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a thread is stuck"
    if errors:
        raise errors[0]


async def abort_after(
    transaction: Callable[[], AbstractAsyncContextManager[None]], body: Body
) -> None:
    """Run `body` inside `transaction()`, then raise `Boom` in it; check that `Boom` came out."""

    async def run() -> None:
        async with transaction():
            await body()
            raise Boom

    with pytest.raises(Boom):
        await run()


# -- atomicity (sync and async) ---------------------------------------------------------------
async def test_exception_inside_transaction_writes_nothing(api: Api) -> None:
    await api("put_session", SessionMeta(id="old", label="before"))
    await api("append_records", "old", [HumanMessage("before")], user_turn=True)
    await api("put_global", "kept", "before")

    async def write_everything() -> None:
        await api("put_session", SessionMeta(id="new", label=""))
        await api("put_node", TopologyNode(id="new"))
        await api("append_records", "new", [HumanMessage("x")], user_turn=True)
        await api("append_records", "old", [HumanMessage("during")], user_turn=True)
        await api("put_session", SessionMeta(id="old", label="during"))
        await api("put_memory", "old", "m", through=2)
        await api("put_insight", "old", "i")
        await api("put_system_prompt", "old", "p")
        await api("put_global", "g", 1)
        await api("put_global", "kept", "during")
        assert contents(await api("list_records", "old")) == ["before", "during"]
        assert await api("get_turn_count", "old") == 2

    await abort_after(api.transaction, write_everything)
    assert await api("get_session", "new") is None
    assert await api("get_tree") == []
    assert (await api("get_session", "old")).label == "before"
    assert contents(await api("list_records", "old")) == ["before"]
    assert await api("get_turn_count", "old") == 1
    assert await api("get_memory", "old") is None
    assert await api("get_insight", "old") is None
    assert await api("get_system_prompt", "old") is None
    assert await api("get_global", "g") is None
    assert await api("get_global", "kept") == "before"


async def test_rolled_back_removal_and_trim_restore_everything(api: Api) -> None:
    for sid, parent in [("main", None), ("a", "main"), ("b", "main"), ("c", "main")]:
        await api(
            "put_session", SessionMeta(id=sid, label=sid, role="main" if not parent else "standard")
        )
        await api("put_node", TopologyNode(id=sid, parent_id=parent, label=sid))
        await api("append_records", sid, [HumanMessage(f"{sid}1"), HumanMessage(f"{sid}2")])
        await api("put_memory", sid, f"L2 {sid}", through=2)
    before = (
        await api("list_sessions"),
        await api("get_tree"),
        await api("get_all_session_l2s"),
    )

    async def remove_and_trim() -> None:
        await api("remove_node", "b")
        await api("trim_records", "a", 1)
        assert await api("list_records", "a") == [HumanMessage("a2")]

    await abort_after(api.transaction, remove_and_trim)
    after = (
        await api("list_sessions"),
        await api("get_tree"),
        await api("get_all_session_l2s"),
    )
    assert after == before
    assert contents(await api("list_records", "a")) == ["a1", "a2"]
    assert contents(await api("list_records", "b")) == ["b1", "b2"]
    assert await api("get_memory_through", "a") == 2


async def test_nested_rollback_keeps_outer_writes(api: Api) -> None:
    async with api.transaction():
        await api("put_session", SessionMeta(id="outer", label=""))
        await api("append_records", "outer", [HumanMessage("kept")])

        async def inner_writes() -> None:
            await api("put_session", SessionMeta(id="inner", label=""))
            await api("append_records", "outer", [HumanMessage("undone")])
            assert await api("count_records", "outer") == 2

        await abort_after(api.transaction, inner_writes)
        await api("append_records", "outer", [HumanMessage("after")])
    assert await api("get_session", "inner") is None
    assert contents(await api("list_records", "outer")) == ["kept", "after"]


async def test_nested_commit_is_undone_by_outer_rollback(api: Api) -> None:

    async def nested_commit() -> None:
        async with api.transaction():
            await api("put_session", SessionMeta(id="s", label=""))
        assert await api("get_session", "s") is not None

    await abort_after(api.transaction, nested_commit)
    assert await api("get_session", "s") is None


async def test_failed_write_inside_transaction_leaves_the_rest(api: Api) -> None:
    async with api.transaction():
        await api("put_session", SessionMeta(id="s", label=""))
        with pytest.raises(SessionNotFoundError):
            await api("append_records", "missing", [HumanMessage("x")])
        await api("put_global", "k", "v")
    assert await api("get_session", "s") is not None
    assert await api("get_global", "k") == "v"


async def test_transaction_commits_on_success(api: Api) -> None:
    async with api.transaction():
        await api("put_session", SessionMeta(id="s", label=""))
        await api("append_records", "s", [HumanMessage("x")], user_turn=True)
    assert await api("count_records", "s") == 1
    assert await api("get_turn_count", "s") == 1


def test_close_inside_transaction_is_refused(main_storage: MainStorage) -> None:
    with main_storage.transaction(), pytest.raises(StorageError):
        main_storage.close()


# -- threads ----------------------------------------------------------------------------------
def test_threads_append_without_loss_or_duplicates(main_storage: MainStorage) -> None:
    threads, batches = 8, 40
    main_storage.put_session(SessionMeta(id="shared", label=""))
    for t in range(threads):
        main_storage.put_session(SessionMeta(id=f"own{t}", label=""))

    def work(t: int) -> None:
        for j in range(batches):
            pair = [HumanMessage(f"{t}:{j}"), AIMessage(f"{t}:{j}")]
            main_storage.append_records(f"own{t}", pair, user_turn=True)
            main_storage.append_records("shared", pair, user_turn=True)
            assert len(main_storage.list_records(f"own{t}")) == 2 * (j + 1)

    run_threads(threads, work)
    shared = contents(main_storage.list_records("shared"))
    assert len(shared) == threads * batches * 2
    assert shared[0::2] == shared[1::2]  # each batch stayed in one piece
    assert len(set(shared[0::2])) == threads * batches  # none lost, none doubled
    for t in range(threads):
        mine = [int(text.split(":")[1]) for text in shared[0::2] if text.startswith(f"{t}:")]
        assert mine == list(range(batches))  # each thread's order kept
        assert main_storage.count_records(f"own{t}") == batches * 2
        assert main_storage.get_turn_count(f"own{t}") == batches
    assert main_storage.get_turn_count("shared") == threads * batches


def test_transactions_in_threads_lose_no_update(main_storage: MainStorage) -> None:
    def work(_: int) -> None:
        for _ in range(25):
            with main_storage.transaction():
                value = main_storage.get_global("n") or 0
                time.sleep(0)
                main_storage.put_global("n", value + 1)

    run_threads(8, work)
    assert main_storage.get_global("n") == 200


def test_other_threads_wait_for_a_transaction(main_storage: MainStorage) -> None:
    inside, seen = threading.Event(), []

    def writer() -> None:
        with main_storage.transaction():
            main_storage.put_global("n", "uncommitted")
            inside.set()
            time.sleep(0.2)
            main_storage.put_global("n", "committed")

    thread = threading.Thread(target=writer)
    thread.start()
    assert inside.wait(5)
    seen.append(main_storage.get_global("n"))
    thread.join()
    assert seen == ["committed"]


def test_thread_with_a_copied_context_waits_for_the_transaction(
    main_storage: MainStorage,
) -> None:
    seen: list[object] = []
    with main_storage.transaction():
        main_storage.put_global("n", "uncommitted")
        context = contextvars.copy_context()  # holds this transaction's ownership token
        reader = threading.Thread(target=context.run, args=(read_global, main_storage, seen))
        reader.start()
        reader.join(0.2)
        assert reader.is_alive()  # it waits for the lock instead of joining the transaction
        main_storage.put_global("n", "committed")
    reader.join(5)
    assert seen == ["committed"]


def read_global(storage: MainStorage, seen: list[object]) -> None:
    seen.append(storage.get_global("n"))


# -- asyncio ----------------------------------------------------------------------------------
async def test_gathered_appends_and_transactions(main_storage: MainStorage) -> None:
    sessions = [f"s{i}" for i in range(10)]
    for sid in sessions:
        await main_storage.aput_session(SessionMeta(id=sid, label=""))

    async def append(n: int) -> int:
        return await main_storage.aappend_records(
            sessions[n % 10], [HumanMessage(str(n)), AIMessage(str(n))], user_turn=True
        )

    async def increment() -> None:
        async with main_storage.atransaction():
            value = await main_storage.aget_global("n") or 0
            await asyncio.sleep(0)  # let every other task run meanwhile
            await main_storage.aput_global("n", value + 1)
            await main_storage.aappend_records("s0", [HumanMessage("tx")])

    results = await asyncio.gather(
        *(append(n) for n in range(200)), *(increment() for _ in range(20))
    )
    assert await main_storage.aget_global("n") == 20
    assert all(isinstance(count, int) and count >= 2 for count in results[:200])
    for index, sid in enumerate(sessions):
        records = [text for text in contents(await main_storage.alist_records(sid)) if text != "tx"]
        assert records[0::2] == records[1::2]  # each pair stayed in one piece
        assert sorted(int(text) for text in records[0::2]) == list(range(index, 200, 10))
        assert await main_storage.aget_turn_count(sid) == 20
    assert contents(await main_storage.alist_records("s0")).count("tx") == 20


async def test_async_transaction_excludes_tasks_without_blocking_the_loop(
    main_storage: MainStorage,
) -> None:
    inside = asyncio.Event()
    ticks = 0

    async def writer() -> None:
        async with main_storage.atransaction():
            await main_storage.aput_global("n", "uncommitted")
            inside.set()
            await asyncio.sleep(0.2)
            await main_storage.aput_global("n", "committed")

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticking = asyncio.create_task(ticker())
    writing = asyncio.create_task(writer())
    await inside.wait()
    started = ticks
    assert await main_storage.aget_global("n") == "committed"
    assert ticks - started >= 5  # the loop kept running while the reader waited
    await writing
    ticking.cancel()


async def test_calls_inside_async_transaction_run_inline(main_storage: MainStorage) -> None:
    await main_storage.aput_session(SessionMeta(id="s", label=""))

    async def mixed_calls() -> None:
        await main_storage.aappend_records("s", [HumanMessage("a")])
        # a worker thread with a copy of the task's context joins the transaction
        await asyncio.to_thread(main_storage.append_records, "s", [HumanMessage("b")])
        await asyncio.gather(*(main_storage.aput_global(f"k{i}", i) for i in range(5)))
        if _sync_io_on_loop(main_storage):
            with main_storage.transaction():
                main_storage.put_global("sync", True)
        else:  # the transaction lives on the loop's async connection: sync calls there refused
            with pytest.raises(StorageError, match="await the async twin"):
                main_storage.put_global("sync", True)
        assert contents(await main_storage.alist_records("s")) == ["a", "b"]

    await abort_after(main_storage.atransaction, mixed_calls)
    assert await main_storage.alist_records("s") == []
    assert await main_storage.aget_global("k0") is None
    assert await main_storage.aget_global("sync") is None


async def test_cancelled_waiter_does_not_keep_the_lock(main_storage: MainStorage) -> None:
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with main_storage.transaction():
            holding.set()
            release.wait(5)

    thread = threading.Thread(target=hold)
    thread.start()
    assert holding.wait(5)

    async def wait_for_transaction() -> None:
        async with main_storage.atransaction():
            await main_storage.aput_global("never", True)

    waiter = asyncio.create_task(wait_for_transaction())
    reader = asyncio.create_task(main_storage.aget_global("x"))
    await asyncio.sleep(0.05)
    waiter.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert await reader is None
    await asyncio.to_thread(thread.join)
    await asyncio.wait_for(main_storage.aput_global("after", 1), timeout=5)
    assert await main_storage.aget_global("after") == 1
    assert await main_storage.aget_global("never") is None


async def test_sync_transaction_in_a_thread_and_async_callers(main_storage: MainStorage) -> None:
    await main_storage.aput_session(SessionMeta(id="s", label=""))
    holding = threading.Event()

    def hold() -> None:
        with main_storage.transaction():
            main_storage.append_records("s", [HumanMessage("first")])
            holding.set()
            time.sleep(0.1)

    thread = threading.Thread(target=hold)
    thread.start()
    await asyncio.to_thread(holding.wait, 5)
    count = await main_storage.aappend_records("s", [HumanMessage("second")])
    await asyncio.to_thread(thread.join)
    assert count == 2
    assert contents(await main_storage.alist_records("s")) == ["first", "second"]


async def test_sync_call_that_would_block_its_own_loop_raises(main_storage: MainStorage) -> None:
    inside, done = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        async with main_storage.atransaction():
            await main_storage.aput_global("k", "uncommitted")
            inside.set()
            await done.wait()

    holder = asyncio.create_task(hold())
    await inside.wait()
    with pytest.raises(StorageError, match="Await the async twin"):
        main_storage.get_global("k")
    done.set()
    await holder
    assert main_storage.get_global("k") == "uncommitted"


def test_worker_threads_and_tasks_of_one_async_transaction_never_deadlock(
    main_storage: MainStorage,
) -> None:
    """Inside `atransaction()`, sync calls in worker threads (`asyncio.to_thread`) and awaited
    calls of other tasks at the same time: on a native async backend the worker's statement
    runs on the loop, so a task must never block the loop waiting for what the worker holds.
    Run on a loop of its own thread, so a deadlock fails the test instead of hanging it."""
    main_storage.put_session(SessionMeta(id="s", label=""))
    done: list[int] = []

    async def mixed() -> None:
        async with main_storage.atransaction():
            for n in range(30):
                await asyncio.gather(
                    asyncio.to_thread(main_storage.get_session, "s"),
                    asyncio.to_thread(main_storage.put_global, f"t{n}", n),
                    *(main_storage.aget_session("s") for _ in range(3)),
                    main_storage.aput_global(f"a{n}", n),
                )
                done.append(n)

    failed: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(mixed())
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), f"deadlocked after {len(done)} rounds"
    assert not failed, failed
    assert main_storage.get_global("t29") == 29 and main_storage.get_global("a29") == 29
