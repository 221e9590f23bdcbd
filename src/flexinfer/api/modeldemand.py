"""The ``ModelDemand`` resource (``ai.flexinfer/v1alpha1``): one in-cluster proxy replica's reports to the manager.

The proxy never writes Models. Each proxy replica keeps one ``ModelDemand`` per namespace it serves Models in
(named after the replica, in that namespace), and only there: per Model name, when it last wanted the model
(``lastActiveTime``, the demand signal), since when requests wait for it (``waitingSince``, the starvation
bound) and when it last confirmed requests in flight to it (``inFlightAt``, the swap drain gate).
``renewTime`` is the replica's heartbeat while it reports waits or requests in flight: the manager ignores
the ``waitingSince`` and ``inFlightAt`` of a report whose heartbeat is stale (its proxy is gone).
Written by ``flexinfer.cluster_proxy.demand_report`` (proxy), read by the manager (``flexinfer.core.demand_view``).
docs/design/kubernetes-proxy.md has the contract.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from flexinfer.api.base import GROUP, ApiModel, NamedResource, ObjectMeta

API_VERSION = f"{GROUP}/v1alpha1"
KIND = "ModelDemand"
PLURAL = "modeldemands"


class ModelReport(ApiModel):
    """What one proxy replica reports about one Model (every field optional)."""

    last_active_time: datetime | None = None
    """The proxy wanted the model at this instant (an activation, or a keep-alive while it serves)."""
    waiting_since: datetime | None = None
    """Start of the oldest request of this replica waiting for the model to be activated."""
    in_flight_at: datetime | None = None
    """Last confirmation that this replica forwards requests to the model (refreshed every 10 s)."""


class ModelDemandSpec(ApiModel):
    """``ModelDemand.spec``."""

    proxy: str = Field(min_length=1)
    """The reporting proxy replica (its pod name)."""
    renew_time: datetime | None = None
    """The replica's heartbeat, refreshed while it reports waits or requests in flight."""
    models: dict[str, ModelReport] = Field(default_factory=dict)
    """Reports by Model name (Models of this object's namespace only)."""


class ModelDemand(NamedResource, ApiModel):
    """A ``ModelDemand`` resource (no status: the proxy writes the spec, the manager only reads it)."""

    api_version: Literal["ai.flexinfer/v1alpha1"] = "ai.flexinfer/v1alpha1"
    kind: Literal["ModelDemand"] = "ModelDemand"
    metadata: ObjectMeta
    spec: ModelDemandSpec
