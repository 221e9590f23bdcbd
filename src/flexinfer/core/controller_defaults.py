"""Controller runtime defaults (``DEFAULT_SHM_SIZE_LIMIT``, ``DEFAULT_FLASH_LOADER_*``, backend images).

Pure: ``controller_defaults(env)`` takes a mapping of environment variables (``flexinfer.settings``
reads the process environment once; ``flexinfer render --env-file`` passes a file's values) and returns
frozen settings. Invalid values fall back to the default, as the Go controller does. ``ENV_VARS``
lists every variable read here so documentation can be generated from it.

Used by ``flexinfer.core.flashloader_settings``, ``flexinfer.core.manifests`` and the CLI/assembly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from flexinfer import __version__
from flexinfer.core.envvalues import EnvVar, bool_word, positive_int, quantity_or_none
from flexinfer.core.profiles import BACKENDS

FLEXINFER_IMAGE_REPOSITORY = "ghcr.io/flexinfer/flexinfer"
"""The FlexInfer image; it also serves as the flash-loader image (``flexinfer flash-load``)."""

FLEXINFER_IMAGE = f"{FLEXINFER_IMAGE_REPOSITORY}:{__version__}"
DEFAULT_SHM_SIZE_LIMIT = "8Gi"
DEFAULT_FLASH_CONCURRENCY = 4
DEFAULT_FLASH_BUFFER_KB = 4096
DEFAULT_MODEL_IMAGE_PULL_POLICY = "Always"
PULL_POLICIES = ("Always", "IfNotPresent", "Never")


ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar("DEFAULT_SHM_SIZE_LIMIT", DEFAULT_SHM_SIZE_LIMIT,
           "sizeLimit of the /dev/shm memory emptyDir of every model pod (Kubernetes quantity)."),
    EnvVar("FLEXINFER_FLASH_LOADER_IMAGE", FLEXINFER_IMAGE,
           "Package default flash-loader image (used when DEFAULT_FLASH_LOADER_IMAGE is unset)."),
    EnvVar("DEFAULT_FLASH_LOADER_ENABLED", "false",
           "Enable the flash-loader for every model with a persistent volume (1/true/yes/on, 0/false/no/off)."),
    EnvVar("DEFAULT_FLASH_LOADER_IMAGE", "value of FLEXINFER_FLASH_LOADER_IMAGE",
           "Flash-loader init container image."),
    EnvVar("DEFAULT_FLASH_LOADER_CONCURRENCY", str(DEFAULT_FLASH_CONCURRENCY),
           "Parallel copy workers (positive integer; invalid values use the default)."),
    EnvVar("DEFAULT_FLASH_LOADER_BUFFER_KB", str(DEFAULT_FLASH_BUFFER_KB),
           "Copy buffer size in KiB (positive integer; invalid values use the default)."),
    EnvVar("DEFAULT_FLASH_LOADER_VERIFY", "false", "Verify file sizes after staging (bool word)."),
    EnvVar("DEFAULT_FLASH_LOADER_EXCLUDE", "",
           "Comma-separated path prefixes the flash-loader skips (always plus .cache/ and .git/)."),
    EnvVar("DEFAULT_FLASH_LOADER_TMPFS_SIZE_LIMIT", "",
           "sizeLimit of the non-shared flash tmpfs (Kubernetes quantity; empty or invalid = no limit)."),
    EnvVar("DEFAULT_<BACKEND>_IMAGE", "built-in per backend and runtime profile",
           "Image override for one backend, e.g. DEFAULT_VLLM_IMAGE or DEFAULT_MLC_LLM_IMAGE."),
    EnvVar("DEFAULT_MODEL_IMAGE_PULL_POLICY", DEFAULT_MODEL_IMAGE_PULL_POLICY,
           "imagePullPolicy of the model server container: Always, IfNotPresent or Never (anything else: Always)."),
)


@dataclass(frozen=True)
class FlashLoaderDefaults:
    """Layer 1 of the flash-loader precedence (spec §2.2): the controller-wide defaults."""

    enabled: bool = False
    image: str = FLEXINFER_IMAGE
    concurrency: int = DEFAULT_FLASH_CONCURRENCY
    buffer_size_kb: int = DEFAULT_FLASH_BUFFER_KB
    verify_integrity: bool = False
    exclude_patterns: str = ""
    tmpfs_size_limit: str | None = None


@dataclass(frozen=True)
class ControllerDefaults:
    """Everything the manifest renderer needs from the controller's environment."""

    shm_size_limit: str = DEFAULT_SHM_SIZE_LIMIT
    flash_loader: FlashLoaderDefaults = field(default_factory=FlashLoaderDefaults)
    backend_images: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Per-backend image overrides keyed by canonical backend name (``vllm``, ``llamacpp``, …)."""
    model_image_pull_policy: str = DEFAULT_MODEL_IMAGE_PULL_POLICY
    """``imagePullPolicy`` of model server containers (``IfNotPresent``/``Never`` for preloaded images)."""


def backend_image_env_name(backend: str) -> str:
    """``DEFAULT_<BACKEND>_IMAGE`` for a canonical backend name (``mlc-llm`` → ``DEFAULT_MLC_LLM_IMAGE``)."""
    return f"DEFAULT_{backend.upper().replace('-', '_').replace('.', '_')}_IMAGE"


def controller_defaults(env: Mapping[str, str], backends: tuple[str, ...] | None = None) -> ControllerDefaults:
    """Parse the controller environment; image overrides are read for ``backends`` (default: all known)."""
    names = tuple(BACKENDS) if backends is None else backends
    images = {name: env[backend_image_env_name(name)].strip() for name in names
              if env.get(backend_image_env_name(name), "").strip()}
    return ControllerDefaults(
        shm_size_limit=quantity_or_none(env.get("DEFAULT_SHM_SIZE_LIMIT")) or DEFAULT_SHM_SIZE_LIMIT,
        flash_loader=flash_loader_defaults(env),
        backend_images=MappingProxyType(images),
        model_image_pull_policy=pull_policy(env.get("DEFAULT_MODEL_IMAGE_PULL_POLICY")),
    )


def pull_policy(raw: str | None) -> str:
    """A Kubernetes imagePullPolicy; unset or unknown values fall back to ``Always``."""
    value = (raw or "").strip()
    return value if value in PULL_POLICIES else DEFAULT_MODEL_IMAGE_PULL_POLICY


def flash_loader_defaults(env: Mapping[str, str]) -> FlashLoaderDefaults:
    """The ``DEFAULT_FLASH_LOADER_*`` variables with the Go parsing rules (invalid → default)."""
    package_image = env.get("FLEXINFER_FLASH_LOADER_IMAGE", "").strip() or FLEXINFER_IMAGE
    return FlashLoaderDefaults(
        enabled=bool_word(env.get("DEFAULT_FLASH_LOADER_ENABLED"), False),
        image=env.get("DEFAULT_FLASH_LOADER_IMAGE", "").strip() or package_image,
        concurrency=positive_int(env.get("DEFAULT_FLASH_LOADER_CONCURRENCY"), DEFAULT_FLASH_CONCURRENCY),
        buffer_size_kb=positive_int(env.get("DEFAULT_FLASH_LOADER_BUFFER_KB"), DEFAULT_FLASH_BUFFER_KB),
        verify_integrity=bool_word(env.get("DEFAULT_FLASH_LOADER_VERIFY"), False),
        exclude_patterns=env.get("DEFAULT_FLASH_LOADER_EXCLUDE", "").strip(),
        tmpfs_size_limit=quantity_or_none(env.get("DEFAULT_FLASH_LOADER_TMPFS_SIZE_LIMIT")),
    )
