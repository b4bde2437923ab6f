"""How the turn's nodes hold their session's lease (see `stello_graph.lease`).

A turn is serialised in the graph's own path, whoever runs the graph. `assemble` takes the
session's lease (waiting while another turn holds it) unless the caller already holds it for
this run (`StelloAgent` does, for the whole run and its checkpoint pruning); the turn's
state keeps the lease's owner and token from node to node; each later node renews it (or
takes it again, if it lapsed meanwhile); `commit` checks it inside the transaction that
writes the turn and releases it there. A node that fails, or a tool that interrupts the
turn, releases the lease, so nobody waits for a turn that is not running; a resumed turn
takes it again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

from typing_extensions import TypedDict

from stello_graph._flow import Call, Flow, Storage, arun, run
from stello_graph.lease import Handback, SessionLeases
from stello_graph.models import Lease, SessionSnapshot
from stello_graph.storage import SessionStorage

__all__ = [
    "LEASE_KEY",
    "PARKED_LEASE",
    "TurnLease",
    "apark",
    "aturn_lease",
    "park",
    "turn_lease",
]

PARKED_LEASE = 2.0
"""Seconds a turn's lease outlives the node that held it: ample for the checkpoint written
between two nodes; a run paused between nodes frees its session after this."""

LEASE_KEY = "lease"
"""The state key of the turn's lease: `{"owner": ..., "token": ...}` or `None`."""


class LeaseUpdate(TypedDict):
    """The turn state's `lease` key, as a node updates it."""

    lease: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class TurnLease:
    """The lease a turn's node runs under.

    Attributes:
        lease: the lease.
        owned: whether the turn itself holds it (else the caller lent it for this run and
            releases it, unless its `handback` let the commit do it).
    """

    lease: Lease
    owned: bool
    handback: Handback | None = None
    """For a lent lease: the lender's leave to free it in the commit's transaction."""

    def releases(self, lent: bool = True) -> bool:
        """Whether the turn's commit frees the lease: its own, or (with `lent`) one lent
        with the lender's leave."""
        if self.owned:
            return True
        return lent and self.handback is not None and self.handback.allowed

    def prefetched(self) -> SessionSnapshot | None:
        """The session as the lender read it under this lease for the run's opening step
        (once; `None` when it read nothing)."""
        found = None if self.handback is None else self.handback.take_prefetched()
        return found if isinstance(found, SessionSnapshot) else None

    def released(self) -> None:
        """Tell the lender the commit freed its lease."""
        if not self.owned and self.handback is not None:
            self.handback.released = True

    def committed(self, state: Mapping[str, Any]) -> None:
        """Tell the lender the turn is stored, with its state (`Handback.committed`)."""
        if self.handback is not None:
            self.handback.committed = dict(state)

    def update(self) -> LeaseUpdate:
        """The state update that hands the lease to the turn's next node."""
        own = {"owner": self.lease.owner, "token": self.lease.token}
        return {"lease": own if self.owned else None}


def _stored(session_id: str, state: Mapping[str, Any], fresh: bool) -> Lease | None:
    found = None if fresh else state.get(LEASE_KEY)
    if not isinstance(found, Mapping) or not isinstance(found.get("owner"), str):
        return None
    return Lease(session_id, found["owner"], int(found.get("token") or 0), 0.0)


def _take(leases: SessionLeases, session_id: str, stored: Lease | None) -> Flow[Lease]:
    """Renew the lease `stored` in the state, else take the session's lease (again, with its
    owner, when it lapsed meanwhile)."""
    if stored is not None:
        renewed: Lease | None = yield Storage(SessionStorage.renew_lease, stored, leases.ttl)
        if renewed is not None:
            return renewed
    owner = stored.owner if stored is not None else None
    lease: Lease = yield Call(
        partial(leases.acquire, owner=owner), partial(leases.aacquire, owner=owner), (session_id,)
    )
    return lease


@contextmanager
def turn_lease(
    leases: SessionLeases,
    session_id: str,
    state: Mapping[str, Any],
    *,
    fresh: bool = False,
    park: bool = True,
) -> Iterator[TurnLease]:
    """Run a turn node under the session's lease; release it if the node fails.

    `fresh` (the turn's first node): take a new lease rather than one left in the state by
    an earlier run. `park` (every node but the commit): when the node ends, the lease is
    left to lapse after `PARKED_LEASE` seconds unless the next node renews it, so a run
    that pauses between nodes (`interrupt_before`) does not hold its session for a whole
    `lease_ttl`.
    """
    lent = leases.held(session_id)
    if lent is not None:
        yield TurnLease(lent, owned=False, handback=leases.handback(session_id))
        return
    lease = run(_take(leases, session_id, _stored(session_id, state, fresh)), leases.storage)
    try:
        with leases.keep(lease):
            yield TurnLease(lease, owned=True)
    except BaseException:
        leases.release(lease)
        raise
    if park:
        leases.storage.renew_lease(lease, PARKED_LEASE)


@asynccontextmanager
async def aturn_lease(
    leases: SessionLeases,
    session_id: str,
    state: Mapping[str, Any],
    *,
    fresh: bool = False,
    park: bool = True,
) -> AsyncIterator[TurnLease]:
    """Async twin of `turn_lease`."""
    lent = leases.held(session_id)
    if lent is not None:
        yield TurnLease(lent, owned=False, handback=leases.handback(session_id))
        return
    lease = await arun(_take(leases, session_id, _stored(session_id, state, fresh)), leases.storage)
    try:
        with leases.keep(lease):
            yield TurnLease(lease, owned=True)
    except BaseException:
        await leases.arelease(lease)
        raise
    if park:
        await leases.storage.arenew_lease(lease, PARKED_LEASE)


def park(leases: SessionLeases, held: TurnLease) -> None:
    """Leave the turn's own lease to lapse after `PARKED_LEASE` seconds unless the next node
    renews it (what `turn_lease` does on exit with `park=True`, for a node that decides at
    its end whether the turn goes on)."""
    if held.owned:
        leases.storage.renew_lease(held.lease, PARKED_LEASE)


async def apark(leases: SessionLeases, held: TurnLease) -> None:
    """Async twin of `park`."""
    if held.owned:
        await leases.storage.arenew_lease(held.lease, PARKED_LEASE)
