"""Figure 4: a tree of 10,000 sessions in one SQLite file; 4g-4m: 10,000 and 100,000.

4a-4f: the tree is written through the storage API in one transaction (main -> hubs ->
leaves; one hub has 1,000 children; every session has one turn of records and an L2; one leaf
has the 600 records a fork inherits). Each operation is then timed `repeats` times on an agent
opened on that file; a figure is the median.

4g-4m: the same shape at `sessions` and ten times as many, each tree copied from a template
leaf in SQL (`_big_tree`), then read whole by the agent opened on it: `tree()`, `digests()`,
all L2s (at once and in pages), a `tree()` followed by its text and by every model it
builds on access (4g's detail), the streamed export (to `/dev/null`; its Python heap peak by
`tracemalloc`, its statements counted on the connection) and the star map.
"""

from __future__ import annotations

import os
import tempfile
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from stello_graph import MainSession, StelloAgent
from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.export import write_export
from stello_graph.models import SessionMeta, TopologyNode
from stello_graph.testing import ScriptedChatModel
from tests.benchmarks._big_tree import build_big_tree
from tests.benchmarks._harness import Figure, Scale, db_bytes, measure, median, timed
from tests.benchmarks._workload import text

__all__ = ["big_tree_figures", "scale_figures"]

HUBS = 10


@dataclass(frozen=True, slots=True)
class _Tree:
    wide: str
    leaves: list[str]
    source: str


def _turn(seed: str) -> list[BaseMessage]:
    return [HumanMessage(text(f"u-{seed}")), AIMessage(text(f"a-{seed}"))]


