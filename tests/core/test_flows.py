"""Operations written once as flows: both drivers do the same, errors land where they did."""

from __future__ import annotations

import pytest
from langchain_core.messages import BaseMessage

from stello_graph import Session
from stello_graph._flow import Call, Flow, Storage, arun, run
from stello_graph.checkpoints import InMemoryMainStorage
from stello_graph.errors import SessionArchivedError
from stello_graph.storage import MainStorage
from stello_graph.testing import ScriptedChatModel


def _summarise(previous: str | None, records: list[BaseMessage]) -> str:
    return f"{len(records)} records"


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_archived_ok_consolidates_an_archived_session_on_both_sides(mode: str) -> None:
    storage = InMemoryMainStorage()
    session = Session.create(storage, model=ScriptedChatModel(default="ok"))
    session.send("hi")
    session.archive()
    if mode == "sync":
        with pytest.raises(SessionArchivedError):
            session.consolidate(_summarise)
        assert session.consolidate(_summarise, archived_ok=True) == "2 records"
    else:
        with pytest.raises(SessionArchivedError):
            await session.aconsolidate(_summarise)
        assert await session.aconsolidate(_summarise, archived_ok=True) == "2 records"


def _failing() -> str:
    raise ValueError("boom")


async def _afailing() -> str:
    raise ValueError("boom")


def _flow() -> Flow[str]:
    try:
        yield Call(_failing, _afailing)
    except ValueError as exc:  # a step's error is raised where the flow yielded it
        count = yield Storage(MainStorage.count_records, "missing")
        return f"caught {exc} ({count})"
    return "not reached"


async def test_a_failing_step_is_raised_inside_the_flow() -> None:
    storage = InMemoryMainStorage()
    assert run(_flow(), storage) == "caught boom (0)"
    assert await arun(_flow(), storage) == "caught boom (0)"
