"""Async turns started together on one event loop prepare one after another.

A turn's work before its model call (reading its checkpoint, LangGraph's run set-up,
assembling the prompt) is CPU on the event loop. When several `aturn`s are gathered, the loop
used to interleave that work step by step: every turn finished preparing at about the time
the last one did, so every model call started late, their replies came back together and
the turns' commits then queued behind one another. Prepared in the order they asked, the
first turn's model call starts after one preparation instead of all of them, the others'
follow one preparation apart, and their replies and commits come back spread out as well.

`PreparingGate` (one per event loop and agent) passes one turn at a time, in the order they
asked. A turn holds it from the moment its session is leased until its first model call
starts (`model_call_started`, called by the model node), or until its run ends, whichever
comes first. A holder that keeps it longer than `HOLD_LIMIT` (preparation that waits on
something slow: a compression's model call, a user's hook) loses it to the next turn, and
the two then prepare side by side, as all turns did before: the gate orders the work, it
never makes a turn wait on another's I/O for longer than that.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

__all__ = ["HOLD_LIMIT", "PREPARING_KEY", "Pass", "PreparingGate", "model_call_starts"]

HOLD_LIMIT = 0.005
"""Seconds a turn may hold the gate before the next turn is let in (a turn prepares in about
a millisecond; the limit only matters when preparation awaits something slow)."""

PREPARING_KEY = "stello_preparing"
"""The key of a turn's `Pass` in its run's `configurable` (not a checkpointed value: LangGraph
copies only plain values of it into checkpoint metadata)."""


class Pass:
    """A turn's place at the gate: its holder until `release` (idempotent)."""

    __slots__ = ("_gate", "_timer")

    def __init__(self, gate: PreparingGate) -> None:
        self._gate = gate
        self._timer: asyncio.TimerHandle | None = None

    def release(self) -> None:
        """Give the gate to the next waiting turn (nothing, once given up)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._gate._released(self)


class PreparingGate:
    """First come, first served; one holder at a time; used on its event loop only."""

    __slots__ = ("_holder", "_loop", "_waiters")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._holder: Pass | None = None
        self._waiters: deque[asyncio.Future[Pass]] = deque()

    @property
    def held(self) -> bool:
        """Whether a turn holds the gate."""
        return self._holder is not None

    @property
    def waiting(self) -> int:
        """How many turns wait for it."""
        return sum(not waiter.done() for waiter in self._waiters)

    async def enter(self) -> Pass:
        """Wait for the gate and hold it. A turn cancelled while waiting takes nothing; one
        cancelled as the gate reached it passes the gate on."""
        if self._holder is None and not self._waiters:
            return self._hold()
        waiter: asyncio.Future[Pass] = self._loop.create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                waiter.result().release()
            raise

    def _hold(self) -> Pass:
        held = self._holder = Pass(self)
        held._timer = self._loop.call_later(HOLD_LIMIT, held.release)
        return held

    def _released(self, held: Pass) -> None:
        if self._holder is not held:
            return
        self._holder = None
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(self._hold())
                return


def model_call_starts(config: RunnableConfig | None) -> None:
    """The model call of the run `config` belongs to starts: that turn's preparation is
    over and the gate passes on (nothing, for a run without a pass or a later call)."""
    found = ((config or {}).get("configurable") or {}).get(PREPARING_KEY)
    if isinstance(found, Pass):
        found.release()
