"""The ``Model`` resource (``ai.flexinfer/v1alpha2``): what to serve, on which GPU, with what cache.

Field names, enums and defaults follow the Go FlexInfer CRD. Cross-field rules that the schema cannot
express live in ``flexinfer.api.rules``. Used by every layer above ``api``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from flexinfer.api.base import (
    GROUP,
    ApiModel,
    Condition,
    Duration,
    NamedResource,
    ObjectMeta,
    Quantity,
    ResourceRequirements,
    StatusModel,
    Toleration,
)

API_VERSION = f"{GROUP}/v1alpha2"
KIND = "Model"
FINALIZER = "flexinfer.ai/model-cleanup"

Backend = Literal[
    "ollama", "vllm", "mlc-llm", "mlc", "llamacpp", "llama.cpp", "diffusers", "comfyui", "vllm-omni",
]
BACKEND_ALIASES: dict[str, str] = {"mlc": "mlc-llm", "llama.cpp": "llamacpp"}
GPUVendor = Literal["auto", "nvidia", "amd", "cpu"]
CacheStrategy = Literal["Memory", "SharedPVC", "Local", "None"]
Phase = Literal["Idle", "Pending", "Loading", "Ready", "Preempted", "Failed"]
LoadingSubstage = Literal[
    "ImagePulling", "Initializing", "LoadingWeights", "Compiling", "HealthCheckPending", "Preempted",
]
SharedState = Literal["Active", "Queued", "Preempted"]
SOURCE_SCHEMES = ("HF://", "hf://", "ollama://", "file://", "pvc://")
DEFAULT_PRIORITY = 100


class GPUSpec(ApiModel):
    """``spec.gpu``: vendor, shared group, priority and count."""

    vendor: GPUVendor = "auto"
    shared: str | None = Field(default=None, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    priority: int = Field(default=DEFAULT_PRIORITY, ge=0, le=1000)
    count: int | None = Field(default=None, ge=1, le=8)
    vram_estimate_mb: int | None = Field(default=None, ge=0, alias="vramEstimateMB")
    swap_cooldown: Duration | None = None
    force_promotion: bool | None = None


class ServerlessSpec(ApiModel):
    """``spec.serverless``: scale-to-zero settings. ``coldStartTimeout`` unset = the proxy default."""

    enabled: bool = True
    min_replicas: int = Field(default=0, ge=0, le=10)
    idle_timeout: Duration | None = None
    cold_start_timeout: Duration | None = None


class FlashLoaderSpec(ApiModel):
    """``spec.cache.flashLoader``: per-model flash-loader overrides (each field only when set)."""

    enabled: bool | None = None
    concurrency: int | None = Field(default=None, ge=1, le=32)
    tmpfs_size_limit: Quantity | None = None
    buffer_size_kb: int | None = Field(default=None, ge=32, le=16384, alias="bufferSizeKB")
    verify_integrity: bool | None = None
    image: str | None = None


class CompilationCacheSpec(ApiModel):
    """``spec.cache.compilationCache``: persistent MIOpen/Torch/Triton kernel caches."""

    enabled: bool | None = None
    host_path: str | None = None
    size_limit: Quantity | None = None


class CacheSpec(ApiModel):
    """``spec.cache``: where weights live and how they are staged."""

    strategy: CacheStrategy | None = None
    pvc_name: str | None = None
    storage_class: str | None = None
    size: Quantity | None = None
    host_path: str | None = None
    compilation_cache: CompilationCacheSpec | None = None
    flash_loader: FlashLoaderSpec | None = None


class LiteLLMSpec(ApiModel):
    """``spec.litellm``: exposure; ``enabled: false`` parks the model (the proxy answers 404)."""

    enabled: bool = True
    served_model_name: str | None = None
    aliases: list[str] = Field(default_factory=list)
    copilot_alias: str | None = None


class ModelSpec(ApiModel):
    """``Model.spec``."""

    backend: Backend
    source: str = Field(min_length=1)
    image: str | None = None
    gpu: GPUSpec | None = None
    serverless: ServerlessSpec | None = None
    cache: CacheSpec | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    resources: ResourceRequirements | None = None
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    service_labels: list[str] = Field(default_factory=list, max_length=10)
    litellm: LiteLLMSpec | None = None


class SharedGroupStatus(StatusModel):
    """``status.sharedGroup``: this member's place in its shared GPU group."""

    group_name: str = ""
    state: SharedState | None = None
    queue_position: int = 0
    preempted_by: str = ""
    preempted_at: datetime | None = None


