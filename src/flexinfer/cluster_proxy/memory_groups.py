"""The memory of the Kubernetes engine's groups that pack by memory, for the in-cluster proxy's status page.

The manager writes each member's figures into its Model's ``status.sharedGroup`` (``memoryBudgetMiB``: the
group's budget; ``memoryNeedMiB``/``memoryNeedSource``: what the member takes of it). ``memory_groups`` reads
them from the proxy's watch cache into the rows the local engine's page shows (``Dispatcher.memory_report``), so
the page draws the same bar per group: the budget, ``used`` (the needs of the members that are Ready) and
``reserved`` (the needs of the Active members still starting). A member that was evicted and is still draining
is not counted (its Model already says Preempted), and the evictions are not known here (no ``evictions`` key;
the manager's ``/metrics`` counts them). A group whose members carry no budget (one model at a time, or no
limit) has no row. Called by ``flexinfer.assembly.proxy`` at each status request.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from flexinfer.api.model import Model
from flexinfer.core.phases import READY

STARTING = ("Pending", "Loading")


@dataclass
class _Group:
    budget_mib: float = 0.0
    used_mib: float = 0.0
    reserved_mib: float = 0.0
    models: list[str] = field(default_factory=list)


def memory_groups(models: Iterable[Model]) -> list[dict[str, object]]:
    """One row per group with a budget (``group`` is ``namespace/name``), in the local page's shape."""
    groups: dict[str, _Group] = {}
    for model in sorted(models, key=lambda m: m.key):
        shared = model.status.shared_group
        if model.group is None or shared is None or shared.memory_budget_mib is None:
            continue
        group = groups.setdefault(f"{model.namespace}/{model.group}", _Group())
        group.budget_mib = max(group.budget_mib, shared.memory_budget_mib)
        need, phase = shared.memory_need_mib or 0.0, model.status.phase
        if phase == READY:
            group.used_mib += need
        elif shared.state == "Active" and phase in STARTING:
            group.reserved_mib += need
        else:
            continue
        group.models.append(model.key)
    return [{"group": name, "budget_mib": round(g.budget_mib, 2), "used_mib": round(g.used_mib, 2),
             "reserved_mib": round(g.reserved_mib, 2), "models": g.models} for name, g in sorted(groups.items())]
