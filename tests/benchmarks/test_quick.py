"""The benchmark suite at a tiny scale, so it keeps running (its figures mean nothing here)."""

from __future__ import annotations

import json
import math

import pytest

from tests.benchmarks._harness import QUICK, Figure, render_table
from tests.benchmarks.suite import GROUPS, run_suite

EXPECTED = {
    "overhead": ["1a", "1b", "1c", "1d", "2a", "2b", "3a", "3b", "3c", "3d"],
    "scale": ["4a", "4b", "4c", "4d", "4e", "4f", "4g", "4h", "4i", "4j", "4k", "4l", "4m"],
    "concurrency": ["5a", "5b", "5c", "5d", "5e"],
    "context": ["6a", "6b", "6c", "6d", "6e", "6f"],
    "background": ["7"],
    "startup": ["8c"],  # the quick scale starts no timed processes
    "inspector": ["9a", "9b", "9c"],  # 9b (Chromium) is skipped at the quick scale
    "branching": ["10a", "10b", "10c", "10d", "10e"],
    # the quick scale starts no processes (11e, 11f, 11k); skipped without PostgreSQL
    "postgres": ["11a", "11b", "11c", "11d", "11g", "11h", "11i", "11j"],
    "server": ["12a", "12b", "12c"],  # skipped: the quick scale starts no server
}


def test_a_group_runs_alone_and_unknown_ones_are_refused() -> None:
    figures = run_suite(QUICK, only=["startup"], quiet=True)
    assert [f.key for f in figures] == EXPECTED["startup"]
    with pytest.raises(SystemExit, match="unknown group") as refused:
        run_suite(QUICK, only=["startup", "nope"], quiet=True)
    assert all(name in str(refused.value) for name in GROUPS)


def test_quick_run_gives_every_figure() -> None:
    figures = run_suite(QUICK, quiet=True)
    assert [f.key for f in figures] == [key for keys in EXPECTED.values() for key in keys]
    for figure in figures:
        assert figure.skipped or (figure.value is not None and math.isfinite(figure.value))
        assert json.loads(figure.line())["figure"] == figure.key
    by_key = {f.key: f for f in figures}
    assert by_key["8c"].ok, by_key["8c"].detail  # provider SDKs stay lazy at any scale
    assert by_key["6a"].value is not None and by_key["6a"].value < 1
    table = render_table(figures)
    assert all(f.key in table for f in figures)


def test_status_of_a_figure() -> None:
    assert Figure(key="x", name="x", value=1.0, unit="ms", target=2.0).status() == "ok"
    missed = Figure(key="x", name="x", value=3.0, unit="ms", target=2.0)
    assert missed.status() == "MISS by 50%" and missed.miss() == 0.5
    assert Figure(key="x", name="x", value=3.0, unit="ms").status() == "info"
    assert Figure(key="x", name="x", value=None, unit="ms", skipped="n/a").status() == "skipped"


def test_a_miss_exits_non_zero_and_says_by_how_much(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.benchmarks import suite

    figure = Figure(key="1a", name="turn latency", value=1.25, unit="x", target=1.0)
    monkeypatch.setattr(suite, "run_suite", lambda *args, **kwargs: [figure])
    assert suite.main(["overhead"]) == 1
    assert "MISS 1a (turn latency): 1.25 x against <= 1 x, 25% over" in capsys.readouterr().err
    figure.value = 0.9
    assert suite.main(["overhead"]) == 0
