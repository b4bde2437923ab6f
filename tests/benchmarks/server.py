"""Figure 12: turns under load on LangGraph Server.

`langgraph dev` serves the stello graph and, side by side, a plain `create_agent` graph (no
tools). Each is driven by `concurrency` clients at once (16 at full scale), each a
`langgraph-sdk` sync client on a thread of its own, each on a thread of the server: one warm-up
turn, then `window` timed turns (10). Both graphs call one scripted OpenAI-compatible server
over HTTP that answers after `latency` (100 ms). Stello's clients each use a tree of their own;
its server keeps its defaults (background consolidation every 8 turns included). The phases
alternate (plain, stello, plain, stello) so drift hits both alike; a turn is `runs.wait` as a
client sees it. 12a is the ratio of the median turn latencies (target <= 1.1), 12b of the 95th
percentiles, 12c of the turns per second (stello's over the plain graph's)."""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langgraph_sdk.schema import Config

from stello_graph.testing.openai_server import FakeOpenAI, Reply
from tests.benchmarks._harness import Figure, Scale
from tests.server.langgraph_dev import ROOT, running_server

__all__ = ["server_figures"]

ROUNDS = 2
"""Phases per graph, alternated."""


@dataclass(slots=True)
class _Phase:
    latencies: list[float] = field(default_factory=list)
    turns_per_second: list[float] = field(default_factory=list)


def _client_turns(
    url: str, graph: str, config: Config, turns: int, start: threading.Barrier
) -> list[float]:
    from langgraph_sdk import get_sync_client

    client = get_sync_client(url=url, timeout=120.0)
    thread = str(client.threads.create()["thread_id"])

    def turn(n: int) -> float:
        payload: dict[str, Any] = {"messages": [{"role": "user", "content": f"Point {n}?"}]}
        began = time.perf_counter()
        out = client.runs.wait(thread, graph, input=payload, config=config)
        if not isinstance(out, dict) or "__error__" in out:
            raise RuntimeError(f"{graph} run failed: {out!r}")
        return time.perf_counter() - began

    turn(0)  # warm-up: opens the tree, loads the graph's modules
    start.wait()
    return [turn(n) for n in range(1, turns + 1)]


def _phase(url: str, graph: str, clients: int, turns: int, tag: str, into: _Phase) -> None:
    start = threading.Barrier(clients + 1)
    configs: list[Config] = [
        {"configurable": {"tree_id": f"bench-{tag}-{n}"}} if graph == "stello" else {}
        for n in range(clients)
    ]
    with ThreadPoolExecutor(clients) as pool:
        futures = [
            pool.submit(_client_turns, url, graph, config, turns, start) for config in configs
        ]
        start.wait()
        began = time.perf_counter()
        results = [future.result() for future in futures]
        wall = time.perf_counter() - began
    into.latencies.extend(x for result in results for x in result)
    into.turns_per_second.append(clients * turns / wall)


def _p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[18] if len(values) > 1 else values[0]


def server_figures(scale: Scale) -> list[Figure]:
    clients, turns = scale.concurrency, scale.window
    keys = (("12a", "server turn p50, 16 clients"), ("12b", "server turn p95, 16 clients"),
            ("12c", "server turns per second"))  # fmt: skip
    if not scale.processes:
        why = "the quick scale starts no server"
        return [Figure(key=k, name=n, value=None, unit="x", skipped=why) for k, n in keys]
    sides = {"plain": _Phase(), "stello": _Phase()}
    with tempfile.TemporaryDirectory(prefix="stello-bench-") as tmp, FakeOpenAI(
        default=Reply(content="Noted: a short answer.", delay=scale.latency)
    ) as model:  # fmt: skip
        workdir = Path(tmp)
        config = workdir / "langgraph.json"
        config.write_text(json.dumps({
            "dependencies": [str(ROOT)],
            "graphs": {"stello": "stello_graph.server:amake_graph",
                       "plain": "tests.benchmarks._server_graph:graph"},
        }))  # fmt: skip
        with running_server(
            workdir, config, jobs=2 * clients, STELLO_MODEL="bench", OPENAI_API_KEY="x",
            OPENAI_BASE_URL=model.base_url, STELLO_DATABASE_URI=str(workdir / "trees.db"),
        ) as server:  # fmt: skip
            for n in range(ROUNDS):
                for graph, phase in sides.items():
                    _phase(server.url, graph, clients, turns, f"{n}", phase)
            blocking = server.blocking_calls()
    if blocking:
        raise RuntimeError(f"blocking calls on the server's event loop: {blocking[:1]}")
    stello, plain = sides["stello"], sides["plain"]
    measured: list[tuple[Callable[[_Phase], float], float | None, str]] = [
        (lambda p: statistics.median(p.latencies) * 1000, 1.1, "ms"),
        (lambda p: _p95(p.latencies) * 1000, None, "ms"),
        (lambda p: statistics.median(p.turns_per_second), None, "turns/s"),
    ]
    figures = []
    for (key, name), (of, target, unit) in zip(keys, measured, strict=True):
        ours, theirs = of(stello), of(plain)
        figures.append(Figure(
            key=key, name=name, value=ours / theirs, unit="x", target=target, stello=ours,
            baseline=theirs, side_unit=unit,
            detail={"clients": clients, "turns": turns, "rounds": ROUNDS,
                    "latency_ms": scale.latency * 1000},
        ))  # fmt: skip
    return figures
