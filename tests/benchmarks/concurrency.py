"""Figure 5: model calls overlap. Consolidating many sessions at a given concurrency, with a
model that takes `latency` per call, should take about ceil(n / concurrency) latencies; a
tree integration about one latency per level of the tree, not one per integrating node.

Figures 5d / 5e: turns on several sessions at once (8 threads, or 8 `aturn`s gathered on one
event loop), each model call taking half of `latency` (50 ms at full scale), against the peer:
the plain LangGraph chat agent of `_workload.Baseline` doing the same on 8 threads of its own
(`SqliteSaver`; `AsyncSqliteSaver` for the async figure). A round is every session's turn;
its time is one model latency plus whatever the turns' CPU work (GIL-bound on both sides)
adds on top. The figure is the ratio of the median rounds."""

from __future__ import annotations

import asyncio
import json
import math
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from stello_graph import StelloAgent, llm_consolidator, llm_integrator
from stello_graph.testing import ScriptedChatModel
from tests.benchmarks._harness import Figure, Scale, median, timed
from tests.benchmarks._workload import Baseline, text

__all__ = ["concurrency_figures"]

TREE_LEVELS = 3
TREE_BRANCHING = 3
PARALLEL_SESSIONS = 8
WARM_TURNS = 3


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


def _rounds(scale: Scale) -> int:
    return max(2, scale.runs * 2)


def _timed_rounds(round_: Callable[[int], None], rounds: int) -> list[float]:
    times = []
    for r in range(rounds):
        began = time.perf_counter()
        round_(r)
        times.append(time.perf_counter() - began)
    return times


def _threaded_stello(tmp: Path, latency: float, rounds: int) -> list[float]:
    model = ScriptedChatModel(default=text("reply"), latency=latency)
    with StelloAgent(model=model, storage=tmp / "stello.db") as agent:
        ids = [agent.fork(agent.main_session_id, f"T{n}").id for n in range(PARALLEL_SESSIONS)]
        with ThreadPoolExecutor(PARALLEL_SESSIONS) as pool:

            def round_(r: int) -> None:
                list(pool.map(lambda sid: agent.turn(sid, text(f"{sid}-{r}")), ids))

            for r in range(WARM_TURNS):
                round_(-1 - r)
            return _timed_rounds(round_, rounds)


def _threaded_peer(tmp: Path, latency: float, rounds: int) -> list[float]:
    model = ScriptedChatModel(default=text("reply"), latency=latency)
    base = Baseline(model, tmp / "peer.db", [])
    threads = [f"t{n}" for n in range(PARALLEL_SESSIONS)]
    try:
        with ThreadPoolExecutor(PARALLEL_SESSIONS) as pool:

            def turn(thread: str, user: str) -> None:
                config: Any = {"configurable": {"thread_id": thread}}
                base.app.invoke({"messages": [HumanMessage(user)]}, config)

            def round_(r: int) -> None:
                list(pool.map(lambda t: turn(t, text(f"{t}-{r}")), threads))

            for r in range(WARM_TURNS):
                round_(-1 - r)
            return _timed_rounds(round_, rounds)
    finally:
        base.close()


async def _atimed_rounds(round_: Callable[[int], Awaitable[None]], rounds: int) -> list[float]:
    for r in range(WARM_TURNS):
        await round_(-1 - r)
    times = []
    for r in range(rounds):
        began = time.perf_counter()
        await round_(r)
        times.append(time.perf_counter() - began)
    return times


async def _async_stello(tmp: Path, latency: float, rounds: int) -> list[float]:
    model = ScriptedChatModel(default=text("reply"), latency=latency)
    async with StelloAgent(model=model, storage=tmp / "astello.db") as agent:
        ids = [
            (await agent.afork(agent.main_session_id, f"A{n}")).id for n in range(PARALLEL_SESSIONS)
        ]

        async def round_(r: int) -> None:
            await asyncio.gather(*(agent.aturn(sid, text(f"{sid}-{r}")) for sid in ids))

        return await _atimed_rounds(round_, rounds)


async def _async_peer(tmp: Path, latency: float, rounds: int) -> list[float]:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
    from langgraph.graph import START, MessagesState, StateGraph

    model = ScriptedChatModel(default=text("reply"), latency=latency)

    async def agent_node(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent_node)
    graph.add_edge(START, "agent")
    async with AsyncSqliteSaver.from_conn_string(str(tmp / "apeer.db")) as saver:
        await saver.conn.execute("PRAGMA synchronous=NORMAL")
        app = graph.compile(checkpointer=saver)
        threads = [f"t{n}" for n in range(PARALLEL_SESSIONS)]

        async def turn(thread: str, user: str) -> None:
            config: Any = {"configurable": {"thread_id": thread}}
            await app.ainvoke({"messages": [HumanMessage(user)]}, config)

        async def round_(r: int) -> None:
            await asyncio.gather(*(turn(t, text(f"{t}-{r}")) for t in threads))

        return await _atimed_rounds(round_, rounds)


def _parallel_turns(scale: Scale) -> list[Figure]:
    latency, rounds = scale.latency / 2, _rounds(scale)
    sides: dict[str, dict[str, list[float]]] = {"5d": {}, "5e": {}}
    with tempfile.TemporaryDirectory(prefix="stello-bench-") as tmp:
        for run in range(2):  # A/B then B/A
            order = ("stello", "peer") if run == 0 else ("peer", "stello")
            for side in order:
                where = Path(tmp) / f"{side}{run}"
                where.mkdir()
                threaded = _threaded_stello if side == "stello" else _threaded_peer
                sides["5d"].setdefault(side, []).extend(threaded(where, latency, rounds))
                gathered = _async_stello if side == "stello" else _async_peer
                sides["5e"].setdefault(side, []).extend(
                    asyncio.run(gathered(where, latency, rounds))
                )
    figures = []
    names = {
        "5d": f"{PARALLEL_SESSIONS} threads on {PARALLEL_SESSIONS} sessions",
        "5e": f"asyncio: {PARALLEL_SESSIONS} aturn gathered on {PARALLEL_SESSIONS} sessions",
    }
    for key, found in sides.items():
        ours, peer = median(found["stello"]), median(found["peer"])
        figures.append(
            Figure(
                key=key,
                name=f"{names[key]}, {latency * 1000:g} ms model: round vs plain LangGraph",
                value=ours / peer,
                unit="x",
                target=1.0,
                stello=ours * 1000,
                baseline=peer * 1000,
                detail={"ideal_ms": latency * 1000, "rounds": len(found["stello"])},
            )
        )
    return figures


def concurrency_figures(scale: Scale) -> list[Figure]:
    """Figures 5a-5e."""
    return [*_consolidation(scale), _tree_integration(scale), *_parallel_turns(scale)]
