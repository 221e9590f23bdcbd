"""Runtime profiles (GPU vendor/architecture specifics) and backend defaults, as data.

A ``RuntimeProfile`` says how a pod gets its accelerator: the device-plugin resource (the AMD and NVIDIA
device plugins inject ``/dev/kfd``, ``/dev/dri/*`` or ``/dev/nvidia*`` for the requested resource, so no
hostPath device mounts or privileged mode are needed), supplemental groups for the device nodes, the
runtime class, environment and the compile-cache environment. ``BackendDefaults`` says how a backend
server is started and probed. Pure data plus two selectors; used by ``flexinfer.core.manifests``.
"""

from __future__ import annotations

from dataclasses import dataclass

from flexinfer.api.model import Model
from flexinfer.core.errors import ConfigError

COMPILE_CACHE_MOUNT = "/cache/compile"
DEFAULT_COMPILE_CACHE_HOST_PATH = "/var/lib/flexinfer/compile-cache"
GPU_VENDOR_NODE_LABEL = "node.flexstack.io/gpu-vendor"
AMD_DEVICE_GROUPS = (109, 992)
"""Host ``video`` and ``render`` group ids owning ``/dev/kfd`` and ``/dev/dri/renderD*`` (Go facts)."""


@dataclass(frozen=True)
class RuntimeProfile:
    """How a model pod reaches its accelerator."""

    name: str
    image_flavour: str
    """Key into ``BackendDefaults.images``: ``rocm``, ``cuda`` or ``cpu``."""
    gpu_resource: str | None = None
    supplemental_groups: tuple[int, ...] = ()
    runtime_class_name: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    compile_cache_env: tuple[tuple[str, str], ...] = ()
    """Variables pointing kernel caches into ``/cache/compile`` (set only when the cache is mounted)."""


PROFILES: dict[str, RuntimeProfile] = {
    "rocm-gfx1100": RuntimeProfile(
        name="rocm-gfx1100", image_flavour="rocm", gpu_resource="amd.com/gpu",
        supplemental_groups=AMD_DEVICE_GROUPS,
        env=(("HSA_OVERRIDE_GFX_VERSION", "11.0.0"),),
        compile_cache_env=(
            ("MIOPEN_USER_DB_PATH", f"{COMPILE_CACHE_MOUNT}/miopen"),
            ("MIOPEN_CUSTOM_CACHE_DIR", f"{COMPILE_CACHE_MOUNT}/miopen"),
            ("TRITON_CACHE_DIR", f"{COMPILE_CACHE_MOUNT}/triton"),
        ),
    ),
    "nvidia": RuntimeProfile(
        name="nvidia", image_flavour="cuda", gpu_resource="nvidia.com/gpu", runtime_class_name="nvidia",
        compile_cache_env=(("TRITON_CACHE_DIR", f"{COMPILE_CACHE_MOUNT}/triton"),),
    ),
    "cpu": RuntimeProfile(name="cpu", image_flavour="cpu"),
}
VENDOR_PROFILES = {"amd": "rocm-gfx1100", "nvidia": "nvidia", "cpu": "cpu"}
AUTO_VENDOR_PROFILE = "rocm-gfx1100"
"""Profile for ``gpu.vendor: auto`` without a vendor node label: FlexInfer's first target (gfx1100)."""


@dataclass(frozen=True)
class BackendDefaults:
    """How one backend server is run: images per profile flavour, port, probes, args."""

    name: str
    images: dict[str, str]
    port: int
    readiness_path: str
    startup_path: str
    needs_volume: bool = True
    args: tuple[str, ...] = ()
    hf_model_flag: str | None = None
    """Replaces ``--model`` in ``args`` for ``HF://`` sources (llama.cpp downloads with ``--hf-repo``)."""
    """Container args; ``{model}`` and ``{port}`` are substituted."""
    env: tuple[tuple[str, str], ...] = ()


