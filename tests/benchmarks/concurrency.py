"""Figure 5: model calls overlap. Consolidating many sessions at a given concurrency, with a
model that takes `latency` per call, should take about ceil(n / concurrency) latencies; a
tree integration about one latency per level of the tree, not one per integrating node."""

from __future__ import annotations

import asyncio
import json
import math
import tempfile
from functools import partial
from pathlib import Path

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from stello_graph import StelloAgent, llm_consolidator, llm_integrator
from stello_graph.testing import ScriptedChatModel
from tests.benchmarks._harness import Figure, Scale, median, timed
from tests.benchmarks._workload import text

__all__ = ["concurrency_figures"]

TREE_LEVELS = 3
TREE_BRANCHING = 3


def _sessions(agent: StelloAgent, count: int, prefix: str) -> list[str]:
    ids = []
    for n in range(count):
        sid = agent.fork(agent.main_session_id, f"{prefix} {n}").id
        records = [HumanMessage(text(f"{prefix}-u{n}")), AIMessage(text(f"{prefix}-a{n}"))]
        agent.storage.append_records(sid, records, user_turn=True)
        ids.append(sid)
    return ids


def _consolidation(scale: Scale) -> list[Figure]:
    n, k, latency = scale.consolidations, scale.concurrency, scale.latency
    summariser = ScriptedChatModel(default=text("summary"), latency=latency)
    ideal = math.ceil(n / k) * latency
    figures = []
    with tempfile.TemporaryDirectory(prefix="stello-bench-") as tmp:
        agent = StelloAgent(
            model=ScriptedChatModel(default="ok"),
            storage=Path(tmp) / "stello.db",
            consolidate_fn=llm_consolidator(summariser),
        )
        took: list[float] = []
        atook: list[float] = []
        with agent:
            for run in range(scale.runs):  # fresh sessions: consolidation is idempotent
                ids, aids = _sessions(agent, n, f"s{run}"), _sessions(agent, n, f"a{run}")
                took.append(timed(partial(agent.consolidate_many, ids, concurrency=k)))
                batch = agent.aconsolidate_many(aids, concurrency=k)
                atook.append(timed(partial(asyncio.run, batch)))
            assert summariser.call_count == 2 * n * scale.runs
    pairs = (("5a", "consolidate_many", median(took)), ("5b", "aconsolidate_many", median(atook)))
    for key, how, seconds in pairs:
        figures.append(
            Figure(
                key=key,
                name=f"{how}: {n} sessions, concurrency {k}, {latency * 1000:g} ms model",
                value=seconds / ideal,
                unit="x ideal",
                target=1.5,
                stello=seconds * 1000,
                detail={"ideal_ms": ideal * 1000},
            )
        )
    return figures


def _integrator_reply(messages: list[BaseMessage]) -> str:
    ids = [part.split('"')[0] for part in messages[-1].text.split('session_id="')[1:]]
    return json.dumps(
        {"synthesis": text("synthesis"), "insights": dict.fromkeys(ids, "look there")}
    )


def _tree_integration(scale: Scale) -> Figure:
    name = f"tree integration, {TREE_LEVELS} levels, {scale.latency * 1000:g} ms model"
    model = ScriptedChatModel(respond=_integrator_reply, latency=scale.latency)
    with tempfile.TemporaryDirectory(prefix="stello-bench-") as tmp:
        agent = StelloAgent(
            model=ScriptedChatModel(default="ok"),
            storage=Path(tmp) / "stello.db",
            integrate_fn=llm_integrator(model),
            consolidate_fn=lambda current, records: "L2",
        )
        with agent:
            level = [agent.main_session_id]
            for depth in range(TREE_LEVELS):
                below = []
                for parent in level:
                    for b in range(TREE_BRANCHING):
                        below.append(agent.fork(parent, f"L{depth + 1}.{b}").id)
                level = below
            for sid in level:
                agent.storage.put_memory(sid, text(f"l2-{sid}"))
            seconds = median(timed(lambda: agent.integrate(mode="tree")) for _ in range(scale.runs))
    parents = sum(TREE_BRANCHING**d for d in range(TREE_LEVELS))
    return Figure(
        key="5c",
        name=name,
        value=seconds / scale.latency,
        unit="x latency",
        target=1.5 * TREE_LEVELS,
        stello=seconds * 1000,
        detail={"model_calls": model.call_count / scale.runs, "integrating_nodes": parents},
    )


def concurrency_figures(scale: Scale) -> list[Figure]:
    """Figures 5a-5c."""
    return [*_consolidation(scale), _tree_integration(scale)]
