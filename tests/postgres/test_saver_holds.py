"""What the agent's PostgreSQL checkpointer writes, as the SQLite one does.

A turn without tools is committed in its one step, so its checkpoints are never written;
whatever has to survive (a turn waiting on an interrupt, a failed turn, the tool results of
a turn in flight) is on the database when the agent's call returns.
"""

from __future__ import annotations

import psycopg
import pytest
from langchain_core.tools import tool
from langgraph.types import interrupt

from stello_graph import StelloAgent
from stello_graph.checkpoints import StelloPostgresSaver
from stello_graph.errors import ModelCallError
from stello_graph.testing import ScriptedChatModel


@tool
def confirm(what: str) -> str:
    """Ask the user to confirm."""
    return f"confirmed: {interrupt({'confirm': what})}"


@tool
def lookup(query: str) -> str:
    """Look a fact up."""
    return f"fact about {query}"


def _rows(dsn: str, table: str = "checkpoints") -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
    assert row is not None
    return int(row[0])


def test_a_turn_without_tools_writes_no_checkpoint(postgres_dsn: str) -> None:
    with StelloAgent(model=ScriptedChatModel(default="ok"), storage=postgres_dsn) as agent:
        saver = agent.checkpointer
        assert isinstance(saver, StelloPostgresSaver)
        sid = agent.main_session_id
        for n in range(3):
            assert agent.turn(sid, f"question {n}").content == "ok"
        assert _rows(postgres_dsn) == 0 and _rows(postgres_dsn, "checkpoint_writes") == 0
        assert agent.storage.get_lease(sid) is None  # freed by the commit


async def test_an_async_turn_without_tools_writes_no_checkpoint(postgres_dsn: str) -> None:
    async with StelloAgent(model=ScriptedChatModel(default="ok"), storage=postgres_dsn) as agent:
        sid = agent.main_session_id
        assert (await agent.aturn(sid, "hi")).content == "ok"
        assert _rows(postgres_dsn) == 0
        assert await agent.storage.aget_lease(sid) is None


def test_a_tool_turn_is_written_from_its_tool_results_then_pruned(postgres_dsn: str) -> None:
    model = ScriptedChatModel([ScriptedChatModel.tool_call("lookup", {"query": "x"}), "done"])
    with StelloAgent(model=model, storage=postgres_dsn, tools=[lookup]) as agent:
        result = agent.turn(agent.main_session_id, "look it up")
        assert result.content == "done" and result.tool_rounds == 1
        assert _rows(postgres_dsn) == 0  # the thread is pruned once the turn is committed
        assert agent.storage.get_lease(agent.main_session_id) is None


def test_an_interrupted_turn_is_on_the_database_when_turn_returns(postgres_dsn: str) -> None:
    model = ScriptedChatModel([ScriptedChatModel.tool_call("confirm", {"what": "x"}), "Done."])
    with StelloAgent(model=model, storage=postgres_dsn, tools=[confirm]) as first:
        sid = first.main_session_id
        assert first.turn(sid, "do it").interrupted
        assert _rows(postgres_dsn) > 0
        # another agent (another process, say) on the database resumes it
        with StelloAgent(model=model, storage=postgres_dsn, tools=[confirm]) as other:
            assert other.resume(sid, "yes").content == "Done."
            texts = [m.text for m in other.session(sid).messages()]
            assert texts[-2:] == ["confirmed: yes", "Done."]


def test_a_failed_turn_is_on_the_database_and_resumes(postgres_dsn: str) -> None:
    model = ScriptedChatModel([RuntimeError("provider down"), "Back."])
    with StelloAgent(model=model, storage=postgres_dsn) as agent:
        sid = agent.main_session_id
        with pytest.raises(ModelCallError, match="provider down"):
            agent.turn(sid, "hello")
        assert _rows(postgres_dsn) > 0  # the turn's input, written when the run failed
        with StelloAgent(model=model, storage=postgres_dsn) as other:
            assert other.resume(sid).content == "Back."
            assert [m.text for m in other.session(sid).messages()] == ["hello", "Back."]


def test_a_kept_postgres_saver_keeps_one_checkpoint_per_turn(postgres_dsn: str) -> None:
    # LangGraph's own PostgresSaver stores each channel's value by version: the one
    # checkpoint a turn keeps must carry every channel the run changed (the session id is
    # set by the run's input only)
    from langgraph.checkpoint.postgres import PostgresSaver

    with PostgresSaver.from_conn_string(postgres_dsn) as saver:
        saver.setup()
        with StelloAgent(
            model=ScriptedChatModel(default="ok"), storage=postgres_dsn, checkpointer=saver
        ) as agent:
            sid = agent.fork(agent.main_session_id, "Notes").id
            for n in range(3):
                agent.turn(sid, f"question {n}")
            found = list(saver.list(agent.config(sid)))
            assert len(found) == 3
            assert _rows(postgres_dsn, "checkpoint_writes") == 0
            state = agent._turn_graph.get_state(agent.config(sid))
            assert state.values["session_id"] == sid and state.values["content"] == "ok"
            assert [m.text for m in state.values["messages"]] == ["question 2", "ok"]
            assert agent.turn(sid, "again").turn_count == 4


async def test_a_kept_async_postgres_saver_keeps_one_checkpoint_per_turn(
    postgres_dsn: str,
) -> None:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    async with AsyncPostgresSaver.from_conn_string(postgres_dsn) as saver:
        await saver.setup()
        async with StelloAgent(
            model=ScriptedChatModel(default="ok"), storage=postgres_dsn, checkpointer=saver
        ) as agent:
            sid = agent.main_session_id
            for n in range(3):
                await agent.aturn(sid, f"question {n}")
            found = [c async for c in saver.alist(agent.config(sid))]
            assert len(found) == 3
            state = await agent._turn_graph.aget_state(agent.config(sid))
            assert state.values["session_id"] == sid
            assert [m.text for m in state.values["messages"]] == ["question 2", "ok"]
