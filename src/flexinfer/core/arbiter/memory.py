"""The arbiter's memory ledger: each group's budget, what each model needs, and the evictions so far.

Built from the arbiter's policy (``ledger.policy``): budgets come from ``ArbiterPolicy.group_budgets`` (MiB by
group: ``namespace/group``, or a bare group name for that group in every namespace); a group without one (or
with one of 0 or less) runs one model at a time. A model's need is, in order (``flexinfer.core.memory_need``):
what its server reported the last time it ran with the same manifest (``measured``),
``spec.gpu.vramEstimateMB`` (``declared``), the engine's estimate from its weights (``estimated``), else
``unknown``, which counts as the whole budget of its group (it runs alone until it was measured once). Needs
arrive as ``MemoryNeedReported`` events; a changed manifest forgets the measured figure (the new one may need
more: another context size, another quantization).

Owned by ``flexinfer.core.arbiter.machine.Arbiter`` (``Arbiter.memory``); the dispatcher reads it for the
admin views and the metrics.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from flexinfer.api.key import ModelKey
from flexinfer.api.model import Model, ModelSpec
from flexinfer.core.arbiter.events import MemoryNeedReported
from flexinfer.core.arbiter.policy import ArbiterPolicy
from flexinfer.core.arbiter.state import Slot
from flexinfer.core.memory_need import MemoryNeed, declared_mib, first_known

EVICTION_REASONS = ("make_room", "out_of_memory")
"""Why a resident was evicted: to make room for another model, or after another model's start ran out of memory."""


@dataclass(frozen=True)
class GroupMemory:
    """One group's memory as the admin views show it: its budget, what its Ready (or draining) members hold,
    what is reserved for the ones loading, and its running members."""

    group: str
    budget_mib: float
    used_mib: float
    reserved_mib: float
    models: tuple[str, ...]

    def as_json(self) -> dict[str, object]:
        return {"group": self.group, "budget_mib": round(self.budget_mib, 2), "used_mib": round(self.used_mib, 2),
                "reserved_mib": round(self.reserved_mib, 2), "models": list(self.models)}


@dataclass(frozen=True)
class _Measured:
    spec: ModelSpec
    mib: float


class MemoryLedger:
    """Budgets, needs and eviction counts (see the module docstring)."""

    def __init__(self, policy: ArbiterPolicy) -> None:
        self.policy = policy
        self._budgets = dict(policy.group_budgets)
        self._estimated: dict[ModelKey, float] = {}
        self._measured: dict[ModelKey, _Measured] = {}
        self.evictions: dict[tuple[str, str], int] = {}
        """``(group, reason)`` → evictions so far (``reason`` from ``EVICTION_REASONS``)."""

    @property
    def packs(self) -> bool:
        """Some group has a budget."""
        return any(budget > 0 for budget in self._budgets.values())

    def budget(self, group: str | None) -> float:
        """The budget of ``group`` (``namespace/group``) in MiB; 0 = one model at a time (and for a model with its
        own GPU, whose arbiter group key is not ``namespace/group``)."""
        if group is None or "/" not in group or group.startswith("\0"):
            return 0.0
        if group in self._budgets:
            return self._budgets[group]
        return self._budgets.get(group.partition("/")[2], 0.0)

    def learn(self, report: MemoryNeedReported, slot: Slot | None) -> None:
        """A figure for a model: an engine's ``estimated`` one for its current manifest, or the ``measured`` one
        of its server running the manifest of ``slot`` (ignored when the model is not declared)."""
        if report.source == "estimated":
            self._estimated[report.model] = report.mib
        elif report.source == "measured" and slot is not None:
            self._measured[report.model] = _Measured(slot.model.spec, report.mib)

    def need(self, model: Model) -> MemoryNeed:
        """What ``model`` takes of its group's budget (see the module docstring)."""
        measured = self._measured.get(model.key)
        current = measured.mib if measured is not None and (measured.spec is model.spec
                                                             or measured.spec == model.spec) else None
        group = model.group
        return first_known(current, declared_mib(model), self._estimated.get(model.key),
                           unknown_mib=self.budget(f"{model.namespace}/{group}" if group else None))

    def evicted(self, group: str, reason: str) -> None:
        self.evictions[(group, reason)] = self.evictions.get((group, reason), 0) + 1

    def groups(self, slots: Iterable[Slot]) -> list[GroupMemory]:
        """Every group with a budget that has members, by name."""
        members: dict[str, list[Slot]] = {}
        for slot in slots:
            if slot.group is not None and self.budget(slot.group) > 0:
                members.setdefault(slot.group, []).append(slot)
        return [self._group(group, members[group]) for group in sorted(members)]

    def _group(self, group: str, members: list[Slot]) -> GroupMemory:
        running = [s for s in members if s.running]
        used = sum(self.need(s.model).mib for s in running if not s.loading)
        reserved = sum(self.need(s.model).mib for s in running if s.loading)
        return GroupMemory(group, self.budget(group), used, reserved, tuple(sorted(s.key for s in running)))
