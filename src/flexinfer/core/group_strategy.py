"""How a shared GPU group runs in the Kubernetes engine: the Go GPUGroup's ``scalingPolicy.strategy`` names.

- ``Exclusive`` (the default, the seed's and Go's contract): one Deployment per Model; the manager's election
  scales members up and down, each swap a pod's life cycle.
- ``TimeSliced``: one *group pod* per group, holding the group's GPU, runs ``flexinfer serve`` over the
  members; its local engine swaps server processes one at a time (drains, priorities, backoff inside the pod).
- ``MemoryShared``: the same group pod, whose local engine packs members by memory (``serve
  --group-memory``; the budget from ``FLEXINFER_GPU_PROFILES`` when a profile gives one, else the GPU's own
  total, asked inside the pod).

``FLEXINFER_GROUP_STRATEGIES`` (Helm ``controller.groupStrategies``) is ``GROUP=STRATEGY,...``; ``GROUP`` is
a ``spec.gpu.shared`` value (that group in every namespace) or ``namespace/group`` (wins). Pure; parsed by
``flexinfer.manager.config``, read by the reconcile plan.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from flexinfer.core.errors import ConfigError

EXCLUSIVE: Final = "Exclusive"
TIME_SLICED: Final = "TimeSliced"
MEMORY_SHARED: Final = "MemoryShared"
STRATEGIES: Final = (EXCLUSIVE, TIME_SLICED, MEMORY_SHARED)
GROUP_POD_STRATEGIES: Final = frozenset({TIME_SLICED, MEMORY_SHARED})
"""The strategies that run the group in one group pod."""
ENV: Final = "FLEXINFER_GROUP_STRATEGIES"
_GROUP = re.compile(r"^(?:[a-z0-9]([-a-z0-9]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

Strategies = tuple[tuple[str, str], ...]
"""``(GROUP, STRATEGY)`` pairs as configured (hashable, for the frozen policy)."""


def parse_group_strategies(text: str, source: str = ENV) -> Strategies:
    """``GROUP=STRATEGY,...`` → pairs; ``ConfigError`` naming ``source`` and the entry for anything else (an
    unknown strategy lists the known ones; the names are matched without regard to case)."""
    out: dict[str, str] = {}
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        group, eq, name = (piece.strip() for piece in entry.partition("="))
        if not eq or not _GROUP.match(group):
            raise ConfigError(f"{source}: expected GROUP=STRATEGY (e.g. gpu0=TimeSliced), got {entry!r}")
        strategy = next((s for s in STRATEGIES if s.lower() == name.lower()), None)
        if strategy is None:
            raise ConfigError(f"{source}: group {group}: unknown strategy {name!r}; expected one of "
                              f"{', '.join(STRATEGIES)}")
        out[group] = strategy
    return tuple(sorted(out.items()))


def strategy_of(strategies: Iterable[tuple[str, str]], namespace: str, group: str) -> str:
    """The strategy of ``namespace``'s group ``group``: its ``namespace/group`` entry, else its ``group`` entry,
    else ``Exclusive``."""
    table = dict(strategies)
    return table.get(f"{namespace}/{group}") or table.get(group) or EXCLUSIVE


def runs_in_group_pod(strategies: Iterable[tuple[str, str]], namespace: str, group: str | None) -> bool:
    """Whether that group runs in one group pod (``TimeSliced``/``MemoryShared``)."""
    return group is not None and strategy_of(strategies, namespace, group) in GROUP_POD_STRATEGIES
