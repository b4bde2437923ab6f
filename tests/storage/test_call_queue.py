"""The queue async calls of sync code take: one drain serves the calls asked at once."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.checkpoints._queue import CallQueue
from stello_graph.checkpoints.saver import StelloSqliteSaver
from stello_graph.models import SessionMeta


async def test_writes_asked_at_once_share_one_hand_off_to_the_worker(tmp_path: Path) -> None:
    with SqliteMainStorage(tmp_path / "s.db") as storage:
        await storage.aput_session(SessionMeta(id="s1", label="One"))
        txn: Any = storage._txn
        submitted: list[object] = []
        submit = txn._submit

        def counting(fn: Any, *args: Any, **kwargs: Any) -> Any:
            submitted.append(fn)
            return submit(fn, *args, **kwargs)

        txn._submit = counting
        await asyncio.gather(*(storage.aput_global(f"k{n}", n) for n in range(8)))
        assert [storage.get_global(f"k{n}") for n in range(8)] == list(range(8))
        assert 1 <= len(submitted) < 8


async def test_a_failing_call_fails_alone(tmp_path: Path) -> None:
    with SqliteMainStorage(tmp_path / "s.db") as storage:
        await storage.aput_session(SessionMeta(id="s1", label="One"))
        results = await asyncio.gather(
            storage.aput_insight("s1", "kept"),
            storage.aput_insight("missing", "refused"),
            storage.aput_global("after", 1),
            return_exceptions=True,
        )
        assert results[0] is None and results[2] is None
        assert isinstance(results[1], Exception)
        assert storage.get_insight("s1") == "kept"
        assert storage.get_global("after") == 1


async def test_a_call_cancelled_before_it_runs_is_never_run() -> None:
    ran: list[int] = []

    def run(value: int) -> int:
        ran.append(value)
        return value

    started: list[asyncio.AbstractEventLoop] = []
    queue = CallQueue(started.append)  # no drain yet: every call stays queued
    first = asyncio.ensure_future(queue.call(run, 1))
    second = asyncio.ensure_future(queue.call(run, 2))
    await asyncio.sleep(0)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.to_thread(queue.drain)
    assert await second == 2
    assert ran == [2]
    assert len(started) == 1  # one drain asked for both


def test_calls_of_a_loop_that_goes_away_are_cancelled_and_the_others_served() -> None:
    queue_started: list[asyncio.AbstractEventLoop] = []
    queue = CallQueue(queue_started.append)
    other = asyncio.new_event_loop()
    ready = threading.Event()

    def serve() -> None:
        ready.set()
        other.run_forever()

    thread = threading.Thread(target=serve)
    thread.start()
    ready.wait(10)
    try:

        async def ask() -> asyncio.Future[int]:
            return queue.put(lambda: 7)

        gone = asyncio.new_event_loop()
        mine = gone.run_until_complete(ask())
        theirs = asyncio.run_coroutine_threadsafe(ask(), other).result(10)
        queue.abandon(gone)  # the drain asked from `gone` will not run
        assert mine.cancelled()
        gone.close()
        # a drain is asked for again, from the loop of the call left
        for _ in range(100):
            if len(queue_started) == 2:
                break
            time.sleep(0.05)
        assert queue_started[1] is other
        queue.drain()
        result = asyncio.run_coroutine_threadsafe(asyncio.wait_for(_await(theirs), 10), other)
        assert result.result(10) == 7
    finally:
        other.call_soon_threadsafe(other.stop)
        thread.join(10)
        other.close()


async def _await(done: asyncio.Future[int]) -> int:
    return await done


async def test_the_saver_reads_of_a_gathered_round_share_one_drain(tmp_path: Path) -> None:
    import sqlite3

    conn = sqlite3.connect(tmp_path / "c.db", check_same_thread=False)
    saver = StelloSqliteSaver(conn)
    drains: list[int] = []
    start = saver._start_drain

    def counting(loop: asyncio.AbstractEventLoop) -> None:
        drains.append(1)
        start(loop)

    saver._start_drain = counting  # type: ignore[method-assign]
    configs: list[Any] = [{"configurable": {"thread_id": f"t{n}"}} for n in range(8)]
    found = await asyncio.gather(*(saver.aget_tuple(config) for config in configs))
    assert found == [None] * 8
    assert 1 <= len(drains) < 8
    conn.close()
