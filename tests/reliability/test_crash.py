"""Crash suite: SIGKILL a driver process at random moments, then check the database.

Each round starts `python -m tests.reliability.driver DB ACK RUN`, waits until it is working
(or, one round in ten, kills it while it is still starting), sleeps a random time and kills
it with SIGKILL. Then, on a fresh connection:

* `PRAGMA integrity_check` is ok and no foreign key is broken;
* every acknowledged operation is fully present (`_invariants.ack_problems`);
* whatever was not acknowledged left nothing partial: no half turn in L3, no node without its
  session nor session without its node, turn counts equal the turns stored, L2 cursors equal
  what the L2 says it covers, and no insight is lost or shown twice
  (`_invariants.structural_problems`).

Most rounds then open a fresh agent, resume the turns a crash left in flight (each must
commit exactly once, or be refused if its session was archived meanwhile), run one more turn,
and check everything again. A database file serves `EPOCH` rounds, so state accumulates.

The suite runs on SQLite and, when there is one, on PostgreSQL (a schema per epoch; the
driver gets its DSN), where the server drops a killed process's connections and rolls back
its open transaction.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from stello_graph import ChildL2, IntegrationResult, Schedule, SessionArchivedError, StelloAgent
from stello_graph.testing import ScriptedChatModel
from tests._postgres import POSTGRES
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
KILLS = count("kills", ci=50, full=200)
POSTGRES_KILLS = count("kills_postgres", ci=20, full=100)
EPOCH = 25
"""Rounds played on one database file before starting a new one."""
KEEP = os.environ.get("RELIABILITY_KEEP")
"""A directory where a failing round leaves a copy of its SQLite file and acks."""


def _wait_ready(ack: Path, run: int, proc: subprocess.Popen[bytes], err: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if any(a["op"] == "ready" and a["run"] == run for a in sc.read_acks(ack)):
            return
        if proc.poll() is not None:
            pytest.fail(f"driver exited with {proc.returncode}:\n{err.read_text()}")
        time.sleep(0.01)
    pytest.fail("driver did not start within 120 s")


def kill_driver(db: Path | str, ack: Path, run: int, rng: random.Random, figures: Figures) -> None:
    err = ack.with_suffix(".err")
    with open(err, "w") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.driver", str(db), str(ack), str(run)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=err_file,
        )
    try:
        if rng.random() < 0.1:
            time.sleep(rng.uniform(0.5, 6.0))  # often while it opens the database
        else:
            _wait_ready(ack, run, proc, err)
            time.sleep(rng.uniform(0.0, 0.6))
        if proc.poll() is not None:
            pytest.fail(f"driver exited by itself with {proc.returncode}:\n{err.read_text()}")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    figures.add("kills survived")
    figures.add(f"kills during: {_in_progress(ack, run)}")


def _in_progress(ack: Path, run: int) -> str:
    """What the driver of `run` was doing when it was killed (from its last ack line)."""
    acks = sc.read_acks(ack)
    starts = [i for i, a in enumerate(acks) if a["op"] == "ready" and a["run"] == run]
    if not starts:
        return "start-up"
    last = acks[-1]
    return str(last["what"]) if last["op"] == "begin" else "between operations"


def verify(db: Path | str, ack: Path, figures: Figures) -> None:
    problems = integrity_problems(db)
    snap = Snapshot.read(db)
    problems += structural_problems(snap)
    found, checked = ack_problems(snap, sc.read_acks(ack))
    problems += found
    figures.add("acknowledged operations re-checked (all verifications)", checked)
    figures.add("verifications")
    if problems and KEEP:
        problems.insert(0, f"database and acks kept in {_keep(db, ack, Path(KEEP))}")
    assert not problems, "\n".join(problems[:40])


def _keep(db: Path | str, ack: Path, where: Path) -> Path:
    """Copy the database (with its WAL; a PostgreSQL schema is left where it is) and the
    acks into a new directory under `where`."""
    where.mkdir(parents=True, exist_ok=True)
    kept = Path(tempfile.mkdtemp(prefix=f"{ack.stem}-", dir=where))
    files = (db, db.with_name(db.name + "-wal"), ack) if isinstance(db, Path) else (ack,)
    for path in files:
        if path.exists():
            shutil.copy2(path, kept / path.name)
    return kept


def _in_flight_text(agent: StelloAgent, sid: str) -> str:
    """The user text of the turn in flight. Until the turn has started, it is only in the
    input checkpoint (the `__start__` channel, or a pending write to it); then in the
    state's `input` for one step (an input key lasts for a run's first step only); after
    that in the turn's first record."""
    config = agent.config(sid)
    state = agent.graph.get_state(config)
    if state.next == ("__start__",):
        assert agent.checkpointer is not None
        found = agent.checkpointer.get_tuple(config)
        assert found is not None
        written = [v for _, channel, v in found.pending_writes or () if channel == "__start__"]
        start = written[0] if written else found.checkpoint["channel_values"]["__start__"]
        text = start["input"]
    elif "input" in state.values:
        text = state.values["input"]
    else:
        text = state.values["pending"][0].content
    assert isinstance(text, str), text
    return text


