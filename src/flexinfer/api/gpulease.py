"""The ``GPULease`` resource (``ai.flexinfer/v1alpha2``): a workload parking a shared GPU group.

FlexInfer serving only reads leases (the "park-and-hold" rule in ``flexinfer.core.election``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from flexinfer.api.base import GROUP, ApiModel, NamedResource, ObjectMeta, StatusModel

API_VERSION = f"{GROUP}/v1alpha2"
KIND = "GPULease"


class GPULeaseSpec(ApiModel):
    """``GPULease.spec``."""

    group: str = Field(min_length=1)
    node: str | None = None
    owner: str | None = None
    expires_at: datetime | None = None
    priority: int | None = None


class GPULeaseStatus(StatusModel):
    """``GPULease.status``."""

    acquired_at: datetime | None = None
    active: bool | None = None


class GPULease(NamedResource, ApiModel):
    """A ``GPULease`` resource."""

    api_version: Literal["ai.flexinfer/v1alpha2"] = "ai.flexinfer/v1alpha2"
    kind: Literal["GPULease"] = "GPULease"
    metadata: ObjectMeta
    spec: GPULeaseSpec
    status: GPULeaseStatus = Field(default_factory=GPULeaseStatus)

    def active_at(self, now: datetime) -> bool:
        """A lease is honoured until ``expiresAt`` (forever when unset)."""
        return self.spec.expires_at is None or now < self.spec.expires_at
