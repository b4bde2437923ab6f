"""Figures 1-3: per-turn overhead, its growth, and storage, against the LangGraph baseline.

Figures 3c and 3d are storage only (one untimed session each): 3c with short replies
(`SHORT_REPLY` characters), 3d with a `SqliteSaver` the user supplies, which keeps every
checkpoint (the agent prunes only the saver it makes itself).

Both agents run the same scripted conversation in one process. A run is one side's whole
session (300 turns, each timed on its own); sides alternate stello/baseline, then
baseline/stello (A/B/B/A...), so drift over the process's life hits both alike. Whole runs
alternate rather than single turns because the baseline writes megabytes per turn at the
end of its session and its disk flushes would land on the other side's clock. A run gives
the median of an early window ("turn 10": turns 6-15) and of the last window (turns
291-300); a figure is the median over runs. Wall-clock time is the figure; process CPU time
is given beside it, since it varies much less on a shared machine.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from langchain_core.messages import AIMessage, BaseMessage
from langgraph.checkpoint.sqlite import SqliteSaver

from stello_graph.testing import ScriptedChatModel
from tests.benchmarks._harness import Figure, Scale, db_bytes, measure, median
from tests.benchmarks._workload import (
    Baseline,
    Conversation,
    lookup,
    prompt_chars,
    stello_agent,
    text,
)

__all__ = ["SHORT_REPLY", "overhead_figures"]

SHORT_REPLY = 40
"""Characters of a reply in figures 3c and 3d (the user's messages stay 400)."""


@dataclass(frozen=True, slots=True)
class _Side:
    """One side's run: per-turn wall and CPU seconds, its file, the conversation's text."""

    wall: list[float]
    cpu: list[float]
    db: dict[str, int]
    raw_chars: int
    last_reply: object

    def window(self, scale: Scale, which: str, clock: str = "wall") -> float:
        times = self.wall if clock == "wall" else self.cpu
        if which == "early":
            first, last = scale.early
            return median(times[first - 1 : last])
        return median(times[-scale.window :])


def _drive(
    turn: Callable[[str], str], conv: Conversation, model: ScriptedChatModel, scale: Scale
) -> tuple[list[float], list[float], str]:
    """Run the conversation through `turn`, timing each turn; (wall, cpu, last reply)."""
    wall: list[float] = []
    cpu: list[float] = []
    replies: list[str] = []

    def one(user: str) -> None:
        replies.append(turn(user))

    for n in range(1, scale.turns + 1):
        w, c = measure(partial(one, conv.user(n)))
        wall.append(w)
        cpu.append(c)
        model.reset()  # the recorded prompts would keep every message alive
    return wall, cpu, replies[-1]


def _stello(scale: Scale, tool_round: bool, tmp: Path) -> _Side:
    conv = Conversation(tool_round)
    model = conv.model()
    agent = stello_agent(model, tmp / "stello.db", tools=[lookup])
    sid = agent.fork(agent.main_session_id, "Bench").id
    wall, cpu, reply = _drive(lambda user: agent.turn(sid, user).content, conv, model, scale)
    raw = sum(prompt_chars([m]) for m in agent.session(sid).messages())
    agent.close()
    return _Side(wall, cpu, db_bytes(tmp / "stello.db"), raw, reply)


def _baseline(scale: Scale, tool_round: bool, tmp: Path) -> _Side:
    conv = Conversation(tool_round)
    model = conv.model()
    base = Baseline(model, tmp / "baseline.db", [lookup])
    wall, cpu, reply = _drive(base.turn, conv, model, scale)
    base.close()
    return _Side(wall, cpu, db_bytes(tmp / "baseline.db"), 0, reply)


def _pair(scale: Scale, tool_round: bool, stello_first: bool) -> tuple[_Side, _Side]:
    sides: dict[str, _Side] = {}
    for name in ("stello", "baseline") if stello_first else ("baseline", "stello"):
        if scale.settle_disk:
            os.sync()  # start from a quiet disk: no write-back left by the previous run
        with tempfile.TemporaryDirectory(prefix="stello-bench-") as tmp:
            run = _stello if name == "stello" else _baseline
            sides[name] = run(scale, tool_round, Path(tmp))
    stello, baseline = sides["stello"], sides["baseline"]
    assert stello.last_reply == baseline.last_reply, "both sides must run the same conversation"
    return stello, baseline


def _latency(
    key: str, name: str, target: float, which: str, scale: Scale, pairs: list[tuple[_Side, _Side]]
) -> Figure:
    def ratio(clock: str) -> float:
        return median(
            s.window(scale, which, clock) / b.window(scale, which, clock) for s, b in pairs
        )

    return Figure(
        key=key,
        name=name,
        value=ratio("wall"),
        unit="x",
        target=target,
        stello=median(s.window(scale, which) for s, _ in pairs) * 1000,
        baseline=median(b.window(scale, which) for _, b in pairs) * 1000,
        detail={
            "runs": len(pairs),
            "cpu_ratio": round(ratio("cpu"), 3),
            "stello_cpu_ms": round(
                median(s.window(scale, which, "cpu") for s, _ in pairs) * 1e3, 3
            ),
            "baseline_cpu_ms": round(
                median(b.window(scale, which, "cpu") for _, b in pairs) * 1e3, 3
            ),
        },
    )


def _growth(key: str, name: str, scale: Scale, pairs: list[tuple[_Side, _Side]]) -> Figure:
    def growth(side: _Side, clock: str) -> float:
        return side.window(scale, "late", clock) / side.window(scale, "early", clock)

    return Figure(
        key=key,
        name=name,
        value=median(growth(s, "wall") for s, _ in pairs),
        unit="x",
        target=1.3,
        stello=median(growth(s, "wall") for s, _ in pairs),
        baseline=median(growth(b, "wall") for _, b in pairs),
        side_unit="x",
        detail={
            "stello_cpu_growth": round(median(growth(s, "cpu") for s, _ in pairs), 3),
            "baseline_cpu_growth": round(median(growth(b, "cpu") for _, b in pairs), 3),
        },
    )


def _storage(key: str, name: str, pairs: list[tuple[_Side, _Side]]) -> Figure:
    stello = [s for s, _ in pairs]
    return Figure(
        key=key,
        name=name,
        value=median(s.db["bytes"] / s.raw_chars for s in stello),
        unit="x raw",
        target=3.0,
        stello=median(s.db["bytes"] for s in stello) / 1024,
        baseline=median(b.db["bytes"] for _, b in pairs) / 1024,
        side_unit="KiB",
        detail={
            "raw_chars": median(s.raw_chars for s in stello),
            "baseline_x_raw": round(median(b.db["bytes"] / s.raw_chars for s, b in pairs), 1),
            "stello_free_bytes": median(s.db["free_bytes"] for s in stello),
        },
    )


@dataclass
class _ShortReplies(Conversation):
    """The conversation of figures 1-3 with replies of `SHORT_REPLY` characters."""

    def respond(self, messages: list[BaseMessage]) -> AIMessage | str:
        answer = super().respond(messages)
        return (
            answer if isinstance(answer, AIMessage) else text(f"reply-{self.replies}", SHORT_REPLY)
        )


def _stored(scale: Scale, tmp: Path, *, keep_everything: bool) -> tuple[dict[str, int], int]:
    """One untimed session with short replies: the file's size and the conversation's text."""
    conv = _ShortReplies()
    model = conv.model()
    path = tmp / "stello.db"
    conn = sqlite3.connect(path, check_same_thread=False) if keep_everything else None
    options = {"checkpointer": SqliteSaver(conn)} if conn is not None else {}
    agent = stello_agent(model, path, tools=[lookup], **options)
    sid = agent.fork(agent.main_session_id, "Bench").id
    for n in range(1, scale.turns + 1):
        agent.turn(sid, conv.user(n))
        model.reset()
    raw = sum(prompt_chars([m]) for m in agent.session(sid).messages())
    agent.close()
    if conn is not None:
        conn.close()
    return db_bytes(path), raw


def _short_storage(scale: Scale, key: str, keep_everything: bool, target: float) -> Figure:
    with tempfile.TemporaryDirectory(prefix="stello-bench-") as tmp:
        db, raw = _stored(scale, Path(tmp), keep_everything=keep_everything)
    saver = (
        "a user-supplied SqliteSaver (keeps every checkpoint)"
        if keep_everything
        else "default saver"
    )
    return Figure(
        key=key,
        name=f"db size after {scale.turns} turns / raw text, {SHORT_REPLY}-char replies, {saver}",
        value=db["bytes"] / raw,
        unit="x raw",
        target=target,
        stello=db["bytes"] / 1024,
        side_unit="KiB",
        detail={"raw_chars": raw, "free_bytes": db["free_bytes"]},
    )


def overhead_figures(scale: Scale) -> list[Figure]:
    """Figures 1a-1d, 2a-2b, 3a-3d."""
    figures: list[Figure] = []
    early, late = f"turn {scale.early[0]}-{scale.early[1]}", f"last {scale.window} turns"
    for tool_round, tag, keys in ((False, "no tools", "ab"), (True, "one tool round", "cd")):
        pairs = [_pair(scale, tool_round, stello_first=r % 2 == 0) for r in range(scale.runs)]
        half = "b" if tool_round else "a"
        figures += [
            _latency(f"1{keys[0]}", f"turn latency, {tag}, {early}", 1.0 if keys == "ab" else 1.5,
                     "early", scale, pairs),
            _latency(f"1{keys[1]}", f"turn latency, {tag}, {late} of {scale.turns}", 0.5, "late",
                     scale, pairs),
            _growth(f"2{half}", f"growth {late} / {early}, {tag}", scale, pairs),
            _storage(f"3{half}", f"db size after {scale.turns} turns / raw text, {tag}", pairs),
        ]  # fmt: skip
    figures += [
        _short_storage(scale, "3c", keep_everything=False, target=3.0),
        _short_storage(scale, "3d", keep_everything=True, target=10.0),
    ]
    return sorted(figures, key=lambda f: f.key)
