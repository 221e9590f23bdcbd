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
    """Turn the flash-loader on for matching Models (overrides the cluster default; a Model's own
    `spec.cache.flashLoader` wins)."""
    concurrency: int | None = Field(default=None, ge=1, le=32)
    """Parallel copy workers (1-32)."""
    tmpfs_size_limit: Quantity | None = None
    """Size limit of the staging tmpfs (Kubernetes quantity)."""
    # Explicit aliases: the generated camelCase of ``p2p_port`` is ``p2PPort``, not Go's ``p2pPort``.
    p2p: bool = Field(default=False, alias="p2p")
    """Accepted for compatibility; not used."""
    p2p_port: int = Field(default=9876, ge=1, le=65535, alias="p2pPort")
    """Accepted for compatibility; not used."""
    image: str | None = None
    """Image of the flash-loader init container."""


class SecretKeyRef(ApiModel):
    """A reference to a Secret (key defaults to ``HF_TOKEN``)."""

    name: str
    """Secret name."""
    key: str = "HF_TOKEN"
    """Key in the Secret."""


class ModelCacheSpec(ApiModel):
    """``ModelCache.spec``: the serving-relevant fields; pipeline blocks kept opaque."""

    source: str = Field(min_length=1)
    """The cached model's source; a Model whose `HF://` source is contained in it uses this cache's flash-loader
    settings (so does a Model named like the cache, or `<cache>` = `<model>-cache`)."""
    storage_strategy: StorageStrategy = "Auto"
    """Accepted for compatibility; not used."""
    cluster_storage_class_name: str | None = None
    """Accepted for compatibility; not used."""
    existing_claim_name: str | None = None
    """Accepted for compatibility; not used."""
    model_path: str | None = None
    """Accepted for compatibility; not used."""
    storage_size: Quantity = "50Gi"
    """Accepted for compatibility; not used."""
    secret_ref: SecretKeyRef | None = None
    """Accepted for compatibility; not used."""
    oci_registry_secret_ref: SecretKeyRef | None = None
    """Accepted for compatibility; not used."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Accepted for compatibility; not used."""
    host_path: str | None = None
    """Accepted for compatibility; not used."""
    flash_loader: CacheFlashLoaderSpec | None = None
    """Flash-loader settings for the Models this cache matches (the only part of a ModelCache FlexInfer applies)."""
    eviction_policy: Literal["LRU", "LFU", "FIFO", "None"] = "LRU"
    """Accepted for compatibility; not used."""
    eviction_threshold_percent: int = Field(default=85, ge=50, le=99)
    """Accepted for compatibility; not used."""
    max_cache_size_bytes: int | None = Field(default=None, ge=0)
    """Accepted for compatibility; not used."""
    model_group: str | None = None
    """Accepted for compatibility; not used."""
    retention_priority: int = Field(default=50, ge=0, le=100)
    """Accepted for compatibility; not used."""
    max_retries: int = Field(default=3, ge=0)
    """Accepted for compatibility; not used."""
    quantization: dict[str, Any] | None = None
    """Pipeline block, accepted as an opaque object; not used."""
    abliteration: dict[str, Any] | None = None
    """Pipeline block, accepted as an opaque object; not used."""
    finetune: dict[str, Any] | None = None
    """Pipeline block, accepted as an opaque object; not used."""
    publish: dict[str, Any] | None = None
    """Pipeline block, accepted as an opaque object; not used."""
    download: dict[str, Any] | None = None
    """Pipeline block, accepted as an opaque object; not used."""


class ModelCacheStatus(StatusModel):
    """``ModelCache.status`` (the fields FlexInfer reads)."""

    phase: CachePhase | None = None
    """Cache pipeline phase (written by the original cache controller; FlexInfer does not write it)."""
    conditions: list[Condition] = Field(default_factory=list)
    """Conditions (not written by FlexInfer)."""
    path: str | None = None
    """Cache path (not written by FlexInfer)."""
    ready_nodes: int | None = None
    """Nodes holding the cache (not written by FlexInfer)."""
    total_nodes: int | None = None
    """Nodes targeted (not written by FlexInfer)."""
    retry_count: int | None = None
    """Pipeline retries (not written by FlexInfer)."""
    size_bytes: int | None = None
    """Model size (not written by FlexInfer)."""
    cache_size_bytes: int | None = None
    """Cache size (not written by FlexInfer)."""
    last_access_time: datetime | None = None
    """Last access (not written by FlexInfer)."""
    eviction_count: int | None = None
    """Evictions (not written by FlexInfer)."""


class ModelCache(NamedResource, ApiModel):
    """A ``ModelCache`` resource."""

    api_version: Literal["ai.flexinfer/v1alpha1"] = "ai.flexinfer/v1alpha1"
    """`ai.flexinfer/v1alpha1`."""
    kind: Literal["ModelCache"] = "ModelCache"
    """`ModelCache`."""
    metadata: ObjectMeta
    """Name, namespace (a ModelCache applies to Models in its namespace), labels, annotations."""
    spec: ModelCacheSpec
    """The cached model and its flash-loader settings."""
    status: ModelCacheStatus = Field(default_factory=ModelCacheStatus)
    """Accepted and ignored by FlexInfer."""
