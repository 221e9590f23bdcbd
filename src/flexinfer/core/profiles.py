"""Runtime profiles (GPU vendor/architecture specifics) and backend defaults, as data.

A ``RuntimeProfile`` says how a pod gets its accelerator: the device-plugin resource (the AMD and NVIDIA
device plugins inject ``/dev/kfd``, ``/dev/dri/*`` or ``/dev/nvidia*`` for the requested resource, so no
hostPath device mounts or privileged mode are needed), supplemental groups for the device nodes, the
runtime class, environment and the compile-cache environment. ``BackendDefaults`` says how a backend
server is started and probed, and how many requests it runs at once: ``parallel_requests`` (from
``spec.config.parallel``, the server flag in ``spec.config.args``, or the backend default — 1 for
llama.cpp) is what its server is told (``parallel_args``: ``--parallel N`` for llama.cpp,
``--max-num-seqs N`` for vLLM) and what the arbiter grants it at once, so one client's request
never shares a slot with (or interrupts) another's; ``served_name`` is the name the server answers to in both
engines (``served_name_args`` tells it: ``--alias`` for llama.cpp, ``--served-model-name`` for vLLM);
``config_args`` are the extra server arguments of ``spec.config.args`` both engines append, last. Pure data
plus selectors; used by ``flexinfer.core.manifests.render``, ``flexinfer.local.profiles``, the in-cluster
proxy's catalog and the arbiter (``Slot.capacity``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
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
    """Container args; ``{model}`` and ``{port}`` are substituted."""
    hf_model_flag: str | None = None
    """Replaces ``--model`` in ``args`` for ``HF://`` sources (llama.cpp downloads with ``--hf-repo``)."""
    served_name_flag: str | None = None
    """The server's flag for the name it answers to (``served_name_args``); without one it answers to what it
    loads."""
    env: tuple[tuple[str, str], ...] = ()
    parallel_flags: tuple[str, ...] = ()
    """The server's flag for how many requests it runs at once (first = the one FlexInfer passes)."""
    parallel: int | None = None
    """Requests it runs at once unless configured; ``None``: the server schedules any number itself."""
    log_args: tuple[str, ...] = ()
    """Arguments that make the server log what it allocated (llama.cpp's buffer sizes, at ``--verbosity 4``, as the
    local engine starts it): the manager measures a Ready server's memory from them
    (``flexinfer.core.measured_memory``); a ``--verbosity`` in ``spec.config.args`` comes later and wins."""


