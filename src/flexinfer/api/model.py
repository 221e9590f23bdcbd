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
    """GPU vendor: `auto` (detect from the node label), `nvidia`, `amd` or `cpu`. Without a `gpu` block the model is
    CPU-only."""
    shared: str | None = Field(default=None, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    """Shared GPU group: models with the same value time-share one GPU (one active at a time, the others swapped out
    on demand). Unset: the model has its GPU(s) to itself."""
    priority: int = Field(default=DEFAULT_PRIORITY, ge=0, le=1000)
    """Priority in the shared group (0-1000): when members compete for the GPU, the higher priority wins."""
    count: int | None = Field(default=None, ge=1, le=8)
    """Number of GPUs (1-8); unset means 1 when a GPU vendor is set. Not allowed with vendor `cpu`."""
    vram_estimate_mb: int | None = Field(default=None, ge=0, alias="vramEstimateMB")
    """Estimated VRAM in MiB; a scheduling hint written to the rendered objects' annotations."""
    swap_cooldown: Duration | None = None
    """Minimum time a group member keeps the GPU after it became Ready before another may take it (anti-thrash;
    never delays a request waiting past the starvation bound); the group uses the largest of its members' values and
    `FLEXINFER_SWAP_MIN_HOLD` (15s, the default)."""
    force_promotion: bool | None = None
    """Make this model the group's leader regardless of demand and priority (operator override)."""


class ServerlessSpec(ApiModel):
    """``spec.serverless``: scale-to-zero settings. ``coldStartTimeout`` unset = the proxy default."""

    enabled: bool = True
    """Scale to zero when idle. `false` keeps the model running (one replica) at all times."""
    min_replicas: int = Field(default=0, ge=0, le=10)
    """Replicas kept even when idle (0-10); 0 allows scale to zero."""
    idle_timeout: Duration | None = None
    """Idle time after which a running model is stopped (scaled to zero). Default 5m (10m for image-generation
    backends)."""
    cold_start_timeout: Duration | None = None
    """How long a request waits for this model to become Ready before it gets an error. Default: the proxy's
    `PROXY_COLD_START_TIMEOUT`."""


class FlashLoaderSpec(ApiModel):
    """``spec.cache.flashLoader``: per-model flash-loader overrides (each field only when set)."""

    enabled: bool | None = None
    """Stage the weights into RAM (tmpfs) before the server starts. Unset: a matching ModelCache's
    `flashLoader.enabled`, else the default (`DEFAULT_FLASH_LOADER_ENABLED`, in both engines)."""
    concurrency: int | None = Field(default=None, ge=1, le=32)
    """Parallel copy workers (1-32). Default 4."""
    tmpfs_size_limit: Quantity | None = None
    """Size limit of the tmpfs the weights are staged into (Kubernetes quantity, e.g. `16Gi`); not applied to
    shared models, whose staged copy persists."""
    buffer_size_kb: int | None = Field(default=None, ge=32, le=16384, alias="bufferSizeKB")
    """Bytes per copy call, in KiB (32-16384). Default 4096."""
    verify_integrity: bool | None = None
    """Compare checksums of files that look unchanged and verify every expected file after the copy."""
    image: str | None = None
    """Image of the flash-loader init container (default: the FlexInfer image)."""


class CompilationCacheSpec(ApiModel):
    """``spec.cache.compilationCache``: persistent MIOpen/Torch/Triton kernel caches."""

    enabled: bool | None = None
    """Keep MIOpen/Torch/Triton kernel caches on the node across restarts. Unset: on for shared models with GPU
    vendor `amd` or `auto`."""
    host_path: str | None = None
    """Node directory for the kernel caches. Default `/var/lib/flexinfer/compile-cache`."""
    size_limit: Quantity | None = None
    """Accepted for compatibility; not applied (a hostPath volume has no size limit)."""


class CacheSpec(ApiModel):
    """``spec.cache``: where weights live and how they are staged."""

    strategy: CacheStrategy | None = None
    """Where the weights live: `Memory` (RAM, the default for shared models), `SharedPVC` (the default otherwise),
    `Local` (a node directory) or `None`."""
    pvc_name: str | None = None
    """PersistentVolumeClaim holding the weights for `SharedPVC` (default `<model>-cache`)."""
    storage_class: str | None = None
    """Accepted for compatibility; not used (FlexInfer does not create PersistentVolumeClaims)."""
    size: Quantity | None = None
    """Accepted for compatibility; not used (FlexInfer does not create PersistentVolumeClaims)."""
    host_path: str | None = None
    """Base node directory for the `Local` strategy; the model's weights go to `<hostPath>/<namespace>/<name>`.
    Default `/var/lib/flexinfer/models`."""
    compilation_cache: CompilationCacheSpec | None = None
    """Persistent GPU kernel caches (see the fields below)."""
    flash_loader: FlashLoaderSpec | None = None
    """Per-model flash-loader settings; each field overrides the defaults only when set."""


class LiteLLMSpec(ApiModel):
    """``spec.litellm``: exposure; ``enabled: false`` parks the model (the proxy answers 404)."""

    enabled: bool = True
    """Expose the model. `false` parks it: the proxy answers 404 and `/v1/models` hides it."""
    served_model_name: str | None = None
    """An extra public name clients may use in the request's `model` field (and the LiteLLM served-model annotation).
    Not sent to the server: see `spec.config.servedModelName`."""
    aliases: list[str] = Field(default_factory=list)
    """More public names clients may use in the request's `model` field (the first model claiming an alias wins)."""
    copilot_alias: str | None = None
    """Name written to the `litellm.flexinfer.ai/copilot-alias` Service annotation."""


class ModelSpec(ApiModel):
    """``Model.spec``."""

    backend: Backend
    """Model server kind: `llamacpp` (alias `llama.cpp`), `vllm`, `ollama`, `mlc-llm` (alias `mlc`), `diffusers`,
    `comfyui` or `vllm-omni`. Picks the image and arguments (Kubernetes) or the launch profile (local)."""
    source: str = Field(min_length=1)
    """Where the weights are: `HF://org/model`, `ollama://model:tag`, `file:///path` or `pvc://claim/sub/path`. Local
    mode serves only `file://` sources (relative paths are relative to the manifest's directory)."""
    image: str | None = None
    """Container image of the model server, overriding the backend's default image."""
    gpu: GPUSpec | None = None
    """GPU vendor, count, shared group and priority. Omit for a CPU-only model."""
    serverless: ServerlessSpec | None = None
    """Scale-to-zero and cold-start settings. Omitted: scale to zero with the default timeouts."""
    cache: CacheSpec | None = None
    """Weight storage and staging (cache strategy, flash-loader, kernel caches)."""
    config: dict[str, Any] = Field(default_factory=dict)
    """Free-form server settings; the keys FlexInfer reads are listed in the `spec.config` table."""
    resources: ResourceRequirements | None = None
    """CPU/memory requests and limits of the model container (GPU keys are rejected: use `spec.gpu`)."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node labels the model's pod must match (default: nodes of the model's GPU vendor)."""
    tolerations: list[Toleration] = Field(default_factory=list)
    """Pod tolerations, added to the GPU toleration FlexInfer always sets for GPU models."""
    service_labels: list[str] = Field(default_factory=list, max_length=10)
    """Semantic routing labels (at most 10, e.g. `textgen`), written to the Service."""
    litellm: LiteLLMSpec | None = None
    """Public names and exposure (parking) of the model."""


class OutOfMemoryStatus(StatusModel):
    """``status.sharedGroup.outOfMemory``: a start of this member that ran out of memory (groups that pack by
    memory): the group's other members were evicted and the model is retried once; a second failure is kept."""

    pod: str = ""
    """The pod whose server ran out of memory first."""
    seen_at: datetime | None = None
    """When the manager saw it (and evicted the group's other members for the retry)."""
    observed_generation: int | None = None
    """The Model generation it applies to: a changed spec starts afresh."""
    failure: str = ""
    """Set when the retry ran out of memory too: the message the Model fails with."""


class MeasuredMemoryStatus(StatusModel):
    """``status.sharedGroup.memoryMeasured``: what the member's llama.cpp server reported it allocated, read once
    from its log after it became Ready (groups that pack by memory); kept for later starts of the same generation."""

    need_mib: float | None = Field(default=None, alias="needMiB")
    """MiB on its GPU(s) (all of its buffers for a CPU model); unset when the log read showed no complete buffer
    sizes (another server, a `--verbosity` below 4 in `spec.config.args`, a log that could not be read)."""
    observed_generation: int | None = None
    """The Model generation it was measured for: a changed spec drops it."""
    server_run: str = ""
    """The server run whose log was read (`pod#restarts`: the pod and its container's restart count): one read per
    run while there is no figure."""


class SharedGroupStatus(StatusModel):
    """``status.sharedGroup``: this member's place in its shared GPU group."""

    group_name: str = ""
    """The shared group this model belongs to."""
    state: SharedState | None = None
    """`Active` (holds the GPU), `Queued` (waiting for it) or `Preempted`."""
    queue_position: int = 0
    """Position among the group's waiting members (0 when active)."""
    preempted_by: str = ""
    """The model that took the GPU from this one."""
    preempted_at: datetime | None = None
    """When this model lost the GPU."""
    memory_need_mib: float | None = Field(default=None, alias="memoryNeedMiB")
    """What this member takes of its group's memory budget, in MiB (groups that pack by memory)."""
    memory_need_source: Literal["measured", "declared", "estimated", "unknown"] | None = None
    """Where `memoryNeedMiB` comes from: `measured` (`memoryMeasured`), `declared` (`spec.gpu.vramEstimateMB`),
    `estimated` (a `vllm` member with a GPU: its `--gpu-memory-utilization`, default 0.9, times the GPU profile's
    `vramMB`) or `unknown` (the whole budget)."""
    memory_budget_mib: float | None = Field(default=None, alias="memoryBudgetMiB")
    """The group's memory budget, in MiB (groups that pack by memory with a limit)."""
    out_of_memory: OutOfMemoryStatus | None = None
    """A start that ran out of memory: retried once after evicting the group's other members."""
    memory_measured: MeasuredMemoryStatus | None = None
    """What the member's server reported it allocated, from its log (llama.cpp); the need from then on."""
    strategy: Literal["Exclusive", "TimeSliced", "MemoryShared"] | None = None
    """How the group runs (the manager's `FLEXINFER_GROUP_STRATEGIES`): `TimeSliced` and `MemoryShared` run every
    member in one group pod; unset: `Exclusive` (one Deployment per Model)."""
    group_endpoint: str | None = None
    """Group-pod mode: the running group pod's URL. The in-cluster proxy forwards a member's requests there in any
    phase but `Failed`: the pod starts or swaps the member in and holds the request meanwhile."""


class ActivationStatus(StatusModel):
    """``status.activation``: the open activation of a scaled-up model that is not Ready yet.

    Written by the Kubernetes manager when it decides to start the model (``decidedAt``; for a swap the
    moment the incumbent lost the GPU) and cleared when the model is Ready (latencies observed) or scaled
    back to zero. Persisted so a restarted manager still measures cold-start and swap latency.
    """

    kind: Literal["cold_start", "swap"] = "cold_start"
    """`cold_start` (the GPU was free) or `swap` (another model was preempted)."""
    decided_at: datetime | None = None
    """When the manager decided to start the model (for a swap: when the incumbent lost the GPU)."""
    demand_since: datetime | None = None
    """When the request that caused the activation arrived."""
    preempted: str | None = None
    """The model this swap preempted."""


class CacheStatus(StatusModel):
    """``status.cache``."""

    strategy: str | None = None
    """The effective cache strategy."""
    ready: bool = False
    """The weights are in place."""
    pvc_name: str | None = None
    """The claim holding the weights."""
    job_name: str | None = None
    """The cache-fill job, if any."""
    job_phase: Literal["Pending", "Running", "Succeeded", "Failed"] | None = None
    """Phase of the cache-fill job."""
    message: str | None = None
    """Human-readable cache state."""
    size_bytes: int | None = None
    """Size of the cached weights."""


class GPUStatus(StatusModel):
    """``status.gpu``: the allocated GPU."""

    node: str | None = None
    """Node the model's pod runs on; while scaled to zero, the node it last ran on (where a shared model's
    persistent tmpfs stays)."""
    device: str | None = None
    """GPU device."""
    vendor: str | None = None
    """GPU vendor."""
    architecture: str | None = None
    """GPU architecture (e.g. `gfx1100`)."""
    memory_mb: int | None = Field(default=None, alias="memoryMB")
    """GPU memory in MiB."""


class MetricsStatus(StatusModel):
    """``status.metrics``: serving figures as text (the ``TPS`` printer column reads ``tokensPerSecond``)."""

    tokens_per_second: str | None = None
    """Measured generation speed (the `TPS` column of `kubectl get mdl`)."""
    load_time_seconds: str | None = None
    """Time the last load took."""
    avg_latency_ms: str | None = None
    """Average request latency."""


class ModelStatus(StatusModel):
    """``Model.status`` as written by the manager (and ``lastActiveTime`` by the proxy)."""

    phase: Phase | None = None
    """`Idle`, `Pending`, `Loading`, `Ready`, `Preempted` or `Failed`."""
    conditions: list[Condition] = Field(default_factory=list)
    """Conditions `Cached`, `Loaded`, `Ready`, `Schedulable`, `ConfigValid` with reasons."""
    loading_substage: LoadingSubstage | None = None
    """What a Loading model is doing: `ImagePulling`, `Initializing`, `LoadingWeights`, `Compiling`,
    `HealthCheckPending` (or `Preempted`)."""
    message: str | None = None
    """Short human-readable state (e.g. a pull error or load progress)."""
    loading_progress_at: datetime | None = None
    """When the loading substage or message last changed (the proxy's stall detector reads it)."""
    endpoint: str | None = None
    """In-cluster URL of the model's Service."""
    pod_endpoint: str | None = None
    """While Ready on one pod: that pod's own URL (the in-cluster proxy forwards there, not waiting for the
    Service's endpoint to be programmed)."""
    last_active_time: datetime | None = None
    """Last request for the model (written by the proxy; the demand and idle signal)."""
    shared_group: SharedGroupStatus | None = None
    """This model's place in its shared GPU group."""
    activation: ActivationStatus | None = None
    """The open activation of a scaled-up model that is not Ready yet."""
    cache: CacheStatus | None = None
    """Weight cache state."""
    gpu: GPUStatus | None = None
    """The allocated GPU."""
    metrics: MetricsStatus | None = None
    """Serving figures, as text."""
    observed_generation: int | None = None
    """The `metadata.generation` this status reflects."""


class Model(NamedResource, ApiModel):
    """A ``Model`` resource."""

    api_version: Literal["ai.flexinfer/v1alpha2"] = "ai.flexinfer/v1alpha2"
    """`ai.flexinfer/v1alpha2`."""
    kind: Literal["Model"] = "Model"
    """`Model`."""
    metadata: ObjectMeta
    """Name (a DNS label), namespace (default `default`), labels and annotations."""
    spec: ModelSpec
    """What to serve and how."""
    status: ModelStatus = Field(default_factory=ModelStatus)
    """Written by the manager (Kubernetes); `flexinfer status` shows the local engine's state instead."""

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
