"""`Scheduler`: jobs of one key never overlap; requests during a run are kept once."""

from __future__ import annotations

import threading
from collections.abc import Callable

from stello_graph.schedule import Schedule, Scheduler


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
