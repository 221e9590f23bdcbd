"""What the proxies report about one Model, folded from their ``ModelDemand`` objects (pure).

The manager's reconcile plan (``flexinfer.core.unit_plan``) calls ``demand_view`` with the ``ModelDemand``
objects of the Model's namespace, then ``with_demand`` to hand its decisions the Model as they always read it:
``status.lastActiveTime`` (the newest report, or the Model's own value written by a Go or pre-ModelDemand
proxy, whichever is newer), the wait marker annotation (the oldest ``waitingSince`` of a live replica, or
an older marker still stored on the Model) and one in-flight annotation per busy replica (``inFlightAt``
within the busy TTL, from a live replica). A replica is live while its ``renewTime`` is younger than the
TTL. The projection is the manager's view; of it, only ``status.lastActiveTime`` is written back (by
the status write: it must outlive the proxy pods that reported it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from flexinfer.api.conventions import INFLIGHT_PREFIX, WAITING_SINCE_ANNOTATION
from flexinfer.api.model import Model
from flexinfer.api.modeldemand import ModelDemand
from flexinfer.core.election import waiting_since_of


@dataclass(frozen=True)
class DemandView:
    """The proxies' reports about one Model (see the module docstring)."""

    last_active: datetime | None = None
    waiting_since: datetime | None = None
    busy: tuple[tuple[str, datetime], ...] = ()
    """(proxy replica, ``inFlightAt``) of every replica with requests in flight."""


def _fresh(moment: datetime | None, now: datetime, ttl: float) -> bool:
    return moment is not None and (now - moment).total_seconds() < ttl


def demand_view(reports: Iterable[ModelDemand], model: str, now: datetime, ttl: float) -> DemandView:
    """Fold the reports of every proxy replica about ``model`` (a name in the reports' namespace)."""
    last: list[datetime] = []
    waits: list[datetime] = []
    busy: list[tuple[str, datetime]] = []
    for report in reports:
        entry = report.spec.models.get(model)
        if entry is None:
            continue
        if entry.last_active_time is not None:
            last.append(entry.last_active_time)
        if not _fresh(report.spec.renew_time, now, ttl):
            continue
        if entry.waiting_since is not None:
            waits.append(entry.waiting_since)
        if entry.in_flight_at is not None and _fresh(entry.in_flight_at, now, ttl):
            busy.append((report.spec.proxy, entry.in_flight_at))
    return DemandView(max(last, default=None), min(waits, default=None), tuple(sorted(busy)))


def with_demand(model: Model, view: DemandView) -> Model:
    """``model`` as the manager's decisions read it (see the module docstring); ``model`` itself when the
    reports add nothing."""
    status = model.status
    if view.last_active is not None and (status.last_active_time is None
                                         or status.last_active_time < view.last_active):
        status = status.model_copy(update={"last_active_time": view.last_active})
    annotations = dict(model.metadata.annotations)
    stored = waiting_since_of(model)
    if view.waiting_since is not None and (stored is None or view.waiting_since < stored):
        annotations[WAITING_SINCE_ANNOTATION] = view.waiting_since.isoformat()
    for proxy, stamp in view.busy:
        annotations[INFLIGHT_PREFIX + proxy] = stamp.isoformat()
    if status is model.status and annotations == model.metadata.annotations:
        return model
    metadata = model.metadata.model_copy(update={"annotations": annotations})
    return model.model_copy(update={"status": status, "metadata": metadata})
