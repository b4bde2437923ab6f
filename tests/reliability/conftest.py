"""Counts and figures of the reliability suites.

The suites are opt-in (`-m reliability`; `make test-reliability`). They run with CI counts by
default; `RELIABILITY_FULL=1` switches to the full local counts, and `RELIABILITY_<NAME>=n`
overrides one count (e.g. `RELIABILITY_KILLS=500`). `RELIABILITY_SEED` fixes the seed of
every random choice (default: a new one per run, printed in the summary).

Each suite adds its figures to `figures` (kills survived, operations checked, ...); they are
printed at the end of the run and, with `RELIABILITY_REPORT=path`, written there as JSON.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

FULL = os.environ.get("RELIABILITY_FULL", "") not in ("", "0")
SEED = int(os.environ.get("RELIABILITY_SEED") or random.SystemRandom().randrange(1, 10**6))

FIGURES: dict[str, dict[str, Any]] = {}


def count(name: str, *, ci: int, full: int) -> int:
    """The count `name` for this run: `RELIABILITY_<NAME>`, else the full or the CI value."""
    override = os.environ.get(f"RELIABILITY_{name.upper()}")
    if override:
        return int(override)
    return full if FULL else ci


class Figures:
    """The figures of one test, reported at the end of the run."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.values: dict[str, Any] = {}
        self._started = time.monotonic()

    def add(self, key: str, amount: int = 1) -> None:
        self.values[key] = self.values.get(key, 0) + amount

    def set(self, key: str, value: Any) -> None:
        self.values[key] = value

    def finish(self) -> None:
        self.values["seconds"] = round(time.monotonic() - self._started, 1)
        FIGURES[self.name] = self.values


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Iterator[Figures]:
    found = Figures(request.node.name)
    yield found
    found.finish()


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """A seed per test, derived from the run's seed and the test's name."""
    return random.Random(f"{SEED}:{request.node.name}").randrange(10**6)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FIGURES:
        return
    mode = "full" if FULL else "ci"
    terminalreporter.section(f"reliability figures ({mode} counts, RELIABILITY_SEED={SEED})")
    for name, values in FIGURES.items():
        shown = ", ".join(f"{k}={v}" for k, v in values.items())
        terminalreporter.write_line(f"{name}: {shown}")
    target = os.environ.get("RELIABILITY_REPORT")
    if target:
        Path(target).write_text(
            json.dumps({"mode": mode, "seed": SEED, "figures": FIGURES}, indent=2) + "\n"
        )
