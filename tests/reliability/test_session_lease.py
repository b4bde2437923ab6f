"""Two OS processes turning on the same session are serialised by the session lease.

Each process runs turns on one shared session of one database (a SQLite file, and a PostgreSQL
database when there is one: there the lease and the tree's advisory lock hold across
connections as SQLite's write lock does across one file) and, before every other
turn, replaces the session's insight with one of its own. The model's reply says how much
history the prompt held and which insight it showed. Then, in L3 order:

* every turn saw every turn committed before it (the k-th turn saw 2k records): no turn
  was built without one the other process had already committed;
* every insight was shown to at most one turn, and one that was consumed to exactly one;
* neither process saw an error, and no checkpoint of the session's thread is left behind
  (each process pruned only its own runs).
"""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from itertools import pairwise
from pathlib import Path

import pytest

from stello_graph import StelloAgent
from stello_graph.testing import ScriptedChatModel
from tests._postgres import POSTGRES
from tests.reliability.conftest import Figures, count

pytestmark = pytest.mark.reliability

ROOT = Path(__file__).resolve().parents[2]
TURNS = count("lease_turns_per_process", ci=25, full=150)

WRITER = """
import re, sys, time
from langchain_core.messages import SystemMessage
from stello_graph import StelloAgent
from stello_graph.testing import ScriptedChatModel

db, sid, name, turns = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
start = float(sys.argv[5])

def respond(prompt):
    system = prompt[0].text if isinstance(prompt[0], SystemMessage) else ""
    shown = re.findall(r"INS-[a-z0-9]+-[0-9]+", system)
    history = [m for m in prompt[:-1] if not isinstance(m, SystemMessage)]
    return f"saw={len(history)} insight={shown[0] if shown else '-'}"

agent = StelloAgent(
    model=ScriptedChatModel(respond=respond, latency=0.003), storage=db, builtin_tools=()
)
time.sleep(max(0.0, start - time.time()))  # both processes start turning together
for n in range(turns):
    if n % 2 == 0:
        agent.storage.put_insight(sid, f"INS-{name}-{n}")
    agent.turn(sid, f"{name}-{n}")
agent.close()
"""


def _left_checkpoints(db: str, thread: str) -> int:
    if db.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(db) as pg:
            row = pg.execute("SELECT COUNT(*) FROM checkpoints WHERE thread_id = %s", (thread,))
            found = row.fetchone()
        assert found is not None
        return int(found[0])
    with sqlite3.connect(db) as conn:
        left: int = conn.execute(
            "SELECT COUNT(*) FROM checkpoints WHERE thread_id = ?", (thread,)
        ).fetchone()[0]
        return left


@pytest.mark.parametrize("backend", ["sqlite", *(["postgres"] if POSTGRES.wanted else [])])
def test_two_processes_on_one_session(tmp_path: Path, figures: Figures, backend: str) -> None:
    db = str(tmp_path / "lease.db") if backend == "sqlite" else POSTGRES.dsn_for(tmp_path)
    with StelloAgent(model=ScriptedChatModel(default="-"), storage=db) as agent:
        sid = agent.fork(agent.main_session_id, "Shared").id
    start = str(time.time() + 8)  # once both have imported and opened the file
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, db, sid, f"p{p}", str(TURNS), start],
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
        )
        for p in range(2)
    ]
    for process in processes:
        _, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stderr
    with StelloAgent(model=ScriptedChatModel(default="-"), storage=db) as agent:
        replies = [m.text for m in agent.storage.list_records(sid, role="ai")]
        humans = [m.text for m in agent.storage.list_records(sid, role="human")]
        pending = agent.storage.get_insight(sid)
        thread = agent.config(sid)["configurable"]["thread_id"]
    assert len(replies) == 2 * TURNS
    interleaved = [
        (k, reply) for k, reply in enumerate(replies) if not reply.startswith(f"saw={2 * k} ")
    ]
    shown = Counter(m.group(0) for r in replies if (m := re.search(r"INS-\S+", r)))
    twice = {insight: n for insight, n in shown.items() if n > 1}
    alternations = sum(1 for a, b in pairwise(humans) if a[:2] != b[:2])
    figures.set("processes", 2)
    figures.set("turns", len(replies))
    figures.set("interleaved turns", len(interleaved))
    figures.set("insights shown", sum(shown.values()))
    figures.set("insights shown twice", len(twice))
    figures.set("switches between processes", alternations)
    assert interleaved == [], interleaved[:5]
    assert twice == {}, twice
    assert pending is None or pending not in shown  # a pending insight was never shown
    assert _left_checkpoints(db, thread) == 0
