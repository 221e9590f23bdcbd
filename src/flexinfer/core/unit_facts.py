"""What one reconcile pass over a unit knows: the stored Models, Deployments, pods, reports, caches and leases.

The manager's reconciler (``flexinfer.manager.reconciler``) builds ``UnitFacts`` from its store for each pass;
``flexinfer.core.unit_plan.plan_unit`` turns them into the pass's plan. Pure data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from flexinfer.api.errors import FieldProblem, InvalidResourceError
from flexinfer.api.gpulease import GPULease
from flexinfer.api.model import Model
from flexinfer.api.modelcache import ModelCache
from flexinfer.api.modeldemand import ModelDemand
from flexinfer.core.election import Election

Json = dict[str, Any]


@dataclass(frozen=True)
class StoredModel:
    """A stored Model body: the typed Model (``None`` when invalid) or its validation error, and the fields
    ignored because their stored value cannot be parsed."""

    body: Json
    model: Model | None
    error: InvalidResourceError | None = None
    ignored: tuple[FieldProblem, ...] = ()


@dataclass(frozen=True)
class CacheProblem:
    """A ModelCache of the unit's namespace whose stored fields were ignored."""

    body: Json
    cache: ModelCache
    ignored: tuple[FieldProblem, ...]


@dataclass(frozen=True)
class UnitFacts:
    """What the manager knows about one unit at ``now`` (Deployments and pods keyed by Model name)."""

    now: datetime
    models: Sequence[StoredModel]
    deployments: Mapping[str, Json] = field(default_factory=dict)
    pods: Mapping[str, Sequence[Json]] = field(default_factory=dict)
    reports: Sequence[ModelDemand] = ()
    caches: Sequence[ModelCache] = ()
    cache_problems: Sequence[CacheProblem] = ()
    group: str | None = None
    """The shared group's name; ``None`` for an exclusive Model."""
    leases: Sequence[GPULease] = ()
    decided: Election | None = None
    """The election of this reconcile's first pass, whose preemptions are written: the pass that follows a
    preemption keeps it instead of electing again over the half-written group."""
    pods_gone_at: Mapping[str, datetime] = field(default_factory=dict)
    """When the last pod of a member was seen deleted (the manager's store remembers it): a device it released
    a moment ago may not be bound to the next pod yet (``pod_failure.DEVICE_SETTLE``)."""
    answered: Mapping[str, datetime] = field(default_factory=dict)
    """Pod run key → when that server run answered the manager's own health request (``pod_answer``): the pod
    counts as Ready from then, ahead of the kubelet's probe."""
    ready_seen: Mapping[tuple[str, str], datetime] = field(default_factory=dict)
    """(kind, name) of the unit's Pods and Deployments → when the manager's watch delivered the event that showed
    their ``Ready``/``Available`` condition turn True, for those whose transition it saw live."""
