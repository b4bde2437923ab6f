"""Figure 4: a tree of 10,000 sessions in one SQLite file.

The tree is written through the storage API in one transaction (main -> hubs -> leaves; one
hub has 1,000 children; every session has one turn of records and an L2; one leaf has the
600 records a fork inherits). Each operation is then timed `repeats` times on an agent opened
on that file; a figure is the median.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from stello_graph import MainSession, StelloAgent
from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.models import SessionMeta, TopologyNode
from stello_graph.testing import ScriptedChatModel
from tests.benchmarks._harness import Figure, Scale, db_bytes, median, timed
from tests.benchmarks._workload import text

__all__ = ["scale_figures"]

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