_SERVE_ARGS = ("--model", "{model}", "--host", "0.0.0.0", "--port", "{port}")
_VLLM_PARALLEL = ("--max-num-seqs",)
_VLLM_SERVED_NAME = "--served-model-name"
PARALLEL_FIELD = "spec.config.parallel"
BACKENDS: dict[str, BackendDefaults] = {
    "vllm": BackendDefaults(
        "vllm", {"rocm": "rocm/vllm:latest", "cuda": "vllm/vllm-openai:latest", "cpu": "vllm/vllm-openai:latest"},
        8000, "/health", "/health", args=_SERVE_ARGS, parallel_flags=_VLLM_PARALLEL,
        served_name_flag=_VLLM_SERVED_NAME),
    "vllm-omni": BackendDefaults(
        "vllm-omni", {"rocm": "rocm/vllm:latest", "cuda": "vllm/vllm-openai:latest", "cpu": "vllm/vllm-openai:latest"},
        8000, "/health", "/health", args=_SERVE_ARGS, parallel_flags=_VLLM_PARALLEL,
        served_name_flag=_VLLM_SERVED_NAME),
    "llamacpp": BackendDefaults(
        "llamacpp", {"rocm": "ghcr.io/ggml-org/llama.cpp:server-rocm",
                     "cuda": "ghcr.io/ggml-org/llama.cpp:server-cuda", "cpu": "ghcr.io/ggml-org/llama.cpp:server"},
        8080, "/health", "/health", args=_SERVE_ARGS, hf_model_flag="--hf-repo",
        parallel_flags=("--parallel", "-np"), parallel=1, served_name_flag="--alias", log_args=("--verbosity", "4")),
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


def parallel_requests(model: Model) -> int | None:
    """How many requests the model's server runs at once (``None``: no limit the proxy must keep):
    ``spec.config.parallel``, else the value of the backend's flag in ``spec.config.args``, else the
    backend default (none for a custom ``spec.config.command``). ``ConfigError`` naming the field when a
    value is not a positive integer, or when ``spec.config.parallel`` and the flag in the args disagree."""
    backend = BACKENDS.get(model.backend)
    configured = model.spec.config.get("parallel")
    if configured is not None and (isinstance(configured, bool) or not isinstance(configured, int)
                                   or configured < 1):
        raise ConfigError(f"{model.key}: {PARALLEL_FIELD} must be a positive integer, got {configured!r}")
    in_args = _flag_value(model, backend.parallel_flags) if backend is not None else None
    if configured is not None and in_args is not None and configured != in_args:
        raise ConfigError(f"{model.key}: {PARALLEL_FIELD} is {configured} but spec.config.args sets "
                          f"{backend.parallel_flags[0] if backend else ''} {in_args}; set one of them")
    if configured is not None:
        return int(configured)
    if in_args is not None:
        return in_args
    return _default_parallel(model)


def _default_parallel(model: Model) -> int | None:
    """The backend's default capacity; none for a custom ``spec.config.command`` (not the backend's server)."""
    backend = BACKENDS.get(model.backend)
    if backend is None or model.spec.config.get("command") is not None:
        return None
    return backend.parallel


def effective_limit(proxy_limit: int, parallel: int | None) -> int:
    """The smaller of the proxy-wide cap (``PROXY_MAX_CONCURRENCY_PER_MODEL``) and the model's parallel
    capacity, ignoring unset ones (0 or ``None``); 0 = unlimited."""
    if not parallel or parallel <= 0:
        return max(proxy_limit, 0)
    return min(proxy_limit, parallel) if proxy_limit > 0 else parallel


def declared_parallel(model: Model) -> int | None:
    """``parallel_requests``, or the backend default when the manifest's value is invalid (for the proxy's
    catalog: the model itself fails to start with the ``ConfigError``)."""
    try:
        return parallel_requests(model)
    except ConfigError:
        return _default_parallel(model)


def served_name(model: Model) -> str:
    """The name the model server answers to, in both engines: ``spec.config.servedModelName``, else the model's
    name. ``spec.litellm.servedModelName`` is a public name the proxy resolves; it never reaches the server."""
    configured = model.spec.config.get("servedModelName")
    if isinstance(configured, str) and configured:
        return configured
    return model.name


def served_name_args(model: Model) -> tuple[str, ...]:
    """``(flag, served_name(model))`` for a backend whose server is told the name it answers to (llama.cpp
    ``--alias``, vLLM ``--served-model-name``), so a response's ``model`` is that name and not a file path;
    empty for the others."""
    backend = BACKENDS.get(model.backend)
    if backend is None or backend.served_name_flag is None:
        return ()
    return (backend.served_name_flag, served_name(model))


def config_args(model: Model) -> tuple[str, ...]:
    """``spec.config.args``: extra server arguments (strings or numbers), after the backend's own; both engines
    append them (locally to the launch profile's command, in Kubernetes to the container args).
    ``ConfigError`` naming the field for anything but a list of scalars."""
    args = model.spec.config.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str | int | float) and not isinstance(a, bool)
                                             for a in args):
        raise ConfigError(f"{model.key}: spec.config.args must be a list of strings, got {args!r}")
    return tuple(str(a) for a in args)


def parallel_args(model: Model, *, with_config_args: bool = True) -> tuple[str, ...]:
    """The server arguments that set its parallel capacity; empty when neither the manifest nor the backend
    sets one, or when the command also carries ``spec.config.args`` (``with_config_args``, both engines) and
    they set it already."""
    backend = BACKENDS.get(model.backend)
    count = parallel_requests(model)
    if backend is None or not backend.parallel_flags or count is None:
        return ()
    if with_config_args and _flag_value(model, backend.parallel_flags) is not None:
        return ()
    return (backend.parallel_flags[0], str(count))


def flag_value(args: Sequence[object], flags: Collection[str]) -> str | None:
    """The value after the last of ``flags`` in ``args`` (``--flag V`` or ``--flag=V``; ``""`` when it ends the
    args; ``None`` when none of them is there)."""
    found = None
    for index, arg in enumerate(args):
        name, eq, value = str(arg).partition("=")
        if name in flags:
            found = value if eq else (str(args[index + 1]) if index + 1 < len(args) else "")
    return found


def _flag_value(model: Model, flags: tuple[str, ...]) -> int | None:
    """The integer after the last of ``flags`` in ``spec.config.args`` (``--flag N`` or ``--flag=N``)."""
    args = model.spec.config.get("args")
    if not flags or not isinstance(args, list):
        return None
    found = flag_value(args, flags)
    if found is None:
        return None
    try:
        number = int(str(found))
    except ValueError:
        number = 0
    if number < 1:
        raise ConfigError(f"{model.key}: spec.config.args: {flags[0]} must be a positive integer, got {found!r}")
    return number


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
