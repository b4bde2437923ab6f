"""Job claims: a background job runs in one worker at a time, across processes.

A `Scheduler` de-duplicates its own jobs; several processes on one tree (LangGraph Server
workers, two agents on one database) each have their own scheduler and may all find the
same job due. Before a job runs, its scheduler claims it: an entry of the tree global
`stello:jobs` (keyed `<kind>:<session>`) with an owner and an expiry, written in a write
transaction (serialised across processes on SQLite and PostgreSQL), renewed while the job
runs and removed when it ends. A scheduler that finds the claim taken skips the job: another
worker is doing it. A claim whose holder died is taken over: at once when it was a process
of this machine that no longer exists, otherwise when it expires.

Why not the session lease: it serialises *turns*. Holding it for a consolidation (a model
call) would make the user's next turn wait for background work, which a schedule must never
do; a claim only keeps background jobs apart. Two overlapping consolidations would still be
correct (`Session.consolidate` writes only over the L2 it read): claims save the second
model call.

Example:
    >>> from stello_graph.checkpoints import InMemoryMainStorage
    >>> claims = JobClaims(InMemoryMainStorage())
    >>> first = claims.claim("consolidate", "s1")
    >>> first is not None, claims.claim("consolidate", "s1")
    (True, None)
    >>> claims.release(first)
    >>> claims.claim("consolidate", "s1") is not None
    True
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import partial
from typing import Any

from stello_graph._ids import add_live, discard_live, new_owner, owner_is_dead
from stello_graph.lease import DEFAULT_LEASE_TTL, check_lease_ttl, renewing
from stello_graph.storage import MainStorage

__all__ = ["CLAIMS_KEY", "Claim", "JobClaims"]

CLAIMS_KEY = "stello:jobs"
"""The tree global holding the claims of running jobs, by `<kind>:<session id>`."""


@dataclass(frozen=True, slots=True)
class Claim:
    """A job claimed by one scheduler: its key in `stello:jobs`, owner and expiry (epoch
    seconds)."""

    key: str
    owner: str
    expires_at: float


def _free(stored: Any, now: float) -> bool:
    if not isinstance(stored, dict):
        return True  # never claimed, released, or written by something else
    owner, expires = stored.get("owner"), stored.get("expires_at")
    if not isinstance(owner, str) or not isinstance(expires, int | float):
        return True
    # a claim naming this process but not held (`add_live`) is a leftover of a scheduler
    # that stopped mid-job, free to take over
    return expires <= now or owner_is_dead(owner)


class JobClaims:
    """Claims of background jobs, stored with the tree (see the module's docstring).

    Args:
        storage: the tree's storage.
        ttl: seconds a claim lasts unless renewed (`hold` renews it every third of that).
    """

    def __init__(self, storage: MainStorage, *, ttl: float = DEFAULT_LEASE_TTL) -> None:
        self.storage = storage
        self.ttl = check_lease_ttl(ttl)

    def _stored(self) -> dict[str, Any]:
        found = self.storage.get_global(CLAIMS_KEY)
        return dict(found) if isinstance(found, dict) else {}

    def _put(self, claims: dict[str, Any], now: float) -> None:
        kept = {k: v for k, v in claims.items() if not _free(v, now)}  # drop lapsed ones
        self.storage.put_global(CLAIMS_KEY, kept)

    def claim(self, kind: str, session_id: str | None) -> Claim | None:
        """Claim the job; `None` while another scheduler holds its claim."""
        # the session id last, so any id is unambiguous
        key, owner = f"{kind}:{session_id or ''}", new_owner()
        add_live(owner)
        claimed: Claim | None = None
        try:
            with self.storage.transaction():
                now, claims = time.time(), self._stored()
                if _free(claims.get(key), now):
                    claimed = Claim(key, owner, now + self.ttl)
                    claims[key] = {"owner": owner, "expires_at": claimed.expires_at}
                    self._put(claims, now)
        finally:
            if claimed is None:
                discard_live(owner)
        return claimed

    def renew(self, claim: Claim) -> Claim | None:
        """Extend `claim` if it is still the stored one, else `None` (it was taken over)."""
        with self.storage.transaction():
            now, claims = time.time(), self._stored()
            stored = claims.get(claim.key)
            if not isinstance(stored, dict) or stored.get("owner") != claim.owner:
                return None
            renewed = Claim(claim.key, claim.owner, now + self.ttl)
            claims[claim.key] = {"owner": claim.owner, "expires_at": renewed.expires_at}
            self._put(claims, now)
        return renewed

    def release(self, claim: Claim) -> None:
        """Remove `claim` if it is still the stored one."""
        try:
            with self.storage.transaction():
                claims = self._stored()
                stored = claims.get(claim.key)
                if isinstance(stored, dict) and stored.get("owner") == claim.owner:
                    del claims[claim.key]
                    self._put(claims, time.time())
        finally:
            discard_live(claim.owner)

    @contextmanager
    def hold(self, kind: str, session_id: str | None) -> Iterator[Claim | None]:
        """Claim the job for the block, renewed meanwhile; `None` (run nothing) when another
        scheduler holds it. A storage that fails on release leaves a claim that expires."""
        claim = self.claim(kind, session_id)
        if claim is None:
            yield None
            return
        try:
            with renewing(partial(self.renew, claim), self.ttl):
                yield claim
        finally:
            with suppress(Exception):  # a closed or failing storage: the claim lapses
                self.release(claim)
