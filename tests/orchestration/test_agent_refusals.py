"""Turns the agent refuses before its graph runs: nothing is written, not even a checkpoint."""

from __future__ import annotations

import inspect
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stello_graph import (
    InvalidInputError,
    SessionArchivedError,
    SessionNotFoundError,
    StelloAgent,
)
from stello_graph.testing import ScriptedChatModel


def dump(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


@pytest.fixture
def agent(tmp_path: Path) -> Any:
    with StelloAgent(model=ScriptedChatModel(default="ok"), storage=tmp_path / "a.db") as made:
        made.turn(made.main_session_id, "warm up")  # the checkpoint tables exist now
        yield made


async def _settle(result: Any) -> None:
    if inspect.isawaitable(result):
        await result


async def _drain(stream: Any) -> None:
    async for _ in stream:
        pass


@pytest.mark.parametrize(
    "call",
    [
        lambda a, sid: a.turn(sid, "hi"),
        lambda a, sid: a.aturn(sid, "hi"),
        lambda a, sid: list(a.stream(sid, "hi")),
        lambda a, sid: _drain(a.astream(sid, "hi")),
        lambda a, sid: a.resume(sid),
        lambda a, sid: a.aresume(sid),
    ],
    ids=["turn", "aturn", "stream", "astream", "resume", "aresume"],
)
async def test_missing_or_archived_session_writes_nothing(
    agent: StelloAgent, tmp_path: Path, call: Callable[[StelloAgent, str], Any]
) -> None:
    archived = agent.fork(agent.main_session_id, "gone").id
    agent.archive(archived)
    before = dump(tmp_path / "a.db")
    for sid, error in (("no-such-session", SessionNotFoundError), (archived, SessionArchivedError)):
        with pytest.raises(error, match=sid):
            await _settle(call(agent, sid))
    assert dump(tmp_path / "a.db") == before
    # nor is a checkpoint thread looked up (and remembered) for an id refused
    assert "no-such-session" not in agent._threads._found


async def test_resume_with_nothing_in_flight(agent: StelloAgent) -> None:
    sid = agent.main_session_id
    with pytest.raises(InvalidInputError, match="no turn in flight"):
        agent.resume(sid)
    with pytest.raises(InvalidInputError, match="no turn in flight"):
        await agent.aresume(sid)
