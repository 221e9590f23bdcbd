"""Controller runtime defaults (``DEFAULT_SHM_SIZE_LIMIT``, ``DEFAULT_FLASH_LOADER_*``, backend images).

Pure: ``controller_defaults(env, warn=...)`` takes a mapping of environment variables (``flexinfer.settings``
reads the process environment once; ``flexinfer render --env-file`` passes a file's values) and returns
frozen settings. Unparsable values fall back to the default, as the Go controller does, and each one is
reported through ``warn`` (the manager and ``render`` log a warning naming the variable, the value and the
default); without ``warn`` they are a ``ConfigError``. ``FLASH_LOADER_ENV_VARS`` and ``ENV_VARS`` list every
variable read here so documentation can be generated from them.

Used by ``flexinfer.core.flashloader_settings``, ``flexinfer serve`` (``flexinfer.local.config``: the
flash-loader defaults), the manifest renderer (``flexinfer.core.manifests.render*``), the
manager (``flexinfer.manager.config``, ``flexinfer.manager.reconciler``), ``flexinfer render`` and the generated
configuration reference (``flexinfer.assembly.reference``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from flexinfer import __version__
from flexinfer.core.envvalues import EnvReader, EnvVar, Kind, Policy, Warn
from flexinfer.core.profiles import BACKENDS

FLEXINFER_IMAGE_REPOSITORY = "ghcr.io/flexinfer/flexinfer"
"""The FlexInfer image; it also serves as the flash-loader image (``flexinfer flash-load``)."""

FLEXINFER_IMAGE = f"{FLEXINFER_IMAGE_REPOSITORY}:{__version__}"
DEFAULT_SHM_SIZE_LIMIT = "8Gi"
DEFAULT_FLASH_CONCURRENCY = 4
DEFAULT_FLASH_BUFFER_KB = 4096
DEFAULT_MODEL_IMAGE_PULL_POLICY = "Always"
PULL_POLICIES = ("Always", "IfNotPresent", "Never")


FALLBACK = Policy.FALLBACK
FLASH_LOADER_ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar("DEFAULT_FLASH_LOADER_ENABLED", "false",
           "Enable the flash-loader for every model with a persistent volume (1/true/yes/on, 0/false/no/off).",
           Kind.BOOL, FALLBACK),
    EnvVar("DEFAULT_FLASH_LOADER_CONCURRENCY", str(DEFAULT_FLASH_CONCURRENCY),
           "Parallel copy workers (positive integer).", Kind.INT, FALLBACK),
    EnvVar("DEFAULT_FLASH_LOADER_BUFFER_KB", str(DEFAULT_FLASH_BUFFER_KB),
           "Copy buffer size in KiB (positive integer).", Kind.INT, FALLBACK),
    EnvVar("DEFAULT_FLASH_LOADER_VERIFY", "false", "Verify file sizes after staging (bool word).", Kind.BOOL, FALLBACK),
    EnvVar("DEFAULT_FLASH_LOADER_EXCLUDE", "",
           "Comma-separated path prefixes the flash-loader skips (always plus .cache/ and .git/)."),
    EnvVar("DEFAULT_FLASH_LOADER_TMPFS_SIZE_LIMIT", "",
           "sizeLimit of the non-shared flash tmpfs (Kubernetes quantity; empty = no limit); under `serve`, the "
           "most a non-shared model's staged copy may take.", Kind.QUANTITY, FALLBACK),
    EnvVar("DEFAULT_FLASH_LOADER_MAX_RATE", "",
           "Largest copy rate of each flash-loader, bytes per second (quantity, e.g. 200Mi; empty = unlimited).",
           Kind.QUANTITY, FALLBACK),
)
"""The flash-loader defaults (layer 1 of spec §2.2), read by the manager and by ``flexinfer serve`` alike."""

ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar("DEFAULT_SHM_SIZE_LIMIT", DEFAULT_SHM_SIZE_LIMIT,
           "sizeLimit of the /dev/shm memory emptyDir of every model pod (Kubernetes quantity).",
           Kind.QUANTITY, FALLBACK),
    EnvVar("FLEXINFER_FLASH_LOADER_IMAGE", FLEXINFER_IMAGE,
           "Package default flash-loader image (used when DEFAULT_FLASH_LOADER_IMAGE is unset)."),
    EnvVar("DEFAULT_FLASH_LOADER_IMAGE", "value of FLEXINFER_FLASH_LOADER_IMAGE",
           "Flash-loader init container image."),
    EnvVar("DEFAULT_<BACKEND>_IMAGE", "built-in per backend and runtime profile",
           "Image override for one backend, e.g. DEFAULT_VLLM_IMAGE or DEFAULT_MLC_LLM_IMAGE."),
    EnvVar("DEFAULT_MODEL_IMAGE_PULL_POLICY", DEFAULT_MODEL_IMAGE_PULL_POLICY,
           "imagePullPolicy of the model server container: Always, IfNotPresent or Never.", Kind.CHOICE),
)
"""The other controller defaults: the manager's only (images and pod shape)."""


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
    max_rate: str | None = None


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


