"""The event loop side of storage calls: `running_loop`, and `CallCancelled` (a cancellation
that arrived while a storage call's work ran, raised once that work is done, with what it
returned)."""

from __future__ import annotations

import asyncio

__all__ = ["CallCancelled", "running_loop"]


class CallCancelled(asyncio.CancelledError):
    """Raised in place of `CancelledError` by a storage's async method cancelled while its
    work ran in the storage's worker thread (which cannot be stopped), once that work ended:
    `result` is what it returned, so a caller that must undo it (free a lease it took) can.
    Code that does not know it sees an ordinary cancellation."""

    def __init__(self, result: object) -> None:
        super().__init__()
        self.result = result


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running on this thread, if any."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
