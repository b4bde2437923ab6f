"""Two resumes of one interrupted turn at once (two processes, a double click): one goes on.

A resume reads the turn's state under the session's lease, so the one that gets the lease
second finds the turn already finished and says so (`InvalidInputError`) instead of
returning the other's reply as its own. The tool behind the interrupt runs once, with the
winner's value.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import tool
from langgraph.types import interrupt

from stello_graph import StelloAgent
from stello_graph.errors import InvalidInputError
from stello_graph.testing import ScriptedChatModel
from tests.orchestration.conftest import AgentsOnFile

_RAN: list[Any] = []


@tool
def confirm(what: str) -> str:
    """Ask the user to confirm."""
    answer = interrupt({"confirm": what})
    _RAN.append(answer)
    return f"confirmed: {answer}"


@pytest.fixture
def interrupted(on_file: AgentsOnFile, tmp_path: Path) -> tuple[StelloAgent, StelloAgent, str]:
    """Two agents on one file (two processes, say) and a session whose turn waits."""
    _RAN.clear()
    db = tmp_path / "shared.db"
    call = ScriptedChatModel.tool_call("confirm", {"what": "x"})
    model = ScriptedChatModel([call, "Done.", "again?"], latency=0.2)  # the resumed call waits
    first = on_file(db, model, tools=[confirm])
    sid = first.main_session_id
    assert first.turn(sid, "do it").interrupted
    return first, on_file(db, model, tools=[confirm]), sid


def _one_went_on(outcomes: list[Any], agent: StelloAgent, sid: str) -> None:
    done = [found for found in outcomes if not isinstance(found, BaseException)]
    refused = [found for found in outcomes if isinstance(found, BaseException)]
    assert len(done) == 1 and done[0].content == "Done.", outcomes
    assert len(refused) == 1 and isinstance(refused[0], InvalidInputError), outcomes
    assert "no turn in flight" in str(refused[0])
    assert len(_RAN) == 1
    records = [m.text for m in agent.session(sid).messages()]
    assert records == ["do it", "", f"confirmed: {_RAN[0]}", "Done."]


def test_two_resumes_at_once_one_goes_on(interrupted: tuple[StelloAgent, StelloAgent, str]) -> None:
    first, second, sid = interrupted

    def resume(agent: StelloAgent, value: str) -> Any:
        try:
            return agent.resume(sid, value)
        except InvalidInputError as exc:
            return exc

    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(resume, (first, second), ("yes", "yes again")))
    _one_went_on(outcomes, first, sid)


async def test_two_async_resumes_at_once_one_goes_on(
    interrupted: tuple[StelloAgent, StelloAgent, str],
) -> None:
    first, second, sid = interrupted
    outcomes = await asyncio.gather(
        first.aresume(sid, "yes"), second.aresume(sid, "yes again"), return_exceptions=True
    )
    _one_went_on(list(outcomes), first, sid)
