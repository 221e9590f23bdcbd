"""The legacy ``ModelCache`` resource (``ai.flexinfer/v1alpha1``).

On the serving path it matters only as a flash-loader override layer (see
``flexinfer.core.flashloader_settings``); pipeline blocks (quantize, finetune, …) are out of scope and
accepted as opaque objects so existing manifests still load.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from flexinfer.api.base import GROUP, ApiModel, Condition, NamedResource, ObjectMeta, Quantity, StatusModel

API_VERSION = f"{GROUP}/v1alpha1"
KIND = "ModelCache"

StorageStrategy = Literal["Auto", "NodeLocal", "SharedPVC", "Ephemeral", "Memory"]
CachePhase = Literal[
    "Pending", "Initializing", "Provisioning", "Abliterating", "Finetuning", "Quantizing", "Publishing",
    "Ready", "Failed",
]


class CacheFlashLoaderSpec(ApiModel):
    """``ModelCache.spec.flashLoader`` (v1alpha1 shape: ``enabled`` is a plain bool)."""

    enabled: bool = False
    concurrency: int | None = Field(default=None, ge=1, le=32)
    tmpfs_size_limit: Quantity | None = None
    # Explicit aliases: the generated camelCase of ``p2p_port`` is ``p2PPort``, not Go's ``p2pPort``.
    p2p: bool = Field(default=False, alias="p2p")
    p2p_port: int = Field(default=9876, ge=1, le=65535, alias="p2pPort")
    image: str | None = None


class SecretKeyRef(ApiModel):
    """A reference to a Secret (key defaults to ``HF_TOKEN``)."""

    name: str
    key: str = "HF_TOKEN"


class ModelCacheSpec(ApiModel):
    """``ModelCache.spec``: the serving-relevant fields; pipeline blocks kept opaque."""

    source: str = Field(min_length=1)
    storage_strategy: StorageStrategy = "Auto"
    cluster_storage_class_name: str | None = None
    existing_claim_name: str | None = None
    model_path: str | None = None
    storage_size: Quantity = "50Gi"
    secret_ref: SecretKeyRef | None = None
    oci_registry_secret_ref: SecretKeyRef | None = None
    node_selector: dict[str, str] = Field(default_factory=dict)
    host_path: str | None = None
    flash_loader: CacheFlashLoaderSpec | None = None
    eviction_policy: Literal["LRU", "LFU", "FIFO", "None"] = "LRU"
    eviction_threshold_percent: int = Field(default=85, ge=50, le=99)
    max_cache_size_bytes: int | None = Field(default=None, ge=0)
    model_group: str | None = None
    retention_priority: int = Field(default=50, ge=0, le=100)
    max_retries: int = Field(default=3, ge=0)
    quantization: dict[str, Any] | None = None
    abliteration: dict[str, Any] | None = None
    finetune: dict[str, Any] | None = None
    publish: dict[str, Any] | None = None
    download: dict[str, Any] | None = None


class ModelCacheStatus(StatusModel):
    """``ModelCache.status`` (the fields FlexInfer reads)."""

    phase: CachePhase | None = None
    conditions: list[Condition] = Field(default_factory=list)
    path: str | None = None
    ready_nodes: int | None = None
    total_nodes: int | None = None
    retry_count: int | None = None
    size_bytes: int | None = None
    cache_size_bytes: int | None = None
    last_access_time: datetime | None = None
    eviction_count: int | None = None


class ModelCache(NamedResource, ApiModel):
    """A ``ModelCache`` resource."""

    api_version: Literal["ai.flexinfer/v1alpha1"] = "ai.flexinfer/v1alpha1"
    kind: Literal["ModelCache"] = "ModelCache"
    metadata: ObjectMeta
    spec: ModelCacheSpec
    status: ModelCacheStatus = Field(default_factory=ModelCacheStatus)
