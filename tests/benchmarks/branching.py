"""Figures 10: branching. A fork of a long session against copying a LangGraph thread of the
same conversation, and the digests of a large tree.

* **stello**: a 1,000-turn session (2,000 records of 400 characters) in a SQLite file,
  written through the storage API; `agent.fork(source, ..., context="inherit")` (all of it)
  and `at_turn=500` (half), on the agent that wrote it (its record cache is warm, as after
  a conversation) and, once, on a freshly opened file (cold: the history is decoded once to
  find the cut and check its tool-call groups). No row is written for the inherited
  records: the child shares its source's rows (a copy-on-write prefix, `copy_records`,
  `checkpoints/_shared_l3`), and copies them only if the source later trims below the cut
  or is removed: 10e times that deferred copy (a trim of the source with one fork sharing
  all of it).
* **LangGraph**: the same conversation in a `StateGraph(MessagesState)` thread under
  `SqliteSaver` on a file, written 10 turns per checkpoint (100 checkpoints: a real thread
  has one per superstep, so more). Copied with `get_state` + `update_state` into a new
  thread (the latest state: the usual way), every
  checkpoint copied with `list` + `put` (the thread's history too: `SqliteSaver` does not
  implement `copy_thread`), and for the fork at turn 500 the state history walked back to
  that turn, then `update_state`.
* **digests**: `agent.digests()` on the 10,000-session tree of figure 4 (every session one
  turn and an L2).
"""

from __future__ import annotations

import sqlite3
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, MessagesState, StateGraph

from stello_graph import MainSession, Session, StelloAgent
from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.models import TopologyNode
from stello_graph.testing import ScriptedChatModel
from tests.benchmarks._harness import FULL, Figure, Scale, measure, median, timed
from tests.benchmarks._workload import text
from tests.benchmarks.scale import _build

__all__ = ["branching_figures"]

_PER_CHECKPOINT = 10
"""Turns written to the LangGraph thread per checkpoint."""


def _turn(n: int) -> list[BaseMessage]:
    return [HumanMessage(text(f"u-{n}")), AIMessage(text(f"a-{n}"))]


def _stello_session(path: Path, turns: int) -> str:
    with SqliteMainStorage(path) as storage:
        main = MainSession.create(storage)
        source = Session.create(storage, label="Long discussion")
        with storage.transaction():
            storage.put_node(TopologyNode(id=source.id, parent_id=main.id, label="Long"))
            for n in range(1, turns + 1):
                storage.append_records(source.id, _turn(n), user_turn=True)
    return source.id


class _Thread:
    """The conversation as a LangGraph thread under `SqliteSaver`, and its copies."""

    def __init__(self, path: Path, turns: int) -> None:
        graph = StateGraph(MessagesState)
        graph.add_node("agent", lambda state: {})
        graph.add_edge(START, "agent")
        self.conn = sqlite3.connect(path, check_same_thread=False)
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.saver = SqliteSaver(self.conn)
        self.app = graph.compile(checkpointer=self.saver)
        self.copies = 0
        config = self.config("source")
        for first in range(1, turns + 1, _PER_CHECKPOINT):
            batch = [m for n in range(first, first + _PER_CHECKPOINT) for m in _turn(n)]
            self.app.update_state(config, {"messages": batch}, as_node="agent")

    @staticmethod
    def config(thread: str) -> Any:
        return {"configurable": {"thread_id": thread}}

    def _target(self) -> Any:
        self.copies += 1
        return self.config(f"copy-{self.copies}")

    def copy_checkpoints(self) -> None:
        """Every checkpoint of the thread into a new one, oldest first (what `copy_thread`
        would do; `SqliteSaver` does not implement it)."""
        config = self._target()
        config["configurable"]["checkpoint_ns"] = ""
        for found in reversed(list(self.saver.list(self.config("source")))):
            checkpoint = found.checkpoint
            versions = checkpoint["channel_versions"]
            config = self.saver.put(config, checkpoint, found.metadata, versions)

    def copy_state(self) -> None:
        values = self.app.get_state(self.config("source")).values
        self.app.update_state(self._target(), {"messages": values["messages"]}, as_node="agent")

    def copy_at(self, turn: int) -> None:
        for state in self.app.get_state_history(self.config("source")):
            if len(state.values.get("messages", ())) == 2 * turn:
                messages = state.values["messages"]
                break
        else:
            raise AssertionError(f"no checkpoint at turn {turn}")
        self.app.update_state(self._target(), {"messages": messages}, as_node="agent")

    def close(self) -> None:
        self.conn.close()


