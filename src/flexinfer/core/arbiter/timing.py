"""When the arbiter must look again without an event: every deadline its state holds.

``deadlines`` lists them all (past ones too; the arbiter schedules its wake-up for the first one still ahead):
each waiting ticket's deadline, each drain's end, each idle timeout, each pinned model's restart after its
backoff, and the moments a group's decision can change (a hold ending, a request starving: ``decision_times``
of ``state`` for a group that runs one model at a time, of ``packing`` for one with a memory budget). Pure;
called by ``flexinfer.core.arbiter.machine.Arbiter`` after every event.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from flexinfer.core.arbiter import packing
from flexinfer.core.arbiter.memory import MemoryLedger
from flexinfer.core.arbiter.policy import ArbiterPolicy
from flexinfer.core.arbiter.state import Slot, decision_times, group_members


def deadlines(slots: Iterable[Slot], policy: ArbiterPolicy, memory: MemoryLedger) -> Iterator[float]:
    """Every time at which something is due (see the module docstring)."""
    slots = list(slots)
    for slot in slots:
        due = slot.queue.earliest_deadline()
        if due is not None:
            yield due
        if slot.drain_until is not None and not slot.stopping:
            yield slot.drain_until
        idle_end = slot.idle_deadline(policy)
        if idle_end is not None:
            yield idle_end
        if slot.retry_at is not None and slot.pinned(policy):
            yield slot.retry_at
    for group, members in group_members(slots).items():
        if memory.budget(group) > 0:
            yield from packing.decision_times(members, policy)
            continue
        holder = next((s for s in members if s.servable), None)
        if holder is not None:
            yield from decision_times(holder, members, policy)
