"""Consolidations that overlap (scheduler, another thread or process): the L2 never loses
records and its cursor never moves back. Found by the concurrency suite."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from langchain_core.messages import BaseMessage, HumanMessage

from stello_graph import Session
from stello_graph.storage import MainStorage


def counting(current: str | None, records: list[BaseMessage]) -> str:
    """An L2 that says how many records it covers in all."""
    before = int(current.split()[1]) if current else 0
    return f"covers {before + len(records)}"


def _session(storage: MainStorage) -> Session:
    s = Session.create(storage, label="S")
    storage.append_records(s.id, [HumanMessage(f"m{i}") for i in range(4)])
    return s


async def _consolidate(s: Session, fn: Callable[..., str], mode: str) -> str | None:
    return s.consolidate(fn) if mode == "sync" else await s.aconsolidate(fn)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_slower_consolidation_does_not_overwrite_a_newer_one(
    main_storage: MainStorage, mode: str
) -> None:
    s = _session(main_storage)
    calls: list[str | None] = []

    def slow(current: str | None, records: list[BaseMessage]) -> str:
        calls.append(current)
        if len(calls) == 1:  # meanwhile, more records and another consolidation of them all
            main_storage.append_records(s.id, [HumanMessage("m4"), HumanMessage("m5")])
            assert s.consolidate(counting) == "covers 6"
        return counting(current, records)

    assert await _consolidate(s, slow, mode) == "covers 6"
    assert calls == [None]
    assert (s.memory(), main_storage.get_memory_through(s.id)) == ("covers 6", 6)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_consolidation_overtaken_by_an_older_one_starts_again(
    main_storage: MainStorage, mode: str
) -> None:
    s = _session(main_storage)
    calls: list[str | None] = []

    def overtaken(current: str | None, records: list[BaseMessage]) -> str:
        calls.append(current)
        if len(calls) == 1:  # an older consolidation (of 2 records) finishes meanwhile
            main_storage.append_records(s.id, [HumanMessage("m4"), HumanMessage("m5")])
            main_storage.put_memory(s.id, "covers 2", through=2)
        return counting(current, records)

    assert await _consolidate(s, overtaken, mode) == "covers 6"
    assert calls == [None, "covers 2"]  # started again from what the other one wrote
    assert main_storage.get_memory_through(s.id) == 6
