"""A child archived while the integrate function runs gets no insight: integration checks
each child's status in the transaction that writes the insights, as every other write to a
session does, and returns only what it wrote."""

from __future__ import annotations

from typing import Any

import pytest

from stello_graph import IntegrationResult, MainSession, Session
from stello_graph.storage import MainStorage


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_no_insight_for_a_child_archived_during_integration(
    main_storage: MainStorage, mode: str
) -> None:
    main = MainSession.create(main_storage)
    kept, gone = Session.create(main_storage, label="Kept"), Session.create(main_storage)
    for child in (kept, gone):
        main_storage.put_memory(child.id, f"L2 of {child.id}")

    def integrate(children: Any, current: str | None) -> IntegrationResult:
        gone.archive()  # meanwhile, another writer archives one of the inputs
        return IntegrationResult(synthesis="S", insights={kept.id: "for kept", gone.id: "x"})

    if mode == "sync":
        result = main.integrate(integrate)
    else:
        result = await main.aintegrate(integrate)
    assert result.insights == {kept.id: "for kept"}
    assert (kept.insight(), gone.insight()) == ("for kept", None)
    assert main.synthesis() == "S"