def _fork_figures(scale: Scale, tmp: Path) -> list[Figure]:
    turns = 1000 if scale is FULL else 20
    half = turns // 2
    model = ScriptedChatModel(default="ok")
    source = _stello_session(tmp / "stello.db", turns)
    with StelloAgent(model=model, storage=tmp / "stello.db") as agent:
        cold = timed(partial(agent.fork, source, "Cold", context="inherit"))
        whole = [measure(partial(agent.fork, source, f"All {n}", context="inherit"))
                 for n in range(scale.repeats)]  # fmt: skip
        at_half = [measure(partial(agent.fork, source, f"Half {n}", context="inherit",
                                   at_turn=half)) for n in range(scale.repeats)]  # fmt: skip
        child = agent.children(source)[-1]
        assert agent.storage.count_records(child.id) == 2 * half
        assert agent.lineage(child.id)[0].at_turn == half
    thread = _Thread(tmp / "langgraph.db", turns)
    try:
        states = [timed(thread.copy_state) for _ in range(scale.repeats)]
        copies = [timed(thread.copy_checkpoints) for _ in range(max(1, scale.repeats // 3))]
        history = [timed(partial(thread.copy_at, half)) for _ in range(max(1, scale.repeats // 3))]
    finally:
        thread.close()
    ms = 1000
    wall, half_wall = (median(w for w, _ in runs) * ms for runs in (whole, at_half))
    detail = {"turns": turns, "records": 2 * turns, "langgraph_checkpoints": turns // 10,
              "cpu_ms": round(median(c for _, c in whole) * ms, 2),
              "langgraph_copy_every_checkpoint_ms": round(median(copies) * ms, 2)}  # fmt: skip
    return [
        Figure(key="10a", name=f"fork inheriting a {turns:,}-turn session vs get/update_state",
               unit="ms", target=5, value=wall, stello=wall, baseline=median(states) * ms,
               detail=detail),
        Figure(key="10b", name=f"fork at turn {half} of {turns:,} vs history + update_state",
               unit="ms", target=5, value=half_wall, stello=half_wall,
               baseline=median(history) * ms,
               detail={"cpu_ms": round(median(c for _, c in at_half) * ms, 2)}),
        Figure(key="10c", name=f"fork inheriting {turns:,} turns, cold file (decoded once)",
               unit="ms", value=cold * ms),
    ]  # fmt: skip


def _trim_figure(scale: Scale, tmp: Path) -> Figure:
    """10e: the copy a shared prefix defers, paid by the source's first trim below the cut."""
    turns = 1000 if scale is FULL else 20
    runs = []
    for n in range(max(1, scale.repeats // 3)):
        path = tmp / f"trim-{n}.db"
        source = _stello_session(path, turns)
        with StelloAgent(model=ScriptedChatModel(default="ok"), storage=path) as agent:
            child = agent.fork(source, "Child", context="inherit")
            runs.append(timed(partial(agent.storage.trim_records, source, keep_last=2)))
            assert agent.storage.count_records(child.id) == 2 * turns
    return Figure(key="10e", name=f"trim of a source below a fork's cut ({2 * turns:,} rows "
                  "copied into the fork then)", unit="ms", value=median(runs) * 1000)  # fmt: skip


def _digest_figure(scale: Scale, tmp: Path) -> Figure:
    path = tmp / "tree.db"
    _build(path, scale)
    with StelloAgent(model=ScriptedChatModel(default="ok"), storage=path) as agent:
        runs = [measure(agent.digests) for _ in range(scale.repeats)]
        found = agent.digests()
    assert len(found) == scale.sessions + 1 and all(d.l2 for d in found if d.role != "main")
    cpu = round(median(c for _, c in runs) * 1000, 1)
    return Figure(key="10d", name=f"digests() of {scale.sessions:,} sessions", unit="ms",
                  target=100, value=median(w for w, _ in runs) * 1000,
                  detail={"cpu_ms": cpu})  # fmt: skip


def branching_figures(scale: Scale) -> list[Figure]:
    """Figures 10a-10e."""
    with tempfile.TemporaryDirectory(prefix="stello-bench-") as tmp:
        return [
            *_fork_figures(scale, Path(tmp)),
            _digest_figure(scale, Path(tmp)),
            _trim_figure(scale, Path(tmp)),
        ]
