"""Background memory beyond one process: due work is stored, found after a restart, and a job
never runs twice at once across schedulers (two agents on one SQLite file stand for two
server workers)."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import BaseMessage

from stello_graph import StelloAgent
from stello_graph._claims import CLAIMS_KEY, JobClaims
from stello_graph.checkpoints import InMemoryMainStorage, SqliteMainStorage
from stello_graph.errors import InvalidInputError
from stello_graph.models import ChildL2, IntegrationResult
from stello_graph.nodes.scheduling import INTEGRATION_KEY
from stello_graph.schedule import Schedule, Scheduler
from stello_graph.testing import ScriptedChatModel
from tests._postgres import POSTGRES


class Calls:
    """Consolidate / integrate functions that count their calls (and can fail or linger)."""

    def __init__(self, *, linger: float = 0.0, fail_integrate: bool = False) -> None:
        self.lock = threading.Lock()
        self.consolidated: Counter[str] = Counter()
        self.integrations = 0
        self.linger = linger
        self.fail_integrate = fail_integrate

    def consolidate(self, current: str | None, records: list[BaseMessage]) -> str:
        text = " / ".join(str(m.content) for m in records)
        with self.lock:
            self.consolidated[text] += 1
        time.sleep(self.linger)  # a model call: long enough for another worker to look
        return f"L2 of {len(records)} records"

    def integrate(self, children: list[ChildL2], synthesis: str | None) -> IntegrationResult:
        if self.fail_integrate:
            raise RuntimeError("integrator down")
        with self.lock:
            self.integrations += 1
        return IntegrationResult(synthesis=f"{len(children)} sessions", insights={})


@pytest.fixture(params=["sqlite", *(["postgres"] if POSTGRES.wanted else [])])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the workers' tree lives: a SQLite file, or a PostgreSQL schema of this test."""
    if request.param == "postgres":
        return POSTGRES.dsn_for(tmp_path)
    return str(tmp_path / "t.db")


def _agent(path: Path | str, calls: Calls | None = None, **schedule: Any) -> StelloAgent:
    options: dict[str, Any] = {}
    if calls is not None:
        options = {"consolidate_fn": calls.consolidate, "integrate_fn": calls.integrate,
                   "schedule": Schedule(recover_every=None, **schedule)}  # fmt: skip
    return StelloAgent(model=ScriptedChatModel(default="r"), storage=path, **options)


def _sessions_with_turns(path: Path | str, count: int, turns: int) -> list[str]:
    """`count` sessions with `turns` user turns each, written without a schedule (as by a
    worker that stopped before its background work ran)."""
    agent = _agent(path)
    ids = [agent.fork(agent.main_session_id, f"s{i}").id for i in range(count)]
    for sid in ids:
        for n in range(turns):
            agent.turn(sid, f"{sid[:4]} turn {n}")
    agent.close()
    return ids


# -- claims ------------------------------------------------------------------------------------
def test_a_claim_is_held_by_one_scheduler_until_released() -> None:
    claims = JobClaims(InMemoryMainStorage())
    first = claims.claim("consolidate", "s1")
    assert first is not None
    assert claims.claim("consolidate", "s1") is None  # another scheduler would skip it
    assert claims.claim("consolidate", "s2") is not None  # another job is free
    assert claims.claim("integrate", None) is not None
    renewed = claims.renew(first)
    assert renewed is not None and renewed.expires_at >= first.expires_at
    claims.release(first)
    assert claims.claim("consolidate", "s1") is not None


def test_the_claim_of_a_dead_or_lapsed_holder_is_taken_over() -> None:
    storage = InMemoryMainStorage()
    gone = f"{socket.gethostname()}/{2**22 + 12345}/nonce"  # no such process here
    far = f"elsewhere/{os.getpid()}/nonce"  # another machine: only expiry frees it
    storage.put_global(CLAIMS_KEY, {
        "consolidate:dead": {"owner": gone, "expires_at": time.time() + 600},
        "consolidate:far": {"owner": far, "expires_at": time.time() + 600},
        "consolidate:lapsed": {"owner": far, "expires_at": time.time() - 1},
    })  # fmt: skip
    claims = JobClaims(storage)
    assert claims.claim("consolidate", "dead") is not None
    assert claims.claim("consolidate", "far") is None
    taken = claims.claim("consolidate", "lapsed")
    assert taken is not None
    assert claims.renew(taken) is not None
    storage.put_global(CLAIMS_KEY, {taken.key: {"owner": far, "expires_at": time.time() + 60}})
    assert claims.renew(taken) is None  # taken over meanwhile: the holder can tell
    claims.release(taken)  # releases nothing of the new holder's
    assert claims.claim("consolidate", "lapsed") is None


def test_a_claimed_job_is_skipped_by_another_scheduler() -> None:
    storage = InMemoryMainStorage()
    runs: list[str] = []
    held = JobClaims(storage).claim("consolidate", "s1")
    assert held is not None
    scheduler = Scheduler(Schedule(), claims=JobClaims(storage))
    scheduler.submit("consolidate", "s1", lambda: runs.append("s1"))
    scheduler.submit("consolidate", "s2", lambda: runs.append("s2"))
    assert scheduler.drain(10)
    assert runs == ["s2"] and scheduler.failures() == []
    JobClaims(storage).release(held)
    scheduler.submit("consolidate", "s1", lambda: runs.append("s1"))
    assert scheduler.drain(10)
    assert runs == ["s2", "s1"]
    assert storage.get_global(CLAIMS_KEY) == {}  # released claims leave nothing behind
    scheduler.close()


