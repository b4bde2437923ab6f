"""Gathered async turns prepare in order, `SLOTS` at a time (`stello_graph._preparing`).

Each `aturn` / `astream` holds a slot of the event loop's `PreparingGate` from its lease
until its first model call starts, so the first model calls do not wait for every other
turn's preparation. The gate is first come, first served, a slot is given up when a run ends
however it ends, and passes on by itself after `HOLD_LIMIT`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
from langgraph.checkpoint.memory import InMemorySaver

from stello_graph import StelloAgent, _preparing
from stello_graph._preparing import (
    PREPARING_KEY,
    SLOTS,
    Pass,
    PreparingGate,
    model_call_starts,
)
from stello_graph.nodes import turn as turn_nodes
from stello_graph.testing import ScriptedChatModel


@pytest.fixture
def long_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hold limit no preparation reaches, even on a slow machine."""
    monkeypatch.setattr(_preparing, "HOLD_LIMIT", 30.0)


def _agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[StelloAgent, list[str]]:
    """An agent whose log says when each turn starts preparing and calls its model (a log
    outside the model: the agent may call a copy of it)."""
    log: list[str] = []

    class Recorded(ScriptedChatModel):
        async def _agenerate(self, *args: Any, **kwargs: Any) -> Any:
            log.append("model")
            found = await super()._agenerate(*args, **kwargs)
            log.append("replied")
            return found

        async def _astream(self, *args: Any, **kwargs: Any) -> Any:
            log.append("model")
            async for chunk in super()._astream(*args, **kwargs):
                yield chunk
            log.append("replied")

    model = Recorded(default="ok", latency=0.02)
    agent = StelloAgent(model=model, storage=tmp_path / "a.db")
    switch = agent._aswitch

    async def recorded_switch(sid: str) -> None:  # the first step under the gate
        log.append("prepare")
        await switch(sid)

    def recorded_release(config: Any) -> None:
        log.append("release")
        model_call_starts(config)

    monkeypatch.setattr(agent, "_aswitch", recorded_switch)
    monkeypatch.setattr(turn_nodes, "model_call_starts", recorded_release)
    return agent, log


async def _sessions(agent: StelloAgent, count: int) -> list[str]:
    return [(await agent.afork(agent.main_session_id, f"S{n}")).id for n in range(count)]


def _check_free(agent: StelloAgent) -> None:
    """Nobody holds this loop's gate or waits for it."""
    gate = agent._gate()
    assert not gate.held and gate.waiting == 0


def _check_order(log: list[str], turns: int) -> None:
    """Never more than `SLOTS` turns preparing at once (a turn prepares once one before it
    gave its slot up), and the first turn past the slots prepared while the first model call
    ran (a slot passed on as the call started, not at the end of the run)."""
    preparing = 0
    for entry in log:
        preparing += {"prepare": 1, "release": -1}.get(entry, 0)
        assert 0 <= preparing <= SLOTS, log
    assert log.count("prepare") == log.count("release") == log.count("model") == turns, log
    prepared = [n for n, entry in enumerate(log) if entry == "prepare"]
    assert log.index("release") < prepared[SLOTS] < log.index("replied"), log


# -- the gate ---------------------------------------------------------------------------
async def _holders(gate: PreparingGate, count: int, hold: float) -> list[int]:
    order: list[int] = []

    async def one(n: int) -> None:
        held = await gate.enter()
        assert gate.held
        order.append(n)
        await asyncio.sleep(hold)
        order.append(n)
        held.release()

    await asyncio.gather(*(one(n) for n in range(count)))
    return order


@pytest.mark.parametrize(
    ("slots", "order"), [(1, [0, 0, 1, 1, 2, 2, 3, 3]), (2, [0, 1, 0, 1, 2, 3, 2, 3])]
)
async def test_the_gate_is_first_come_first_served_slots_at_a_time(
    long_limit: None, slots: int, order: list[int]
) -> None:
    gate = PreparingGate(asyncio.get_running_loop(), slots)
    assert await _holders(gate, 4, 0.001) == order
    assert not gate.held and gate.waiting == 0


async def test_a_holder_past_the_limit_loses_the_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_preparing, "HOLD_LIMIT", 0.01)
    gate = PreparingGate(asyncio.get_running_loop(), 1)
    slow = await gate.enter()
    nxt = asyncio.ensure_future(gate.enter())
    await asyncio.sleep(0)
    assert not nxt.done()  # waits while the holder is within its limit
    second = await asyncio.wait_for(nxt, 5)  # the limit passed: its turn
    assert gate.held and gate.waiting == 0
    slow.release()  # the old holder's release gives up nothing
    assert gate.held
    second.release()
    second.release()  # idempotent
    assert not gate.held