_SERVE_ARGS = ("--model", "{model}", "--host", "0.0.0.0", "--port", "{port}")
BACKENDS: dict[str, BackendDefaults] = {
    "vllm": BackendDefaults(
        "vllm", {"rocm": "rocm/vllm:latest", "cuda": "vllm/vllm-openai:latest", "cpu": "vllm/vllm-openai:latest"},
        8000, "/health", "/health", args=_SERVE_ARGS),
    "vllm-omni": BackendDefaults(
        "vllm-omni", {"rocm": "rocm/vllm:latest", "cuda": "vllm/vllm-openai:latest", "cpu": "vllm/vllm-openai:latest"},
        8000, "/health", "/health", args=_SERVE_ARGS),
    "llamacpp": BackendDefaults(
        "llamacpp", {"rocm": "ghcr.io/ggml-org/llama.cpp:server-rocm",
                     "cuda": "ghcr.io/ggml-org/llama.cpp:server-cuda", "cpu": "ghcr.io/ggml-org/llama.cpp:server"},
        8080, "/health", "/health", args=_SERVE_ARGS, hf_model_flag="--hf-repo"),
    "ollama": BackendDefaults(
        "ollama", {"rocm": "ollama/ollama:rocm", "cuda": "ollama/ollama:latest", "cpu": "ollama/ollama:latest"},
        11434, "/api/version", "/api/version", needs_volume=False, env=(("OLLAMA_HOST", "0.0.0.0:11434"),)),
    "mlc-llm": BackendDefaults(
        "mlc-llm", {"rocm": "mlcai/mlc-llm:rocm", "cuda": "mlcai/mlc-llm:cuda", "cpu": "mlcai/mlc-llm:cpu"},
        8000, "/v1/models", "/v1/models", args=("serve", "{model}", "--host", "0.0.0.0", "--port", "{port}")),
    "diffusers": BackendDefaults(
        "diffusers", {"rocm": "ghcr.io/flexinfer/diffusers:rocm", "cuda": "ghcr.io/flexinfer/diffusers:cuda",
                      "cpu": "ghcr.io/flexinfer/diffusers:cpu"},
        8000, "/health", "/health"),
    "comfyui": BackendDefaults(
        "comfyui", {"rocm": "ghcr.io/flexinfer/comfyui:rocm", "cuda": "ghcr.io/flexinfer/comfyui:cuda",
                    "cpu": "ghcr.io/flexinfer/comfyui:cpu"},
        8188, "/system_stats", "/system_stats"),
}


def backend_defaults(model: Model) -> BackendDefaults:
    """The defaults of the model's (canonical) backend."""
    return BACKENDS[model.backend]


def runtime_profile(model: Model) -> RuntimeProfile:
    """``spec.config.runtimeProfile`` if given, else by ``gpu.vendor`` (auto → node label, else gfx1100)."""
    named = model.spec.config.get("runtimeProfile")
    if named is not None:
        named = str(named)
        if named not in PROFILES:
            raise ConfigError(
                f"{model.key}: spec.config.runtimeProfile: unknown profile {named!r} "
                f"(known: {', '.join(sorted(PROFILES))})"
            )
        return PROFILES[named]
    vendor = model.gpu_vendor
    if vendor == "auto":
        vendor = model.spec.node_selector.get(GPU_VENDOR_NODE_LABEL, "")
        return PROFILES[VENDOR_PROFILES.get(vendor, AUTO_VENDOR_PROFILE)]
    return PROFILES[VENDOR_PROFILES[vendor]]


def compile_cache_host_dir(model: Model, profile: RuntimeProfile) -> str | None:
    """Node directory of the compile cache, or ``None`` when the model gets none.

    Explicit ``cache.compilationCache.enabled`` wins; otherwise it is on for shared models with vendor
    ``amd``/``auto`` (the Go rule). Profiles without kernel caches (cpu) never get one.
    """
    if not profile.compile_cache_env:
        return None
    spec = model.spec.cache.compilation_cache if model.spec.cache else None
    enabled = spec.enabled if spec is not None and spec.enabled is not None else (
        model.group is not None and model.gpu_vendor in ("amd", "auto")
    )
    if not enabled:
        return None
    base = (spec.host_path if spec is not None and spec.host_path else None) or DEFAULT_COMPILE_CACHE_HOST_PATH
    return f"{base.rstrip('/')}/{model.namespace}/{model.name}"
