"""Concurrency suite: many writers at once on one database file, nothing lost or duplicated.

* In one process: threads and asyncio tasks run turns on a handful of sessions (so several
  writers share each session), a second agent on the same file (its own connections) runs
  turns on sessions of its own, background consolidation and integration run on a schedule,
  and a thread consolidates and integrates by hand meanwhile; a monitor polls every L2
  cursor, which must never move back.
* Two OS processes run turns on the same file, on shared and on private sessions.

Then: no writer saw an error (in particular no "database is locked"), every acknowledged
turn is stored exactly once, each writer's turns keep their order in every session, the
database passes the structural checks of the crash suite, and no background job failed.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stello_graph import (
    IntegrationSupersededError,
    NothingToIntegrateError,
    Schedule,
    StelloAgent,
)
from stello_graph._context import message_text
from stello_graph.testing import ScriptedChatModel
from tests.reliability import _scenario as sc
from tests.reliability._invariants import (
    Snapshot,
    ack_problems,
    integrity_problems,
    structural_problems,
)
from tests.reliability.conftest import Figures, count

pytestmark = pytest.mark.reliability

ROOT = Path(__file__).resolve().parents[2]
TURNS = count("turns_per_writer", ci=12, full=60)
"""Turns each writer (thread, task or process) runs."""
THREADS = 6
TASKS = 6
SESSIONS = 4


def make_agent(db: Path, run: int, schedule: Schedule | None = None) -> StelloAgent:
    return StelloAgent(
        model=ScriptedChatModel(respond=sc.respond, latency=0.002),
        storage=db,
        tools=sc.tools(),
        consolidate_fn=sc.consolidate,
        integrate_fn=sc.Integrator(run),
        schedule=schedule,
    )


def turn_ack(sid: str, text: str, content: str) -> dict[str, Any]:
    return {"op": "turn", "sid": sid, "text": text, "reply": content,
            "saw": sc.saw_tags(content)}  # fmt: skip


def order_problems(snap: Snapshot) -> list[str]:
    """Each writer's turns (texts `<writer>-<n>`) appear in every session in its order."""
    problems: list[str] = []
    for sid, data in snap.sessions.items():
        last: dict[str, int] = {}
        for turn in data.turns:
            writer, _, n = message_text(turn[0].content).rpartition("-")
            if writer in last and int(n) <= last[writer]:
                problems.append(f"session {sid}: {writer}-{n} stored after {writer}-{last[writer]}")
            last[writer] = int(n)
    return problems


def check(db: Path, acks: list[dict[str, Any]], figures: Figures, *, ordered: bool) -> None:
    problems = integrity_problems(db)
    snap = Snapshot.read(db)
    problems += structural_problems(snap)
    found, checked = ack_problems(snap, acks, ordered=ordered)
    problems += found + order_problems(snap)
    figures.add("acknowledged operations checked", checked)
    figures.add("records checked", sum(len(d.records) for d in snap.sessions.values()))
    assert not problems, "\n".join(problems[:40])


