"""The manager's view of its groups that pack by memory, for ``/metrics``: each group's budget, what its members
hold and reserve (from the last reconcile pass's election), the evictions so far, and each member's need.

The reconciler (``flexinfer.manager.reconciler``) calls ``record`` after every pass over a shared group and
``evicted`` for each member preempted to make room; ``groups`` and ``needs`` are read at scrape time by the
memory collector the composition root registers (``flexinfer.observability.memory_metrics``), in the shape the
local engine's dispatcher gives it. A group that stops packing by memory (its GPU profile changed, its members
deleted) leaves the report with its members.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flexinfer.core.election import Election

EVICTION_REASONS = ("make_room", "out_of_memory")
"""Why the Kubernetes engine evicts: to make room for another member, or after another member's start ran out of
memory beside it (``flexinfer.core.oom_retry``)."""


@dataclass(frozen=True)
class NeedRow:
    """One member's need, as the memory collector reads it."""

    name: str
    namespace: str
    need_mib: float | None
    need_source: str | None


class MemoryReport:
    """See the module docstring."""

    def __init__(self) -> None:
        self._groups: dict[str, dict[str, Any]] = {}
        self._needs: dict[str, dict[str, NeedRow]] = {}
        self._evictions: dict[str, dict[str, int]] = {}

    def record(self, namespace: str, group: str, election: Election | None) -> None:
        """The figures of ``namespace/group`` after a pass (``election`` ``None`` or without memory: forget it)."""
        key = f"{namespace}/{group}"
        view = election.memory if election is not None else None
        if election is None or view is None:
            self._groups.pop(key, None)
            self._needs.pop(key, None)
            self._evictions.pop(key, None)
            return
        self._groups[key] = {"group": key, "budget_mib": view.budget_mib, "used_mib": view.used_mib,
                             "reserved_mib": view.reserved_mib}
        self._needs[key] = {name: NeedRow(name, namespace, d.need.mib, d.need.source)
                            for name, d in election.members.items() if d.need is not None}
        self._evictions.setdefault(key, dict.fromkeys(EVICTION_REASONS, 0))

    def evicted(self, namespace: str, group: str, reason: str = "make_room") -> None:
        counts = self._evictions.setdefault(f"{namespace}/{group}", dict.fromkeys(EVICTION_REASONS, 0))
        counts[reason] = counts.get(reason, 0) + 1

    def groups(self) -> list[dict[str, Any]]:
        """Every group that packs by memory: ``group``, ``budget_mib``, ``used_mib``, ``reserved_mib``,
        ``evictions`` by reason."""
        return [{**self._groups[key], "evictions": dict(self._evictions.get(key, {}))} for key in sorted(self._groups)]

    def needs(self) -> list[NeedRow]:
        """Every member of those groups with its need."""
        return [row for key in sorted(self._needs) for row in self._needs[key].values()]