def test_recover_every_is_checked() -> None:
    for bad in (0, -1.0, True, "60"):
        with pytest.raises(InvalidInputError, match="recover_every"):
            Schedule(recover_every=bad)  # type: ignore[arg-type]


def test_the_first_scan_counts_as_work_and_close_stops_the_scans() -> None:
    scans: list[int] = []
    gate = threading.Event()

    def scan() -> None:
        assert gate.wait(10)
        scans.append(1)

    scheduler = Scheduler(Schedule(recover_every=0.01))
    scheduler.recover(scan)
    assert scheduler.busy
    gate.set()
    assert scheduler.drain(10) and scans
    scheduler.close()
    seen = len(scans)
    time.sleep(0.05)
    assert len(scans) == seen  # no scan after close


# -- two workers, one database -----------------------------------------------------------------
def test_two_workers_run_each_due_consolidation_exactly_once(database: str) -> None:
    ids = _sessions_with_turns(database, count=4, turns=3)
    calls = Calls(linger=0.05)
    workers = [_agent(database, calls, consolidate_every_n_turns=3) for _ in range(2)]
    for worker in workers:
        assert worker.drain(30)
    assert sum(calls.consolidated.values()) == 4  # one per due session, whoever ran it
    assert all(n == 1 for n in calls.consolidated.values())
    for sid in ids:
        assert workers[0].digest(sid).l2 == "L2 of 6 records"
    assert workers[1].storage.get_global(CLAIMS_KEY) == {}  # released: nothing left behind
    for worker in workers:
        worker.close()


def test_a_worker_does_not_redo_what_another_one_consolidated(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    _sessions_with_turns(path, count=2, turns=2)
    calls = Calls()
    first = _agent(path, calls, consolidate_every_n_turns=2)
    assert first.drain(30)
    first.close()
    second = _agent(path, calls, consolidate_every_n_turns=2)  # a restart: nothing left due
    assert second.drain(30)
    second.close()
    assert sum(calls.consolidated.values()) == 2


# -- restarts ----------------------------------------------------------------------------------
def test_due_consolidations_run_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    (due, early) = _sessions_with_turns(path, count=2, turns=4)
    agent = _agent(path)
    agent.consolidate(early)
    agent.turn(early, "after the L2")
    kept = agent.digest(early).l2
    agent.close()
    calls = Calls()
    again = _agent(path, calls, consolidate_every_n_turns=4)
    assert again.drain(30)
    assert again.digest(due).l2 == "L2 of 8 records"
    assert again.digest(early).l2 == kept  # one turn past its L2: not due
    assert sum(calls.consolidated.values()) == 1
    again.close()


def test_an_archived_session_gets_its_final_l2_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    (sid,) = _sessions_with_turns(path, count=1, turns=1)
    plain = _agent(path)
    plain.archive(sid)  # no schedule: nothing consolidated it
    plain.close()
    calls = Calls()
    again = _agent(path, calls, consolidate_on_archive=True, integrate_after_consolidate=True)
    assert again.drain(30)
    assert again.digest(sid).l2 == "L2 of 2 records"
    assert calls.integrations == 1  # the final L2 reached an integration
    again.close()


def test_an_asked_for_integration_runs_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    (sid,) = _sessions_with_turns(path, count=1, turns=0)
    down = Calls(fail_integrate=True)
    agent = _agent(path, down, consolidate_every_n_turns=1, integrate_after_consolidate=True,
                   integrate_every_n_turns=2)  # fmt: skip
    agent.turn(sid, "one")
    agent.turn(sid, "two")
    assert agent.drain(30)
    assert {f.kind for f in agent.failures()} == {"integrate"}
    agent.close()
    with SqliteMainStorage(path) as storage:
        state = storage.get_global(INTEGRATION_KEY)
        assert state["requested"] > state.get("done", 0)  # stored: not lost with the process

    calls = Calls()
    again = _agent(path, calls, consolidate_every_n_turns=1, integrate_after_consolidate=True,
                   integrate_every_n_turns=2)  # fmt: skip
    assert again.drain(30)
    assert calls.integrations == 1 and sum(calls.consolidated.values()) == 0
    again.close()
    latest = _agent(path, Calls(), integrate_every_n_turns=2)
    assert latest.drain(30)  # nothing is due any more
    latest.close()
    with SqliteMainStorage(path) as storage:
        state = storage.get_global(INTEGRATION_KEY)
        assert state["done"] == state["requested"] and state["tree_turns"] == 2


def test_an_agent_whose_setup_fails_leaves_no_scheduler_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler starts with the runtime, before the agent builds its graphs: when a
    later step of the setup fails, its threads stop with it."""
    import stello_graph.agent as agent_module

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("graph build failed")

    monkeypatch.setattr(agent_module, "build_graph", broken)
    before = set(threading.enumerate())
    with pytest.raises(RuntimeError, match="graph build failed"):
        StelloAgent(model=ScriptedChatModel(default="r"), storage=tmp_path / "t.db",
                    schedule=Schedule(recover_every=60))  # fmt: skip
    left = [t for t in set(threading.enumerate()) - before if t.is_alive()]
    assert not [t.name for t in left if t.name.startswith("stello")]
