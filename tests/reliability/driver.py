"""Crash-suite driver: `python -m tests.reliability.driver DB ACK SEED`.

Runs a random mix of operations on the agent stored in `DB` until it is killed: turns (with
tool rounds and model-initiated forks), forks, archives, consolidations and integrations,
sync and async, with background consolidation sometimes on. After each call returns, one
JSON line saying what must now be stored is appended to `ACK` and fsync'ed. The first line
of a run is `{"op": "ready", ...}`, written once the agent is open.
"""

from __future__ import annotations

import asyncio
import random
import sys
from typing import Any

from stello_graph import (
    IntegrationSupersededError,
    NothingToIntegrateError,
    Schedule,
    StelloAgent,
)
from stello_graph.testing import ScriptedChatModel
from tests.reliability import _scenario as sc

OPS = ("turn", "fork", "archive", "consolidate", "integrate")
WEIGHTS = (10, 2, 0.5, 2, 1.5)


def open_agent(db: str, run: int, rng: random.Random) -> StelloAgent:
    every = rng.choice([None, None, 2, 3])
    schedule = (
        Schedule(
            consolidate_every_n_turns=every,
            integrate_after_consolidate=rng.random() < 0.5,
            retry_attempts=1,
        )
        if every is not None
        else None
    )
    model = ScriptedChatModel(respond=sc.respond, latency=rng.choice([0.001, 0.003, 0.01]))
    return StelloAgent(
        model=model,
        storage=db,
        tools=sc.tools(),
        consolidate_fn=sc.consolidate,
        integrate_fn=sc.Integrator(run),
        schedule=schedule,
        durability=rng.choice(["sync", "async", "exit"]),
    )


class Driver:
    def __init__(self, agent: StelloAgent, acks: sc.AckWriter, run: int, rng: random.Random):
        self.agent = agent
        self.acks = acks
        self.run = run
        self.rng = rng
        self.n = 0

    def _active(self, *, children: bool = False) -> list[str]:
        metas = self.agent.storage.list_sessions(status="active")
        return [m.id for m in metas if not children or m.role == "standard"]

    def _call(self, sync: Any, make_async: Any) -> Any:
        if self.rng.random() < 0.3:
            return asyncio.run(make_async())
        return sync()

    def step(self) -> None:
        op = self.rng.choices(OPS, WEIGHTS)[0]
        self.acks.begin(op)
        getattr(self, f"op_{op}")()

    def resume_in_flight(self) -> None:
        """Resume the turns a crash left in flight, as an application restarting would."""
        a = self.agent
        for meta in a.storage.list_sessions(status="active"):
            if not a.graph.get_state(a.config(meta.id)).next:
                continue
            self.acks.begin("resume")
            result = a.resume(meta.id)
            self.acks.write({"op": "resumed", "sid": meta.id, "reply": result.content})

    def op_turn(self) -> None:
        sid = self.rng.choice(self._active())
        self.n += 1
        text = f"u-{self.run}-{self.n}"
        a = self.agent
        result = self._call(lambda: a.turn(sid, text), lambda: a.aturn(sid, text))
        self.acks.write(
            {
                "op": "turn",
                "sid": sid,
                "text": text,
                "reply": result.content,
                "saw": sc.saw_tags(result.content),
            }
        )

    def op_fork(self) -> None:
        source = self.rng.choice(self._active())
        self.n += 1
        label = f"fork-{self.run}-{self.n}"
        options: dict[str, Any] = {"context": self.rng.choice(["none", "inherit"])}
        if self.rng.random() < 0.3:
            options["prompt"] = f"opening {label}"
        a = self.agent
        node = self._call(
            lambda: a.fork(source, label, **options), lambda: a.afork(source, label, **options)
        )
        self.acks.write({"op": "fork", "sid": node.id, "parent": source, "label": label})

    def op_archive(self) -> None:
        children = self._active(children=True)
        if len(children) < 3:
            return
        sid = self.rng.choice(children)
        a = self.agent
        self._call(lambda: a.archive(sid), lambda: a.aarchive(sid))
        self.acks.write({"op": "archive", "sid": sid})

    def op_consolidate(self) -> None:
        children = self._active(children=True)
        if not children:
            return
        sid = self.rng.choice(children)
        a = self.agent
        l2 = self._call(lambda: a.consolidate(sid), lambda: a.aconsolidate(sid))
        self.acks.write({"op": "consolidate", "sid": sid, "covers": sc.l2_count(l2) or 0})

    def op_integrate(self) -> None:
        a = self.agent
        try:
            result = self._call(a.integrate, a.aintegrate)
        except (NothingToIntegrateError, IntegrationSupersededError):
            return  # nothing to read, or a scheduled one was stored meanwhile: not stored
        self.acks.write(
            {"op": "integrate", "synthesis": result.synthesis, "insights": result.insights}
        )


def main(argv: list[str]) -> int:
    db, ack_path, seed = argv[1], argv[2], int(argv[3])
    rng = random.Random(seed)
    acks = sc.AckWriter(ack_path)
    agent = open_agent(db, seed, rng)
    acks.write({"op": "ready", "run": seed})
    driver = Driver(agent, acks, seed, rng)
    if rng.random() < 0.5:
        driver.resume_in_flight()
    while True:
        driver.step()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
