"""Run the figures, print one JSON line per figure as it is measured, then the table."""

from __future__ import annotations

import gc
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tests.benchmarks._harness import Figure, Scale, emit, machine, render_table

__all__ = ["GROUPS", "run_suite"]


def _overhead(scale: Scale) -> list[Figure]:
    from tests.benchmarks.overhead import overhead_figures

    return overhead_figures(scale)


def _scale(scale: Scale) -> list[Figure]:
    from tests.benchmarks.scale import big_tree_figures, scale_figures

    return [*scale_figures(scale), *big_tree_figures(scale)]


def _concurrency(scale: Scale) -> list[Figure]:
    from tests.benchmarks.concurrency import concurrency_figures

    return concurrency_figures(scale)


def _context(scale: Scale) -> list[Figure]:
    from tests.benchmarks.context import context_figures

    return context_figures(scale)


def _background(scale: Scale) -> list[Figure]:
    from tests.benchmarks.background import background_figures

    return background_figures(scale)


def _startup(scale: Scale) -> list[Figure]:
    from tests.benchmarks.startup import startup_figures

    return startup_figures(scale)


def _inspector(scale: Scale) -> list[Figure]:
    from tests.benchmarks.inspector import inspector_figures

    return inspector_figures(scale)


def _branching(scale: Scale) -> list[Figure]:
    from tests.benchmarks.branching import branching_figures

    return branching_figures(scale)


def _postgres(scale: Scale) -> list[Figure]:
    from tests.benchmarks.postgres import postgres_figures

    return postgres_figures(scale)


def _server(scale: Scale) -> list[Figure]:
    from tests.benchmarks.server import server_figures

    return server_figures(scale)


GROUPS: dict[str, Callable[[Scale], list[Figure]]] = {
    "overhead": _overhead,
    "scale": _scale,
    "concurrency": _concurrency,
    "context": _context,
    "background": _background,
    "startup": _startup,
    "inspector": _inspector,
    "branching": _branching,
    "postgres": _postgres,
    "server": _server,
}
"""Figure groups by name, in the order they run."""


def run_suite(
    scale: Scale, only: Sequence[str] = (), out: Path | None = None, quiet: bool = False
) -> list[Figure]:
    """Run the groups named in `only` (all when empty); return every figure."""
    unknown = set(only) - set(GROUPS)
    if unknown:
        raise SystemExit(f"unknown group(s) {sorted(unknown)}; choose from {list(GROUPS)}")
    figures: list[Figure] = []
    started = time.perf_counter()
    for name, group in GROUPS.items():
        if only and name not in only:
            continue
        gc.collect()
        gc.freeze()  # what is alive now is never garbage: keep it out of the timed collections
        try:
            for figure in group(scale):
                figures.append(figure if quiet else emit(figure))
        finally:
            gc.unfreeze()
    if not quiet:
        print()
        print(render_table(figures))
        print(f"\n{len(figures)} figures in {time.perf_counter() - started:.0f} s on {machine()}")
    if out is not None:
        data = {"machine": machine(), "figures": [f.as_json() for f in figures]}
        out.write_text(json.dumps(data, indent=2) + "\n")
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    from tests.benchmarks._harness import FULL, QUICK

    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks", description=__doc__)
    parser.add_argument("groups", nargs="*", help=f"groups to run (default all): {list(GROUPS)}")
    parser.add_argument("--quick", action="store_true", help="tiny counts: a smoke run")
    parser.add_argument("--out", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    figures = run_suite(QUICK if args.quick else FULL, args.groups, args.out)
    missed = [f for f in figures if f.ok is False]
    for f in missed:
        print(f"MISS {f.key} ({f.name}): {f.value:,.3g} {f.unit} against <= {f.target:,.3g} "
              f"{f.unit}, {f.miss():.0%} over", file=sys.stderr)  # fmt: skip
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
