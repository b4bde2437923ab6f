"""Async turns started together on one event loop prepare in order, two at a time.

A turn's work before its model call (reading its checkpoint, LangGraph's run set-up,
assembling the prompt) is CPU on the event loop. When several `aturn`s are gathered, the loop
used to interleave that work step by step: every turn finished preparing at about the time
the last one did, so every model call started late, their replies came back together and
the turns' commits then queued behind one another. Prepared in the order they asked, a few
at a time, the first model calls start after a preparation or two instead of all of them,
the others follow, and their replies and commits come back spread out as well.

`PreparingGate` (one per event loop and agent) lets `SLOTS` turns prepare at a time (two:
while one waits for its checkpoint read in a worker thread, the other has the loop), in the
order they asked. A turn holds its slot from the moment its session is leased until its first
model call starts (`model_call_starts`, called by the model node with the run's config, which
carries the turn's `Pass` under `PREPARING_KEY`), or until its run ends, whichever comes
first. A holder that keeps it longer than `HOLD_LIMIT` (preparation that waits on something
slow: a compression's model call, a user's hook) loses it to the next turn, which then
prepares beside it, as all turns did before: the gate orders the work, it never makes a turn
wait on another's I/O for longer than that.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

__all__ = ["HOLD_LIMIT", "PREPARING_KEY", "SLOTS", "Pass", "PreparingGate", "model_call_starts"]

HOLD_LIMIT = 0.005
"""Seconds a turn may hold the gate before the next turn is let in (a turn prepares in about
a millisecond; the limit only matters when preparation awaits something slow)."""

SLOTS = 2
"""Turns of one event loop that prepare at once (measured: one or two prepare a gathered round
of eight in about the same time; two is ~1% faster, filling the loop while one of them waits
for its worker thread)."""

PREPARING_KEY = "stello_preparing"
"""The key of a turn's `Pass` in its run's `configurable` (not a checkpointed value: LangGraph
copies only plain values of it into checkpoint metadata)."""


class Pass:
    """A turn's slot at the gate: held until `release` (idempotent)."""

    __slots__ = ("_gate", "_timer")

    def __init__(self, gate: PreparingGate) -> None:
        self._gate = gate
        self._timer: asyncio.TimerHandle | None = None

    def release(self) -> None:
        """Give the slot to the next waiting turn (nothing, once given up)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._gate._released(self)


class PreparingGate:
    """First come, first served; `slots` holders at a time; used on its event loop only."""

    __slots__ = ("_holders", "_loop", "_slots", "_waiters")

    def __init__(self, loop: asyncio.AbstractEventLoop, slots: int = SLOTS) -> None:
        self._loop = loop
        self._slots = slots
        self._holders: set[Pass] = set()
        self._waiters: deque[asyncio.Future[Pass]] = deque()

    @property
    def held(self) -> int:
        """How many turns hold a slot."""
        return len(self._holders)

    @property
    def waiting(self) -> int:
        """How many turns wait for it."""
        return sum(not waiter.done() for waiter in self._waiters)

    async def enter(self) -> Pass:
        """Wait for a slot and hold it. A turn cancelled while waiting takes nothing; one
        cancelled as a slot reached it passes the slot on."""
        if len(self._holders) < self._slots and not self._waiters:
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
        held = Pass(self)
        self._holders.add(held)
        held._timer = self._loop.call_later(HOLD_LIMIT, held.release)
        return held

    def _released(self, held: Pass) -> None:
        if held not in self._holders:
            return
        self._holders.discard(held)
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