def controller_defaults(env: Mapping[str, str], backends: tuple[str, ...] | None = None, *,
                        warn: Warn | None = None) -> ControllerDefaults:
    """Parse the controller environment; image overrides are read for ``backends`` (default: all known).

    Unparsable values use the default and are reported through ``warn``; without it they raise ``ConfigError``.
    """
    names = tuple(BACKENDS) if backends is None else backends
    images = {name: env[backend_image_env_name(name)].strip() for name in names
              if env.get(backend_image_env_name(name), "").strip()}
    reader = EnvReader(env, warn)
    return ControllerDefaults(
        shm_size_limit=reader.quantity("DEFAULT_SHM_SIZE_LIMIT", DEFAULT_SHM_SIZE_LIMIT, FALLBACK)
        or DEFAULT_SHM_SIZE_LIMIT,
        flash_loader=flash_loader_defaults(env, warn=warn),
        backend_images=MappingProxyType(images),
        model_image_pull_policy=reader.choice("DEFAULT_MODEL_IMAGE_PULL_POLICY", PULL_POLICIES,
                                              DEFAULT_MODEL_IMAGE_PULL_POLICY, Policy.STRICT),
    )


def flash_loader_defaults(env: Mapping[str, str], *, warn: Warn | None = None) -> FlashLoaderDefaults:
    """The ``DEFAULT_FLASH_LOADER_*`` variables with the Go rules (unparsable → default, reported to ``warn``)."""
    reader = EnvReader(env, warn)
    package_image = reader.text("FLEXINFER_FLASH_LOADER_IMAGE", FLEXINFER_IMAGE)
    return FlashLoaderDefaults(
        enabled=reader.flag("DEFAULT_FLASH_LOADER_ENABLED", False, FALLBACK),
        image=reader.text("DEFAULT_FLASH_LOADER_IMAGE", package_image),
        concurrency=reader.integer("DEFAULT_FLASH_LOADER_CONCURRENCY", DEFAULT_FLASH_CONCURRENCY, FALLBACK, minimum=1),
        buffer_size_kb=reader.integer("DEFAULT_FLASH_LOADER_BUFFER_KB", DEFAULT_FLASH_BUFFER_KB, FALLBACK, minimum=1),
        verify_integrity=reader.flag("DEFAULT_FLASH_LOADER_VERIFY", False, FALLBACK),
        exclude_patterns=reader.text("DEFAULT_FLASH_LOADER_EXCLUDE"),
        tmpfs_size_limit=reader.quantity("DEFAULT_FLASH_LOADER_TMPFS_SIZE_LIMIT", None, FALLBACK),
        max_rate=reader.quantity("DEFAULT_FLASH_LOADER_MAX_RATE", None, FALLBACK),
    )
