"""Leader-election decisions over a ``coordination.k8s.io/v1`` Lease, as pure functions.

The Kubernetes engine (``flexinfer.manager.leader``) reads the Lease, asks ``decide`` what to do, and
writes the returned spec with optimistic concurrency; two managers therefore never both act.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta


@dataclass(frozen=True)
class LeaseRecord:
    """The fields of ``Lease.spec`` that leader election uses."""

    holder: str | None = None
    duration_seconds: int = 15
    acquire_time: datetime | None = None
    renew_time: datetime | None = None
    transitions: int = 0

    def expired(self, now: datetime) -> bool:
        """True when nobody holds the lease or its holder stopped renewing it."""
        if not self.holder or self.renew_time is None:
            return True
        return now >= self.renew_time + timedelta(seconds=self.duration_seconds)


@dataclass(frozen=True)
class LeaseDecision:
    """``write`` is the record to store (``None``: leave it); ``leader`` says whether we lead after it."""

    leader: bool
    write: LeaseRecord | None


def decide(current: LeaseRecord | None, me: str, now: datetime, duration_seconds: int) -> LeaseDecision:
    """Acquire a free or expired lease, renew our own, or stay a follower."""
    if current is None:
        return LeaseDecision(True, LeaseRecord(me, duration_seconds, now, now, 0))
    if current.holder == me:
        return LeaseDecision(True, replace(current, renew_time=now, duration_seconds=duration_seconds))
    if current.expired(now):
        record = LeaseRecord(me, duration_seconds, now, now, current.transitions + 1)
        return LeaseDecision(True, record)
    return LeaseDecision(False, None)


def release(current: LeaseRecord, me: str) -> LeaseRecord | None:
    """On clean shutdown, give the lease up so a standby takes over at once."""
    if current.holder != me:
        return None
    return replace(current, holder=None, renew_time=None)
