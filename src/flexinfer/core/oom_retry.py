"""Out-of-memory starts in the Kubernetes engine's groups that pack by memory: evict, retry once, then fail.

The local engine's arbiter handles a server that dies at start for lack of memory
(``flexinfer.core.arbiter.packing.out_of_memory_step``); this is the same rule over what the manager stores. A
member's newest pod shows the failure (``flexinfer.core.model_status.pod_failure.out_of_memory_sign``: the
kubelet's ``OOMKilled``, or the backend's out-of-memory message as the container's termination reason or
message) while the member is Active but not Ready. Then, per member:

- the first time (no record in ``status.sharedGroup.outOfMemory`` for its generation): the group's evictable
  residents (Active and Ready, neither pinned nor failing themselves) are evicted for it, its record names the
  pod that failed, and it leaves the active set (its pod is removed); ``flexinfer.core.active_set`` starts it
  again once no member that left still holds the device: that new pod is the one retry. Until it is Ready (or
  failed) nobody else starts in the group, so the evicted do not come back beside it. With nobody to evict it
  fails at once (a retry would meet the same memory);
- again, in another pod (the retry): it fails for good, with its need, the budget, what the others hold and
  the container's own words (``flexinfer.core.memory_need.out_of_memory_failure``); the record keeps that
  message, so it stays ``Failed`` until its spec changes (a new generation starts afresh);
- once Ready, the record is dropped.

Only groups with a finite budget take part (an unlimited group has no figure to name). Pure; called by
``flexinfer.core.active_set.elect_active_set``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from flexinfer.api.model import OutOfMemoryStatus
from flexinfer.core.election import Member
from flexinfer.core.memory_need import MemoryNeed, out_of_memory_cause, out_of_memory_failure
from flexinfer.core.model_status.pod_failure import OutOfMemorySign
from flexinfer.core.phases import READY


@dataclass(frozen=True)
class OutOfMemoryFacts:
    """What the manager knows about out-of-memory starts in one group: ``signs`` (member → what its newest pod
    shows), ``records`` (member → its stored record, for its current generation) and ``generations``."""

    signs: Mapping[str, OutOfMemorySign] = field(default_factory=dict)
    records: Mapping[str, OutOfMemoryStatus] = field(default_factory=dict)
    generations: Mapping[str, int | None] = field(default_factory=dict)


@dataclass(frozen=True)
class OutOfMemoryTurn:
    """This pass's outcome: the record each member keeps, who fails (and with what), who is evicted (member →
    (for whom, why)), and who ran out of memory for the first time now (it leaves the active set)."""

    records: dict[str, OutOfMemoryStatus] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    victims: dict[str, tuple[str, str]] = field(default_factory=dict)
    fresh: frozenset[str] = frozenset()

    @property
    def retrying(self) -> set[str]:
        """Members whose retry is pending or starting (they hold a record and did not fail): until it is Ready or
        failed, nobody else starts in the group."""
        return {name for name, r in self.records.items() if not r.failure}


def out_of_memory_turn(members: Sequence[Member], facts: OutOfMemoryFacts, *, group: str, budget_mib: float,
                       needs: Mapping[str, MemoryNeed], active: Collection[str], now: datetime) -> OutOfMemoryTurn:
    """See the module docstring. ``group`` is ``namespace/name``; ``active``: the members Active now."""
    namespace = group.partition("/")[0]
    turn = OutOfMemoryTurn()
    # Only a member that is starting has a start to retry (a Ready one's pod may still show an old termination,
    # a leaving one's is being removed).
    signs = {m.name: facts.signs[m.name] for m in members
             if m.name in facts.signs and m.state == "Active" and m.phase != READY}
    failing = set(signs) | {n for n, r in facts.records.items() if r.failure}
    fresh: set[str] = set()
    for m in sorted(members, key=lambda m: m.name):
        record, sign = facts.records.get(m.name), signs.get(m.name)
        if m.phase == READY and (record is None or not record.failure):
            continue  # a Ready member is past its start: its record (if any) is done
        if record is not None and (record.failure or sign is None or sign.pod == record.pod):
            turn.records[m.name] = record
            if record.failure:
                turn.failed[m.name] = record.failure
            continue
        if sign is None:
            continue
        others = [o for o in members if o.name in active and o.name != m.name]
        held = sum(needs[o.name].mib for o in others)
        victims = [o.name for o in others if o.phase == READY and not _pinned(o) and o.name not in failing
                   and o.name not in turn.victims]
        new = OutOfMemoryStatus(pod=sign.pod, seen_at=now, observed_generation=facts.generations.get(m.name))
        if record is None and victims:
            cause = out_of_memory_cause(f"{namespace}/{m.name}", group)
            turn.victims.update((name, (m.name, cause)) for name in victims)
            turn.records[m.name] = new
            fresh.add(m.name)
            continue
        message = out_of_memory_failure(f"{namespace}/{m.name}", needs[m.name], group, budget_mib, held_mib=held,
                                        error=sign.detail)
        turn.records[m.name] = new.model_copy(update={"failure": message})
        turn.failed[m.name] = message
    return OutOfMemoryTurn(turn.records, turn.failed, turn.victims, frozenset(fresh))


def _pinned(m: Member) -> bool:
    return m.min_replicas >= 1 or m.warm_primary or m.force