async def _two_waiting() -> tuple[PreparingGate, Pass, asyncio.Future[Pass], asyncio.Future[Pass]]:
    """A gate of one slot, its holder's pass and two turns waiting for it, in order."""
    gate = PreparingGate(asyncio.get_running_loop(), 1)
    first = await gate.enter()
    waiters = asyncio.ensure_future(gate.enter()), asyncio.ensure_future(gate.enter())
    await asyncio.sleep(0)
    assert gate.waiting == 2
    return gate, first, *waiters


async def test_a_waiter_cancelled_takes_nothing(long_limit: None) -> None:
    gate, first, gone, last = await _two_waiting()
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    first.release()
    held = await asyncio.wait_for(last, 5)
    assert isinstance(held, Pass) and gate.waiting == 0
    held.release()
    assert not gate.held


async def test_a_waiter_cancelled_as_the_gate_reached_it_passes_it_on(long_limit: None) -> None:
    gate, first, unlucky, last = await _two_waiting()
    first.release()  # the gate is the unlucky one's, before it runs again
    unlucky.cancel()
    await asyncio.gather(unlucky, return_exceptions=True)
    assert unlucky.cancelled()
    (await asyncio.wait_for(last, 5)).release()
    assert not gate.held


# -- turns ------------------------------------------------------------------------------
@pytest.fixture
async def recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, long_limit: None
) -> AsyncIterator[tuple[StelloAgent, list[str]]]:
    agent, log = _agent(tmp_path, monkeypatch)
    try:
        yield agent, log
    finally:
        await agent.aclose()


async def test_gathered_turns_prepare_in_order(
    recorded: tuple[StelloAgent, list[str]],
) -> None:
    agent, log = recorded
    ids = await _sessions(agent, 5)
    await asyncio.gather(*(agent.aturn(sid, "hello") for sid in ids))
    _check_order(log, 5)
    log.clear()
    results = await asyncio.gather(*(agent.aturn(sid, "again") for sid in ids))
    assert [found.turn_count for found in results] == [2] * 5
    _check_order(log, 5)
    _check_free(agent)


async def test_gathered_streams_prepare_in_order_and_give_their_slots_up(
    recorded: tuple[StelloAgent, list[str]],
) -> None:
    agent, log = recorded
    ids = await _sessions(agent, 3)

    async def whole(sid: str) -> int:
        return len([item async for item in agent.astream(sid, "hello")])

    assert all(await asyncio.gather(*(whole(sid) for sid in ids)))
    _check_order(log, 3)
    stream = agent.astream(ids[0], "left early", stream_mode="updates")
    await stream.__anext__()  # stopped by its consumer after one update
    await cast("AsyncGenerator[Any, None]", stream).aclose()
    _check_free(agent)


async def test_a_turn_that_fails_while_preparing_lets_the_others_through(
    recorded: tuple[StelloAgent, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, _ = recorded
    ids = await _sessions(agent, 3)
    switch = agent._aswitch

    async def failing(sid: str) -> None:
        if sid == ids[0]:
            raise RuntimeError("hook failed")
        await switch(sid)

    monkeypatch.setattr(agent, "_aswitch", failing)
    found = await asyncio.gather(*(agent.aturn(s, "hi") for s in ids), return_exceptions=True)
    assert isinstance(found[0], RuntimeError)
    assert [r.turn_count for r in found[1:]] == [1, 1]  # type: ignore[union-attr]
    _check_free(agent)
    assert (await agent.aturn(ids[1], "after")).turn_count == 2


async def test_the_pass_is_not_checkpointed(tmp_path: Path, long_limit: None) -> None:
    saver = InMemorySaver()  # the user's: it keeps the turns' checkpoints
    agent = StelloAgent(model=ScriptedChatModel(default="ok"), storage=tmp_path / "a.db",
                        checkpointer=saver, prune_checkpoints=False)  # fmt: skip
    try:
        sid = (await agent.afork(agent.main_session_id, "S")).id
        await agent.aturn(sid, "hello")
        kept = [found.metadata for found in saver.list(None)]
        assert kept and all(PREPARING_KEY not in metadata for metadata in kept)
        assert all(PREPARING_KEY not in str(found.config) for found in saver.list(None))
    finally:
        await agent.aclose()