def _build(path: Path, scale: Scale) -> _Tree:
    with SqliteMainStorage(path) as storage:
        main = MainSession.create(storage)
        hubs = [f"hub-{h}" for h in range(HUBS)]
        leaves = [f"leaf-{n}" for n in range(scale.sessions - HUBS)]
        parents = [hubs[0]] * scale.children
        parents += [hubs[1 + n % (HUBS - 1)] for n in range(len(leaves) - scale.children)]
        with storage.transaction():
            for sid, parent in [*((h, main.id) for h in hubs), *zip(leaves, parents, strict=True)]:
                storage.put_session(SessionMeta(id=sid, label=f"Topic {sid}"))
                storage.put_node(TopologyNode(id=sid, parent_id=parent, label=f"Topic {sid}"))
                storage.append_records(sid, _turn(sid), user_turn=True)
                storage.put_memory(sid, text(f"l2-{sid}"), through=2)
            source = leaves[-1]
            for n in range(1, scale.fork_records // 2):
                storage.append_records(source, _turn(f"{source}-{n}"), user_turn=True)
    return _Tree(wide=hubs[0], leaves=leaves, source=source)


def _context(agent: StelloAgent, session_id: str) -> None:
    agent.session(session_id).turn_context()


def scale_figures(scale: Scale) -> list[Figure]:
    """Figures 4a-4f."""
    model = ScriptedChatModel(default="ok")
    with tempfile.TemporaryDirectory(prefix="stello-bench-") as tmp:
        path = Path(tmp) / "tree.db"
        built: list[_Tree] = []
        build = timed(lambda: built.append(_build(path, scale)))
        tree = built[0]
        opens = [
            timed(lambda: StelloAgent(model=model, storage=path).close())
            for _ in range(scale.repeats)
        ]
        with StelloAgent(model=model, storage=path) as agent:
            storage = agent.storage
            l2s = [timed(storage.get_all_session_l2s) for _ in range(scale.repeats)]
            assert len(storage.get_all_session_l2s()) == scale.sessions
            kids = [timed(lambda: storage.get_children(tree.wide)) for _ in range(scale.repeats)]
            assert len(storage.get_children(tree.wide)) == scale.children
            sample = tree.leaves[-1 - 5 * scale.repeats : -1]
            loads = [timed(partial(agent.session, sid)) for sid in sample[::2]]
            contexts = [timed(partial(_context, agent, sid)) for sid in sample[1::2]]
            forks = [
                timed(partial(agent.fork, tree.source, f"Fork {n}", context="inherit"))
                for n in range(scale.repeats)
            ]
        size = db_bytes(path)["bytes"]
    n, k, r = scale.sessions, scale.children, scale.fork_records
    detail = {"sessions": n, "db_mib": round(size / 2**20, 1), "build_s": round(build, 1)}
    ms = 1000
    return [
        Figure(key="4a", name=f"get_all_session_l2s(), {n:,} sessions", unit="ms", target=100,
               value=median(l2s) * ms, detail=detail),
        Figure(key="4b", name=f"get_children() of a node with {k:,} children", unit="ms",
               target=20, value=median(kids) * ms),
        Figure(key="4c", name="load a session (cold)", unit="ms", target=2,
               value=median(loads) * ms),
        Figure(key="4d", name="load a session + its turn context (cold)", unit="ms",
               target=2, value=median(contexts) * ms),
        Figure(key="4e", name=f"fork inheriting {r} records", unit="ms", target=30,
               value=median(forks) * ms),
        Figure(key="4f", name=f"open the agent on the {n:,}-session file", unit="ms",
               target=200, value=median(opens) * ms),
    ]  # fmt: skip


def _median_ms(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median `(wall, cpu)` milliseconds of `fn()` over `repeats` runs."""
    runs = [measure(fn) for _ in range(repeats)]
    return median(w for w, _ in runs) * 1000, median(c for _, c in runs) * 1000


def _export(agent: StelloAgent) -> None:
    with open(os.devnull, "w", encoding="utf-8") as sink:
        write_export(agent.storage, sink)


def _export_peak(agent: StelloAgent) -> float:
    """MiB of Python heap the export adds at its peak."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        _export(agent)
        return (tracemalloc.get_traced_memory()[1] - base) / 2**20
    finally:
        tracemalloc.stop()


def _every_model(agent: StelloAgent) -> None:
    tree = agent.tree()
    assert len(tree.nodes) == len(list(tree.sessions.values()))


def _statements(storage: SqliteMainStorage, fn: Callable[[], object]) -> int:
    seen: list[str] = []
    storage._conn.set_trace_callback(seen.append)
    try:
        fn()
    finally:
        storage._conn.set_trace_callback(None)
    return len(seen)


def _read_whole(path: Path, repeats: int, star_map: bool) -> dict[str, float]:
    model = ScriptedChatModel(default="ok")
    with StelloAgent(model=model, storage=path) as agent:
        storage = agent.storage
        assert isinstance(storage, SqliteMainStorage)
        agent.tree()  # warm the OS's page cache: every figure reads the whole file
        out: dict[str, float] = {}
        out["tree"], out["tree_cpu"] = _median_ms(agent.tree, repeats)
        # what the read leaves for the first view: its text, and every model it can build
        out["tree_text"], _ = _median_ms(lambda: agent.tree().render_text(), repeats)
        out["tree_models"], _ = _median_ms(partial(_every_model, agent), repeats)
        out["digests"], out["digests_cpu"] = _median_ms(agent.digests, repeats)
        out["l2s"], out["l2s_cpu"] = _median_ms(storage.get_all_session_l2s, repeats)
        pages = lambda: sum(map(len, storage.iter_session_l2s(batch=1_000)))  # noqa: E731
        out["l2_pages"], _ = _median_ms(pages, repeats)
        out["export"], out["export_cpu"] = _median_ms(partial(_export, agent), max(1, repeats // 3))
        out["export_peak_mib"] = _export_peak(agent)
        out["export_statements"] = _statements(storage, partial(_export, agent))
        if star_map:
            tree = agent.tree()
            wall, _ = measure(lambda: out.__setitem__("svg_mb", len(tree.render_svg()) / 1e6))
            out["svg_s"] = wall
    return out


def big_tree_figures(scale: Scale) -> list[Figure]:
    """Figures 4g-4m: whole-tree reads at `sessions` and ten times as many."""
    small_n, big_n = scale.sessions, scale.sessions * 10
    found: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="stello-bench-") as tmp:
        for n in (small_n, big_n):
            path = Path(tmp) / f"tree-{n}.db"
            build = measure(lambda: build_big_tree(path, n, scale.children))[0]  # noqa: B023
            found[n] = {"build_s": build, **_read_whole(path, scale.repeats, n == big_n)}
            path.unlink()
    small, big = found[small_n], found[big_n]

    def growth(key: str) -> dict[str, float]:
        return {f"{small_n}": round(small[key], 1), "growth": round(big[key] / small[key], 1)}

    def cpu(key: str) -> dict[str, float]:
        return {"cpu_ms": round(big[f"{key}_cpu"], 1), **growth(key)}

    size = f"{big_n:,} sessions"
    return [
        Figure(key="4g", name=f"agent.tree(), {size}", unit="ms", target=300,
               value=big["tree"],
               detail={**cpu("tree"), "then_render_text_ms": round(big["tree_text"], 1),
                       "then_every_model_ms": round(big["tree_models"], 1)}),
        Figure(key="4h", name=f"agent.digests(), {size}", unit="ms", target=300,
               value=big["digests"], detail=cpu("digests")),
        Figure(key="4i", name=f"get_all_session_l2s(), {size}", unit="ms", target=300,
               value=big["l2s"],
               detail={**cpu("l2s"), "in_pages_of_1000_ms": round(big["l2_pages"], 1)}),
        Figure(key="4j", name=f"streamed export to /dev/null, {size}", unit="ms",
               value=big["export"],
               detail={**cpu("export"), "statements": big["export_statements"],
                       f"statements_{small_n}": small["export_statements"]}),
        Figure(key="4k", name=f"export's heap peak, {size} against {small_n:,}", unit="x",
               target=1.5, value=big["export_peak_mib"] / small["export_peak_mib"],
               detail={"peak_mib": round(big["export_peak_mib"], 2),
                       f"peak_mib_{small_n}": round(small["export_peak_mib"], 2)}),
        Figure(key="4l", name=f"star map SVG, {size}", unit="MB", target=2, value=big["svg_mb"],
               detail={"render_s": round(big["svg_s"], 2)}),
        Figure(key="4m", name=f"build the {size} tree (SQL copies)", unit="s", value=big["build_s"],
               detail={f"build_s_{small_n}": round(small["build_s"], 1)}),
    ]  # fmt: skip
