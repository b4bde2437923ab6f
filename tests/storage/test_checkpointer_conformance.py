"""LangGraph's checkpointer conformance suite (`langgraph-checkpoint-conformance`) on the
checkpointers `open_sqlite` and `open_postgres` return beside their storage: every base
capability (put, put_writes, get_tuple, list, delete_thread), and each extended one the
checkpointer offers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate

from tests._postgres import POSTGRES

Opener = Callable[[Path], tuple[Any, Any]]


def _sqlite(tmp_path: Path) -> tuple[Any, Any]:
    from stello_graph.checkpoints import open_sqlite

    return open_sqlite(tmp_path.with_suffix(".db"))


def _postgres(tmp_path: Path) -> tuple[Any, Any]:
    from stello_graph.checkpoints import open_postgres

    return open_postgres(POSTGRES.dsn_for(tmp_path))


OPENERS: dict[str, Opener] = {"sqlite": _sqlite}
if POSTGRES.wanted:
    OPENERS["postgres"] = _postgres


@pytest.mark.parametrize("backend", list(OPENERS))
async def test_the_checkpointer_passes_langgraphs_conformance_suite(
    backend: str, tmp_path: Path
) -> None:
    runs = iter(range(100))

    @checkpointer_test(name=f"stello {backend}")
    async def checkpointer() -> AsyncIterator[Any]:
        storage, saver = OPENERS[backend](tmp_path / str(next(runs)))  # a fresh one per suite
        try:
            yield saver
        finally:
            saver.close()
            storage.close()

    report = await validate(checkpointer)
    failures = {
        name: result.failures for name, result in report.results.items() if result.passed is False
    }
    assert failures == {}
    assert report.passed_all_base()
    ran = sum(result.tests_passed for result in report.results.values())
    assert ran >= 50, f"only {ran} conformance tests ran"