def recover(db: Path | str, ack: Path, run: int, rng: random.Random, figures: Figures) -> None:
    """A fresh agent resumes (some of) the turns left in flight, then runs a new turn."""
    agent = StelloAgent(
        model=ScriptedChatModel(respond=sc.respond),
        storage=db,
        tools=sc.tools(),
        consolidate_fn=sc.consolidate,
        integrate_fn=sc.Integrator(run),
    )
    acks = sc.AckWriter(ack)
    try:
        for meta in agent.storage.list_sessions():
            state = agent.graph.get_state(agent.config(meta.id))
            if not state.next:
                continue
            figures.add("turns found in flight")
            if rng.random() < 0.3:
                continue  # left for the next driver, whose turn discards it
            text = _in_flight_text(agent, meta.id)
            if meta.status == "archived":
                with pytest.raises(SessionArchivedError):
                    agent.resume(meta.id)
                figures.add("in-flight turns refused (session archived)")
                continue
            result = agent.resume(meta.id)
            assert result.content.split(" [saw:")[0] == f"re:{text}", result
            acks.write({"op": "turn", "sid": meta.id, "text": text, "reply": result.content,
                        "saw": sc.saw_tags(result.content)})  # fmt: skip
            figures.add("in-flight turns resumed")
        active = agent.storage.list_sessions(status="active")
        sid = rng.choice(active).id
        text = f"h-{run}-1"
        result = agent.turn(sid, text)
        acks.write({"op": "turn", "sid": sid, "text": text, "reply": result.content,
                    "saw": sc.saw_tags(result.content)})  # fmt: skip
        figures.add("turns after recovery")
    finally:
        acks.close()
        agent.close()


@pytest.mark.parametrize("backend", ["sqlite", *(["postgres"] if POSTGRES.wanted else [])])
def test_sigkill_at_random_moments(
    tmp_path: Path, seed: int, figures: Figures, backend: str
) -> None:
    rng = random.Random(seed)
    figures.set("seed", seed)
    base = seed * 1000
    for i in range(KILLS if backend == "sqlite" else POSTGRES_KILLS):
        epoch = tmp_path / f"crash-{i // EPOCH}"
        ack = epoch.with_suffix(".acks")
        db: Path | str = epoch.with_suffix(".db")
        if backend == "postgres":
            epoch.mkdir(exist_ok=True)
            db = POSTGRES.dsn_for(epoch)  # a schema of its own per epoch
        run = base + i + 1
        kill_driver(db, ack, run, rng, figures)
        verify(db, ack, figures)
        if rng.random() < 0.7:
            recover(db, ack, run, rng, figures)
            verify(db, ack, figures)
    files = sorted(tmp_path.glob("crash-*.acks"))
    acked = [a for f in files for a in sc.read_acks(f) if a["op"] not in ("ready", "begin")]
    figures.set("database files", len(files))
    figures.set("acknowledged operations", len(acked))
    figures.set("acknowledged operations by kind", dict(Counter(a["op"] for a in acked)))


class _HeldIntegrator:
    """`sc.Integrator`'s names (`syn-<run>-<k>`, an insight `ins-<run>-<k>-<i>` for every
    child); its first call, once `k` is drawn, waits until `go` is set."""

    def __init__(self, run: int) -> None:
        self.run, self.k = run, 0
        self.waiting, self.go = threading.Event(), threading.Event()

    def __call__(self, children: list[ChildL2], current: str | None) -> IntegrationResult:
        self.k += 1
        k = self.k
        if k == 1:
            self.waiting.set()
            assert self.go.wait(30)
        insights = {c.session_id: f"ins-{self.run}-{k}-{i}" for i, c in enumerate(children)}
        return IntegrationResult(synthesis=f"syn-{self.run}-{k}", insights=insights)


def test_a_scheduled_integration_that_began_first_is_dropped(tmp_path: Path) -> None:
    """Of overlapping integrations, the first to finish is stored.

    As in a driver, a scheduled integration runs on the scheduler's worker while the caller
    integrates by hand: the scheduled one begins first (`k` = 1) and waits, the caller's
    (`k` = 2) finishes and is stored; the scheduled one is then dropped instead of writing
    a synthesis made from the one it read over it (the last writer used to win), and it is
    no failure. The oracle accepts the state, and refuses it had a later integration been
    acknowledged.
    """
    db = tmp_path / "race.db"
    integrator = _HeldIntegrator(7)
    schedule = Schedule(consolidate_every_n_turns=1, integrate_after_consolidate=True)
    agent = StelloAgent(
        model=ScriptedChatModel(respond=sc.respond),
        storage=db,
        consolidate_fn=sc.consolidate,
        integrate_fn=integrator,
        schedule=schedule,
    )
    try:
        child = agent.fork(agent.main_session_id, "a").id
        agent.turn(child, "u-7-1")  # its scheduled consolidation asks for an integration
        assert integrator.waiting.wait(30)
        by_hand = agent.integrate()
        integrator.go.set()
        assert agent.drain(30)
        assert agent.failures() == []
        assert agent.storage.get_memory(agent.main_session_id) == "syn-7-2"
        assert agent.storage.get_insight(child) == "ins-7-2-0"
    finally:
        integrator.go.set()
        agent.close()
    acked = {"op": "integrate", "synthesis": by_hand.synthesis, "insights": by_hand.insights}
    assert acked == {"op": "integrate", "synthesis": "syn-7-2", "insights": {child: "ins-7-2-0"}}
    snap = Snapshot.read(db)
    assert ack_problems(snap, [acked]) == ([], 1)
    later = {"op": "integrate", "synthesis": "syn-7-3", "insights": {child: "ins-7-3-0"}}
    assert ack_problems(snap, [acked, later]) == (
        [
            "acked synthesis syn-7-3 replaced by older syn-7-2",
            f"acked insight ins-7-3-0 for {child} lost",
        ],
        2,
    )
