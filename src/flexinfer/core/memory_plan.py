"""The memory planner of a shared GPU group: does a model fit beside the models already resident, and if not,
which residents make room for it, in which order. Pure: every fact, time included, comes in as a value.

``plan(budget_mib, residents, candidate)`` answers with one of:

- ``Fits``: the candidate's need fits in the budget minus what the residents hold; start it now.
- ``Evict(victims)``: evict these residents (in order: idle ones first, then busy ones, which drain before they
  stop), then start the candidate once their memory is back. ``victims`` is empty when residents that are
  already leaving free enough: wait for them.
- ``TooLarge``: the candidate needs more than the whole budget; it can never start in this group.
- ``Blocked(blockers)``: even every evictable resident is not enough; the candidate waits for the blockers.

A budget of 0 or less means one model at a time (the groups that do not pack by memory): the candidate fits
only in an empty group, and every resident is in its way.

Which residents may be evicted, and in which order (the cheapest loss first):

1. never a pinned one (``minReplicas >= 1``, a warm primary), never one that is loading (its memory is
   reserved for a start in progress), never one that is already leaving (its memory counts as coming back);
2. never one inside its anti-thrash hold (``min_hold`` after Ready), unless the candidate is ``urgent``
   (waited past the starvation bound);
3. a busy one (requests in flight or waiting) only by draining it, and only for a candidate of strictly
   higher priority, or an urgent one whose oldest waiting request is older than the resident's own;
4. idle before busy, then lower priority before higher, then least recently used, then by key.

The victims are the shortest prefix of that order that frees enough, less any victim whose memory turned out
not to be needed (so no resident is evicted whose eviction was unnecessary given the others). Called by the
arbiter's memory groups (``flexinfer.core.arbiter.packing``) and its property tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

EPSILON_MIB = 1e-6
"""Sums of MiB figures are compared with this slack (floating-point addition is not associative)."""


@dataclass(frozen=True)
class Resident:
    """A model that holds (or is loading onto, or leaving) the group's memory."""

    key: str
    need_mib: float
    priority: int = 100
    last_used: float = 0.0
    busy: bool = False
    """Requests in flight or waiting for it."""
    oldest_wait: float | None = None
    """When its oldest waiting request arrived (``None``: none waits)."""
    pinned: bool = False
    loading: bool = False
    leaving: bool = False
    """Already being stopped (draining or stopping): its memory is coming back."""
    held: bool = False
    """Inside its anti-thrash hold."""


@dataclass(frozen=True)
class Candidate:
    """The model that wants to start."""

    need_mib: float
    priority: int = 100
    urgent: bool = False
    """Its oldest request waited past the starvation bound."""
    oldest_wait: float | None = None


@dataclass(frozen=True)
class Fits:
    """Start the candidate now."""


@dataclass(frozen=True)
class Evict:
    """Evict ``victims`` in order (busy ones drain first); an empty tuple: wait for the leaving residents."""

    victims: tuple[Resident, ...]


@dataclass(frozen=True)
class TooLarge:
    """The candidate needs more than the whole budget."""

    need_mib: float
    budget_mib: float


@dataclass(frozen=True)
class Blocked:
    """Not enough memory can be freed now: ``short_mib`` more is held by ``blockers`` (one model at a time: what
    the blockers hold)."""

    blockers: tuple[Resident, ...]
    short_mib: float


Plan = Fits | Evict | TooLarge | Blocked


def plan(budget_mib: float, residents: Sequence[Resident], candidate: Candidate) -> Plan:
    """Where ``candidate`` stands in a group with ``budget_mib`` (see the module docstring)."""
    if budget_mib <= 0:
        return _one_at_a_time(residents, candidate)
    if candidate.need_mib > budget_mib + EPSILON_MIB:
        return TooLarge(candidate.need_mib, budget_mib)
    deficit = candidate.need_mib - (budget_mib - sum(r.need_mib for r in residents))
    if deficit <= EPSILON_MIB:
        return Fits()
    deficit -= sum(r.need_mib for r in residents if r.leaving)
    if deficit <= EPSILON_MIB:
        return Evict(())
    order = eviction_order(residents, candidate)
    chosen = _prefix(order, deficit)
    if chosen is None:
        evictable = {r.key for r in order}
        blockers = tuple(r for r in residents if r.key not in evictable and not r.leaving)
        return Blocked(blockers, deficit - sum(r.need_mib for r in order))
    return Evict(_without_unneeded(chosen, deficit))


def evictable(resident: Resident, candidate: Candidate) -> bool:
    """``resident`` may be evicted for ``candidate`` now (rules 1-3 of the module docstring)."""
    if resident.pinned or resident.loading or resident.leaving:
        return False
    if resident.held and not candidate.urgent:
        return False
    if not resident.busy:
        return True
    if candidate.priority > resident.priority:
        return True
    if not candidate.urgent:
        return False
    mine, theirs = candidate.oldest_wait, resident.oldest_wait
    return theirs is None or (mine is not None and mine < theirs)


def eviction_order(residents: Sequence[Resident], candidate: Candidate) -> list[Resident]:
    """The residents ``candidate`` may evict, cheapest loss first (rule 4)."""
    return sorted((r for r in residents if evictable(r, candidate)),
                  key=lambda r: (r.busy, r.priority, r.last_used, r.key))


def _one_at_a_time(residents: Sequence[Resident], candidate: Candidate) -> Plan:
    present = [r for r in residents if not r.leaving]
    if not residents:
        return Fits()
    if not present:
        return Evict(())
    order = eviction_order(present, candidate)
    if len(order) < len(present):
        keys = {r.key for r in order}
        blockers = tuple(r for r in present if r.key not in keys)
        return Blocked(blockers, sum(r.need_mib for r in blockers))
    return Evict(tuple(order))


def _prefix(order: Sequence[Resident], deficit: float) -> list[Resident] | None:
    """The shortest prefix of ``order`` that frees ``deficit`` MiB (``None``: all of it does not)."""
    freed, chosen = 0.0, []
    for resident in order:
        chosen.append(resident)
        freed += resident.need_mib
        if freed >= deficit - EPSILON_MIB:
            return chosen
    return None


def _without_unneeded(chosen: list[Resident], deficit: float) -> tuple[Resident, ...]:
    """``chosen`` less every victim the others make unnecessary, costliest first (one pass suffices: the
    freed total only shrinks, so a victim found necessary stays necessary)."""
    kept = list(chosen)
    for resident in reversed(chosen):
        if sum(r.need_mib for r in kept) - resident.need_mib >= deficit - EPSILON_MIB:
            kept.remove(resident)
    return tuple(kept)