class ActivationStatus(StatusModel):
    """``status.activation``: the open activation of a scaled-up model that is not Ready yet.

    Written by the Kubernetes manager when it decides to start the model (``decidedAt``; for a swap the
    moment the incumbent lost the GPU) and cleared when the model is Ready (latencies observed) or scaled
    back to zero. Persisted so a restarted manager still measures cold-start and swap latency.
    """

    kind: Literal["cold_start", "swap"] = "cold_start"
    decided_at: datetime | None = None
    demand_since: datetime | None = None
    preempted: str | None = None


class CacheStatus(StatusModel):
    """``status.cache``."""

    strategy: str | None = None
    ready: bool = False
    pvc_name: str | None = None
    job_name: str | None = None
    job_phase: Literal["Pending", "Running", "Succeeded", "Failed"] | None = None
    message: str | None = None
    size_bytes: int | None = None


class GPUStatus(StatusModel):
    """``status.gpu``: the allocated GPU."""

    node: str | None = None
    device: str | None = None
    vendor: str | None = None
    architecture: str | None = None
    memory_mb: int | None = Field(default=None, alias="memoryMB")


class MetricsStatus(StatusModel):
    """``status.metrics``: serving figures as text (the ``TPS`` printer column reads ``tokensPerSecond``)."""

    tokens_per_second: str | None = None
    load_time_seconds: str | None = None
    avg_latency_ms: str | None = None


class ModelStatus(StatusModel):
    """``Model.status`` as written by the manager (and ``lastActiveTime`` by the proxy)."""

    phase: Phase | None = None
    conditions: list[Condition] = Field(default_factory=list)
    loading_substage: LoadingSubstage | None = None
    message: str | None = None
    loading_progress_at: datetime | None = None
    endpoint: str | None = None
    last_active_time: datetime | None = None
    shared_group: SharedGroupStatus | None = None
    activation: ActivationStatus | None = None
    cache: CacheStatus | None = None
    gpu: GPUStatus | None = None
    metrics: MetricsStatus | None = None
    observed_generation: int | None = None


class Model(NamedResource, ApiModel):
    """A ``Model`` resource."""

    api_version: Literal["ai.flexinfer/v1alpha2"] = "ai.flexinfer/v1alpha2"
    kind: Literal["Model"] = "Model"
    metadata: ObjectMeta
    spec: ModelSpec
    status: ModelStatus = Field(default_factory=ModelStatus)

    @property
    def backend(self) -> str:
        """The canonical backend name (aliases resolved)."""
        return BACKEND_ALIASES.get(self.spec.backend, self.spec.backend)

    @property
    def group(self) -> str | None:
        """The shared GPU group, or ``None`` when the model owns its GPU(s)."""
        return self.spec.gpu.shared if self.spec.gpu and self.spec.gpu.shared else None

    @property
    def priority(self) -> int:
        return self.spec.gpu.priority if self.spec.gpu else DEFAULT_PRIORITY

    @property
    def gpu_vendor(self) -> str:
        """``cpu`` when no ``spec.gpu`` block is given (the Go ``GetGPUVendor`` rule)."""
        return self.spec.gpu.vendor if self.spec.gpu else "cpu"

    @property
    def gpu_count(self) -> int:
        """0 without a GPU block or for vendor cpu; else ``count`` or 1."""
        if self.spec.gpu is None or self.spec.gpu.vendor == "cpu":
            return 0
        return self.spec.gpu.count or 1

    @property
    def serverless(self) -> bool:
        return self.spec.serverless is None or self.spec.serverless.enabled

    @property
    def min_replicas(self) -> int:
        """``GetMinReplicas``: 1 when not serverless, else ``serverless.minReplicas``."""
        if not self.serverless:
            return 1
        return self.spec.serverless.min_replicas if self.spec.serverless else 0
