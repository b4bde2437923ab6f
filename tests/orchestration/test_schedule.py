"""`Scheduler`: jobs of one key never overlap; requests during a run are kept once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from langchain_core.messages import BaseMessage

from stello_graph import StelloAgent
from stello_graph.checkpoints import InMemoryMainStorage
from stello_graph.schedule import BackgroundFailure, Schedule, Scheduler, StorageFailureLog
from stello_graph.testing import ScriptedChatModel


class Probe:
    """Jobs that record their runs and can be held until released."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: list[str] = []
        self.running = 0
        self.peak = 0
        self.started = threading.Event()
        self.release = threading.Event()

    def job(self, name: str, hold: bool = False) -> Callable[[], None]:
        def run() -> None:
            with self.lock:
                self.running += 1
                self.peak = max(self.peak, self.running)
                self.runs.append(name)
            self.started.set()
            if hold:
                assert self.release.wait(10)
            with self.lock:
                self.running -= 1

        return run


def test_requests_during_a_run_are_kept_once_and_run_after_it() -> None:
    probe = Probe()
    scheduler = Scheduler(Schedule(max_concurrency=4))
    assert scheduler.submit("consolidate", "s1", probe.job("first", hold=True))
    assert probe.started.wait(10)
    assert scheduler.submit("consolidate", "s1", probe.job("second"))  # kept for later
    assert not scheduler.submit("consolidate", "s1", probe.job("third"))  # already kept
    assert not scheduler.drain(0.05)  # the kept request counts as work to wait for
    probe.release.set()
    assert scheduler.drain(10)
    assert probe.runs == ["first", "second"]
    assert probe.peak == 1  # never two runs of one key at once
    scheduler.close()


def test_different_keys_run_at_once() -> None:
    probe = Probe()
    scheduler = Scheduler(Schedule(max_concurrency=2))
    scheduler.submit("consolidate", "s1", probe.job("a", hold=True))
    scheduler.submit("consolidate", "s2", probe.job("b", hold=True))
    while probe.peak < 2:  # both are held at once, or this test times out
        threading.Event().wait(0.001)
    probe.release.set()
    assert scheduler.drain(10)
    assert sorted(probe.runs) == ["a", "b"]
    scheduler.close()


def test_a_kept_request_still_runs_when_the_scheduler_closes() -> None:
    probe = Probe()
    scheduler = Scheduler(Schedule())
    scheduler.submit("integrate", None, probe.job("running", hold=True))
    assert probe.started.wait(10)
    assert scheduler.submit("integrate", None, probe.job("kept"))
    closer = threading.Thread(target=scheduler.close)
    closer.start()
    assert not scheduler.submit("integrate", None, probe.job("refused"))
    probe.release.set()
    closer.join(10)
    assert not closer.is_alive()
    assert probe.runs == ["running", "kept"]
    assert not scheduler.busy


# -- failures kept with the tree ----------------------------------------------------------------
def _failing_agent(path: Path, **options: Any) -> StelloAgent:
    def summary(current: str | None, records: list[BaseMessage]) -> str:
        raise RuntimeError("summariser down")

    return StelloAgent(
        model=ScriptedChatModel(default="r"), storage=path, consolidate_fn=summary,
        schedule=Schedule(consolidate_every_n_turns=1), **options,
    )  # fmt: skip


def test_background_failures_outlive_the_agent_and_can_be_cleared(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    agent = _failing_agent(path)
    a = agent.fork(agent.main_session_id, "a").id
    b = agent.fork(agent.main_session_id, "b").id
    agent.turn(a, "one")
    agent.turn(b, "two")
    assert agent.drain(10)
    assert {f.session_id for f in agent.failures()} == {a, b}
    agent.close()
    assert {f.session_id for f in agent.failures()} == {a, b}  # still known once closed

    again = _failing_agent(path)  # another agent, as after a restart
    assert again.drain(10)  # it finds both consolidations still due: they fail again
    first, retried = again.failures(a)
    assert first.kind == "consolidate" and "summariser down" in first.message
    assert "RuntimeError" in first.traceback and first.at < retried.at
    assert again.clear_failures(a) == 2
    assert [f.session_id for f in again.failures()] == [b, b]
    again.close()

    plain = StelloAgent(model=ScriptedChatModel(default="r"), storage=path)  # no schedule
    assert [f.session_id for f in plain.failures()] == [b, b]
    assert plain.clear_failures() == 2 and plain.failures() == []
    plain.close()


def test_failures_are_kept_in_memory_when_the_storage_cannot_take_them() -> None:
    class Broken:
        def append(self, failure: BackgroundFailure) -> None:
            raise OSError("disk full")

        def read(self, session_id: str | None = None) -> list[BackgroundFailure]:
            raise OSError("disk full")

        def clear(self, session_id: str | None = None) -> int:
            return 0

    scheduler = Scheduler(Schedule(), log=Broken())

    def job() -> None:
        raise ValueError("bad")

    scheduler.submit("consolidate", "s1", job)
    assert scheduler.drain(5)
    (failure,) = scheduler.failures("s1")
    assert failure.error_type == "ValueError"
    assert scheduler.clear_failures() == 1 and scheduler.failures() == []
    scheduler.close()


def test_the_newest_failures_are_kept() -> None:
    storage = InMemoryMainStorage()
    log = StorageFailureLog(storage)
    for n in range(205):
        log.append(BackgroundFailure(kind="integrate", session_id=None, error_type="E",
                                     message=str(n), attempts=1))  # fmt: skip
    kept = log.read()
    assert len(kept) == 200 and kept[0].message == "5" and kept[-1].message == "204"
    storage.put_global("stello:background_failures", [*storage.get_global(
        "stello:background_failures"), {"not": "a failure"}])  # fmt: skip
    assert len(log.read()) == 200  # what is not a failure is skipped


async def test_a_sync_only_failure_log_is_read_off_the_event_loop() -> None:
    """A `FailureLog` needs only sync methods; the async API runs them in a worker thread,
    so a log doing I/O never blocks the loop."""
    threads: list[int] = []

    class SyncOnly:
        def __init__(self) -> None:
            self.kept: list[BackgroundFailure] = []

        def append(self, failure: BackgroundFailure) -> None:
            self.kept.append(failure)

        def read(self, session_id: str | None = None) -> list[BackgroundFailure]:
            threads.append(threading.get_ident())
            return [f for f in self.kept if session_id in (None, f.session_id)]

        def clear(self, session_id: str | None = None) -> int:
            threads.append(threading.get_ident())
            gone = len(self.kept)
            self.kept.clear()
            return gone

    scheduler = Scheduler(Schedule(), log=SyncOnly())

    def job() -> None:
        raise ValueError("bad")

    scheduler.submit("consolidate", "s1", job)
    assert scheduler.drain(5)
    (failure,) = await scheduler.afailures("s1")
    assert failure.error_type == "ValueError"
    assert await scheduler.aclear_failures() == 1
    assert len(threads) == 2 and threading.get_ident() not in threads
    scheduler.close()