class Crowd:
    """Writers sharing one list of acks and one list of errors."""

    def __init__(self) -> None:
        self.acks: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.superseded = 0
        """Manual integrations dropped: a scheduled one was stored while they ran."""
        self.lock = threading.Lock()
        self.done = threading.Event()

    def ack(self, record: dict[str, Any]) -> None:
        with self.lock:
            self.acks.append(record)

    def guard(self, name: str, work: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                work()
            except BaseException as exc:
                with self.lock:
                    self.errors.append(f"{name}: {type(exc).__name__}: {exc}")

        return run


Work = Callable[[], None]


def _thread_writer(
    crowd: Crowd, agent: StelloAgent, name: str, sessions: list[str], seed: int
) -> Work:
    rng = random.Random(f"{seed}:{name}")

    def work() -> None:
        for n in range(TURNS):
            sid = rng.choice(sessions)
            text = f"{name}-{n}"
            crowd.ack(turn_ack(sid, text, agent.turn(sid, text).content))

    return crowd.guard(name, work)


def _task_writers(crowd: Crowd, agent: StelloAgent, sessions: list[str], seed: int) -> Work:
    async def task(name: str) -> None:
        rng = random.Random(f"{seed}:{name}")
        for n in range(TURNS):
            sid = rng.choice(sessions)
            text = f"{name}-{n}"
            crowd.ack(turn_ack(sid, text, (await agent.aturn(sid, text)).content))

    async def all_tasks() -> None:
        await asyncio.gather(*(task(f"task{i}") for i in range(TASKS)))

    return crowd.guard("tasks", lambda: asyncio.run(all_tasks()))


def _memory_worker(crowd: Crowd, agent: StelloAgent, sessions: list[str], seed: int) -> Work:
    rng = random.Random(f"{seed}:memory")

    def work() -> None:
        while not crowd.done.is_set():
            sid = rng.choice(sessions)
            l2 = agent.consolidate(sid)
            crowd.ack({"op": "consolidate", "sid": sid, "covers": sc.l2_count(l2) or 0})
            try:
                result = agent.integrate()
            except NothingToIntegrateError:
                continue
            except IntegrationSupersededError:  # a scheduled one was stored meanwhile
                crowd.superseded += 1
                continue
            crowd.ack(
                {"op": "integrate", "synthesis": result.synthesis, "insights": result.insights}
            )

    return crowd.guard("memory", work)


def _cursor_monitor(crowd: Crowd, db: Path, sessions: list[str]) -> Work:
    def work() -> None:
        agent_free = StelloAgent(model=ScriptedChatModel(default="-"), storage=db)
        seen: dict[str, int] = defaultdict(int)
        try:
            while not crowd.done.is_set():
                for sid in sessions:
                    through = agent_free.storage.get_memory_through(sid)
                    if through < seen[sid]:
                        raise AssertionError(
                            f"L2 cursor of {sid} moved back {seen[sid]}->{through}"
                        )
                    seen[sid] = through
                time.sleep(0.002)
        finally:
            agent_free.close()

    return crowd.guard("monitor", work)


def test_threads_tasks_and_background_work(tmp_path: Path, seed: int, figures: Figures) -> None:
    db = tmp_path / "concurrency.db"
    schedule = Schedule(
        consolidate_every_n_turns=2, integrate_after_consolidate=True, max_concurrency=3
    )
    agent = make_agent(db, 1, schedule)
    other = make_agent(db, 2)
    crowd = Crowd()
    try:
        shared = [agent.fork(agent.main_session_id, f"s{i}").id for i in range(SESSIONS)]
        own = [other.fork(other.main_session_id, f"o{i}").id for i in range(2)]
        writers = [
            *(_thread_writer(crowd, agent, f"thread{i}", shared, seed) for i in range(THREADS)),
            _task_writers(crowd, agent, shared, seed),
            *(_thread_writer(crowd, other, f"other{i}", own, seed) for i in range(2)),
        ]
        helpers = [
            _memory_worker(crowd, agent, shared, seed),
            _cursor_monitor(crowd, db, shared),
        ]
        threads = [threading.Thread(target=w) for w in [*writers, *helpers]]
        for thread in threads:
            thread.start()
        for thread in threads[: len(writers)]:
            thread.join()
        crowd.done.set()
        for thread in threads[len(writers) :]:
            thread.join()
        assert agent.drain(60)
        assert crowd.errors == []
        assert agent.failures() == []
    finally:
        agent.close()
        other.close()
    turns = sum(1 for a in crowd.acks if a["op"] == "turn")
    figures.set("writers", THREADS + TASKS + 2)
    figures.set("turns", turns)
    figures.set("manual consolidations and integrations", len(crowd.acks) - turns)
    figures.set("manual integrations superseded by a scheduled one", crowd.superseded)
    check(db, crowd.acks, figures, ordered=False)


PROCESS_WRITER = """
import sys
from stello_graph import Schedule
from tests.reliability.test_concurrency import make_agent
from tests.reliability import _scenario as sc
db, ack, name, sessions = sys.argv[1:5]
turns, run = int(sys.argv[5]), int(sys.argv[6])
# the first process also consolidates in the background, racing the other one's turns
agent = make_agent(db, run, Schedule(consolidate_every_n_turns=2) if run == 1 else None)
acks = sc.AckWriter(ack)
for n, sid in enumerate(sessions.split(",") * turns):
    if n >= turns:
        break
    text = f"{name}-{n}"
    content = agent.turn(sid, text).content
    acks.write({"op": "turn", "sid": sid, "text": text, "reply": content, "saw": []})
assert agent.drain(60) and agent.failures() == [], agent.failures()
agent.close()
"""


def test_two_processes_on_one_file(tmp_path: Path, figures: Figures) -> None:
    db = tmp_path / "processes.db"
    with make_agent(db, 0) as agent:
        shared = [agent.fork(agent.main_session_id, f"shared{i}").id for i in range(2)]
        own = [[agent.fork(agent.main_session_id, f"p{p}-own").id] for p in range(2)]
    processes = []
    for p in range(2):
        sessions = ",".join([*shared, *own[p]])
        args = [str(db), str(tmp_path / f"p{p}.acks"), f"proc{p}", sessions, str(TURNS * 3)]
        processes.append(
            subprocess.Popen(
                [sys.executable, "-c", PROCESS_WRITER, *args, str(p + 1)],
                cwd=ROOT,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for process in processes:
        _, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stderr
    acks = [a for p in range(2) for a in sc.read_acks(tmp_path / f"p{p}.acks")]
    assert len(acks) == 2 * TURNS * 3
    figures.set("processes", 2)
    figures.set("turns", len(acks))
    check(db, acks, figures, ordered=False)
