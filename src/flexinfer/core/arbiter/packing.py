"""Groups that pack by memory: several members resident at once within the group's budget, evicted by cost.

The arbiter (``flexinfer.core.arbiter.machine``) asks ``next_step`` what to do in such a group, and executes
the answer with its own stop and start steps (so the drain, the hold and every ticket rule stay its own):

- the next candidate is the model planned for the memory being freed (``Arbiter.next_up``), else the waiting
  members: a starving one first (oldest first), then those with requests by priority and oldest wait, then
  pinned ones (``minReplicas``) by priority;
- it starts at once when it fits beside the residents; else the planner (``flexinfer.core.memory_plan``)
  picks the residents to evict (idle before busy, lower priority, least recently used; never a pinned or
  loading one; a busy one drains, and only for a strictly higher priority or a starving request; none within
  its ``min_hold`` unless the candidate starves); the candidate is planned and starts once their memory is
  back, and nobody else starts meanwhile;
- a candidate whose need exceeds the whole budget is refused at once, with a message naming both;
- when the first candidate must wait (only pinned, loading, held or busy residents are in its way), a
  later one may still start if it fits without evicting anyone;
- a pinned member without requests never evicts anyone: it starts when it fits (as in a group that runs one
  model at a time, where it never preempts).

``out_of_memory_step`` handles a start that failed for lack of memory: the first time, the group's evictable
residents are evicted and the model is retried once, when they are all gone (the figures just proved wrong, so
memory is not counted as coming back before it has); the second time it fails with its need and the budget.
``decision_times`` are the moments a decision here can change without an event (holds ending, requests
starving). Pure reads over slots and the ledger (``flexinfer.core.arbiter.memory``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from flexinfer.api.key import ModelKey
from flexinfer.core.arbiter.memory import MemoryLedger
from flexinfer.core.arbiter.policy import ArbiterPolicy
from flexinfer.core.arbiter.state import Slot
from flexinfer.core.memory_need import (
    MemoryNeed,
    eviction_cause,
    out_of_memory,
    out_of_memory_cause,
    out_of_memory_failure,
    too_large_message,
)
from flexinfer.core.memory_plan import Candidate, Evict, Fits, Resident, TooLarge, plan


@dataclass(frozen=True)
class GroupStep:
    """Start ``model`` now (``start``), or evict ``evict`` for it (``cause``: why, for their stop), or refuse it
    (``refusal``: the error its requests get)."""

    model: Slot
    start: bool = False
    evict: tuple[Slot, ...] = ()
    cause: str = ""
    refusal: str = ""


def next_step(group: str, members: Sequence[Slot], ledger: MemoryLedger, planned: ModelKey | None,
              now: float) -> GroupStep | None:
    """What the group does next (see the module docstring); ``None``: nothing now."""
    policy = ledger.policy
    budget = ledger.budget(group)
    residents = [s for s in members if s.running]
    waiting = sorted((s for s in members if not s.running and s.wants_gpu(now, policy)),
                     key=lambda s: _rank(s, now, policy))
    first = next((s for s in waiting if s.key == planned), None)
    candidates = [first] if first is not None else []
    candidates += [s for s in waiting if s is not first]
    view = [resident(s, ledger, now, policy) for s in residents]
    fit_only = False
    for slot in candidates:
        if slot.oom_retried and any(r.leaving for r in view):
            return GroupStep(slot)  # the retry after an out-of-memory start waits until the evicted are gone
        need = ledger.need(slot.model)
        result = plan(budget, view, candidate(slot, need, now, policy))
        if isinstance(result, Fits):
            return GroupStep(slot, start=True)
        if isinstance(result, TooLarge):
            return GroupStep(slot, refusal=too_large_message(str(slot.key), need, group, budget))
        if isinstance(result, Evict) and not fit_only and slot.queue:
            victims = tuple(s for s in residents if s.key in {v.key for v in result.victims})
            return GroupStep(slot, evict=_in_order(victims, result), cause=eviction_cause(
                str(slot.key), need, sum(r.need_mib for r in view), group, budget))
        fit_only = True
    return None


def resident(slot: Slot, ledger: MemoryLedger, now: float, policy: ArbiterPolicy) -> Resident:
    """The planner's view of a running member."""
    hold_end = slot.ready_since + policy.min_hold if slot.ready_since is not None else None
    return Resident(
        key=slot.key, need_mib=ledger.need(slot.model).mib, priority=slot.model.priority,
        last_used=max((t for t in (slot.last_active, slot.ready_since) if t is not None), default=0.0),
        busy=bool(slot.queue or slot.in_flight), oldest_wait=slot.oldest_wait, pinned=pinned(slot, policy),
        loading=slot.loading, leaving=slot.stopping or slot.drain_until is not None,
        held=hold_end is not None and now < hold_end)


def candidate(slot: Slot, need: MemoryNeed, now: float, policy: ArbiterPolicy) -> Candidate:
    oldest = slot.oldest_wait
    return Candidate(need.mib, slot.model.priority, oldest is not None and now - oldest >= policy.max_wait, oldest)


def pinned(slot: Slot, policy: ArbiterPolicy) -> bool:
    """Never evicted for memory: kept running by ``minReplicas``/a preload, or the group's warm primary."""
    return slot.pinned(policy) or slot.model.spec.config.get("warmPolicy") == "primary"


def out_of_memory_step(slot: Slot, error: str, members: Iterable[Slot], ledger: MemoryLedger) -> GroupStep | None:
    """After ``slot``'s start failed with ``error``: evict and retry (``evict`` set), fail with its need and the
    budget (``refusal`` set), or ``None`` (not a memory group, not a lack of memory: the usual failure)."""
    budget, policy = ledger.budget(slot.group), ledger.policy
    if budget <= 0 or not out_of_memory(error):
        return None
    need = ledger.need(slot.model)
    residents = [s for s in members if s.running and s is not slot]
    victims = tuple(s for s in residents if not pinned(s, policy) and not s.loading and not s.stopping
                    and s.drain_until is None)
    if slot.oom_retried or not victims:
        used = sum(ledger.need(s.model).mib for s in residents)
        return GroupStep(slot, refusal=out_of_memory_failure(str(slot.key), need, str(slot.group), budget,
                                                             held_mib=used, error=error))
    return GroupStep(slot, evict=victims, cause=out_of_memory_cause(str(slot.key), str(slot.group)))


def decision_times(members: Sequence[Slot], policy: ArbiterPolicy) -> list[float]:
    """When a decision in the group can change without an event: each resident's hold ending and each waiting
    request reaching the starvation bound (only while someone waits)."""
    waits = [oldest + policy.max_wait for s in members if not s.running and (oldest := s.oldest_wait) is not None]
    if not waits:
        return []
    holds = [s.ready_since + policy.min_hold for s in members if s.servable and s.ready_since is not None]
    return waits + holds


def _rank(slot: Slot, now: float, policy: ArbiterPolicy) -> tuple[bool, float, bool, int, float, str]:
    oldest = slot.oldest_wait
    starving = oldest is not None and now - oldest >= policy.max_wait
    waited = oldest if oldest is not None else float("inf")
    return (not starving, waited if starving else 0.0, not slot.queue, -slot.model.priority, waited, slot.key)


def _in_order(victims: tuple[Slot, ...], result: Evict) -> tuple[Slot, ...]:
    order = {v.key: index for index, v in enumerate(result.victims)}
    return tuple(sorted(victims, key=lambda s: order[s.key]))
