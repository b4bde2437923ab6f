"""Figures, scales, medians, and the table and JSON lines the suite prints."""

from __future__ import annotations

import gc
import json
import os
import platform
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "FULL",
    "QUICK",
    "Figure",
    "Scale",
    "db_bytes",
    "machine",
    "measure",
    "median",
    "render_table",
    "timed",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class Scale:
    """How big each benchmark runs. `FULL` is what the targets are about; `QUICK` only checks
    that the suite still runs."""

    runs: int
    """Independent repetitions of the turn-by-turn runs (figures 1-3)."""
    turns: int
    """Turns of a session (figures 1-3); the last window is its last `window` turns."""
    early: tuple[int, int]
    """First and last turn (from 1) of the early window ("turn 10")."""
    window: int
    sessions: int
    """Sessions in the tree of figure 4."""
    children: int
    """Children of the one wide node of figure 4."""
    fork_records: int
    """Records a fork inherits in figure 4."""
    repeats: int
    """Repetitions of each small operation (figure 4) and of each process (figure 8)."""
    consolidations: int
    concurrency: int
    latency: float
    """Seconds per model call in figures 5 and 7 (figure 7 uses half of it)."""
    topics: int
    topic_turns: int
    consolidate_every: int
    background_turns: int
    processes: int
    """Processes started per start-up figure (figure 8); 0 measures only the SDK check."""
    settle_disk: bool
    """Flush the OS's dirty pages (`os.sync()`) before each run of figures 1-3."""


FULL = Scale(
    runs=5,
    turns=300,
    early=(6, 15),
    window=10,
    sessions=10_000,
    children=1_000,
    fork_records=600,
    repeats=9,
    consolidations=100,
    concurrency=16,
    latency=0.1,
    topics=5,
    topic_turns=40,
    consolidate_every=5,
    background_turns=100,
    processes=7,
    settle_disk=True,
)

QUICK = Scale(
    runs=1,
    turns=12,
    early=(2, 5),
    window=4,
    sessions=60,
    children=20,
    fork_records=20,
    repeats=1,
    consolidations=6,
    concurrency=3,
    latency=0.01,
    topics=2,
    topic_turns=4,
    consolidate_every=2,
    background_turns=4,
    processes=0,
    settle_disk=False,
)


@dataclass(kw_only=True, slots=True)
class Figure:
    """One measured figure. `value` is compared with `target` (an upper bound)."""

    key: str
    name: str
    value: float | None
    unit: str
    target: float | None = None
    stello: float | None = None
    baseline: float | None = None
    side_unit: str = "ms"
    """Unit of `stello` and `baseline` (what each side measured)."""
    detail: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None

    @property
    def ok(self) -> bool | None:
        if self.target is None or self.value is None:
            return None
        return self.value <= self.target

    def status(self) -> str:
        if self.skipped is not None:
            return "skipped"
        if self.ok is False:
            return f"MISS by {self.miss():.0%}"
        return {None: "info", True: "ok"}[self.ok]

    def miss(self) -> float:
        """How far over its target the figure is, as a fraction of the target (0 when met)."""
        if self.target is None or self.value is None or self.value <= self.target:
            return 0.0
        return (self.value - self.target) / self.target if self.target else float("inf")

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["figure"] = data.pop("key")
        data["status"] = self.status()
        return {k: v for k, v in data.items() if v is not None and v != {}}

    def line(self) -> str:
        return json.dumps(self.as_json())


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def timed(fn: Callable[[], object]) -> float:
    """Seconds `fn()` took, after a full garbage collection (so that garbage left by the
    other side of an A/B pair is not collected on this side's clock)."""
    return measure(fn)[0]


def measure(fn: Callable[[], object]) -> tuple[float, float]:
    """`(wall, cpu)` seconds of `fn()`, after a full garbage collection. `cpu` is the
    process's CPU time (every thread: LangGraph writes checkpoints from a background
    thread); on a busy machine it varies much less than `wall`."""
    gc.collect()
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - start, time.process_time() - cpu


def db_bytes(path: Path) -> dict[str, int]:
    """Size of a SQLite file once its WAL is checkpointed (`db` + `wal`), and its free pages."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0] * page
    finally:
        conn.close()
    wal = Path(f"{path}-wal")
    size = path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
    return {"bytes": size, "free_bytes": free}


def machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "cores": os.cpu_count(),
        "platform": platform.platform(terse=True),
        "machine": platform.machine(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    number = f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
    return f"{number} {unit}".rstrip()


def render_table(figures: Sequence[Figure]) -> str:
    rows = [("fig", "what", "stello", "baseline", "value", "target", "status")]
    for f in figures:
        target = "-" if f.target is None else f"<= {_fmt(f.target, f.unit)}"
        value = f.skipped or _fmt(f.value, f.unit)
        stello, baseline = _fmt(f.stello, f.side_unit), _fmt(f.baseline, f.side_unit)
        rows.append((f.key, f.name, stello, baseline, value, target, f.status()))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def emit(figure: Figure) -> Figure:
    print(figure.line(), file=sys.stdout, flush=True)
    return figure
