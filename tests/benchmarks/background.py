"""Figure 7: background work is free for the user. The same conversation runs on an agent
that consolidates after every turn in the background (its summarising model takes
`latency / 2`) and on one that never does, both on a zero-latency model. Turns follow each
other at once, so consolidations always overlap the next turns (the worst case: real users
leave seconds between turns). Whole runs alternate (plain/background, then
background/plain, ...): interleaving single turns would put one agent's background work on
the other's clock."""

from __future__ import annotations

import tempfile
from functools import partial
from pathlib import Path

from stello_graph import Schedule, llm_consolidator
from stello_graph.testing import ScriptedChatModel
from tests.benchmarks._harness import Figure, Scale, measure, median
from tests.benchmarks._workload import Conversation, stello_agent, text

__all__ = ["background_figures"]


def _run(scale: Scale, background: bool, tmp: Path) -> tuple[list[float], list[float], int]:
    """Per-turn (wall, cpu) seconds, and how many consolidations ran."""
    conv = Conversation()
    summariser = ScriptedChatModel(default=text("summary"), latency=scale.latency / 2)
    options: dict[str, object] = {}
    if background:
        options = {
            "consolidate_fn": llm_consolidator(summariser),
            "schedule": Schedule(consolidate_every_n_turns=1),
        }
    wall: list[float] = []
    cpu: list[float] = []
    with stello_agent(conv.model(), tmp / "stello.db", **options) as agent:
        sid = agent.fork(agent.main_session_id, "Bench").id
        for n in range(1, scale.background_turns + 1):
            w, c = measure(partial(agent.turn, sid, conv.user(n)))
            wall.append(w)
            cpu.append(c)
        agent.drain()
        assert not agent.failures()
    return wall, cpu, summariser.call_count


def background_figures(scale: Scale) -> list[Figure]:
    """Figure 7."""
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    with_bg: list[float] = []
    plain: list[float] = []
    consolidations: list[int] = []
    for r in range(scale.runs):
        runs = {}
        for background in (False, True) if r % 2 == 0 else (True, False):
            with tempfile.TemporaryDirectory(prefix="stello-bench-") as tmp:
                runs[background] = _run(scale, background, Path(tmp))
        (bg_wall, bg_cpu, made), (wall, cpu, _) = runs[True], runs[False]
        ratios.append(median(bg_wall) / median(wall))
        cpu_ratios.append(median(bg_cpu) / median(cpu))
        with_bg.append(median(bg_wall))
        plain.append(median(wall))
        consolidations.append(made)
    latency = scale.latency / 2
    return [
        Figure(
            key="7",
            name=f"turn latency, consolidating after every turn ({latency * 1000:g} ms model)",
            value=median(ratios),
            unit="x",
            target=1.1,
            stello=median(with_bg) * 1000,
            baseline=median(plain) * 1000,
            detail={
                "runs": scale.runs,
                "turns": scale.background_turns,
                "consolidations": median(consolidations),
                "cpu_ratio": round(median(cpu_ratios), 3),
            },
        )
    ]
