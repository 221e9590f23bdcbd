"""Flash-loader settings: what to copy where, and how.

``from_env`` turns the ``FLASH_*`` environment (a plain mapping, read once by ``flexinfer.settings``) into a
``StageRequest``. ``flexinfer flash-load`` (``flexinfer.cli.flash_load``) overlays its flags on that mapping
first, so flags and env share one parser; the local engine builds ``StageSettings`` directly.
Parsing goes through ``flexinfer.core.envvalues.EnvReader`` with the Go rules: an unparsable number or bool
falls back to the default and is logged as a warning naming the variable; a missing source/destination and an
unknown variant are errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from flexinfer import settings as process_settings
from flexinfer.api import conventions
from flexinfer.core.envvalues import EnvReader, EnvVar, Kind, Policy, Warn
from flexinfer.core.errors import ConfigError

ENV_SRC = conventions.FLASH_SRC
ENV_DST = conventions.FLASH_DST
ENV_CONCURRENCY = conventions.FLASH_CONCURRENCY
ENV_BUFFER_KB = conventions.FLASH_BUFFER_KB
ENV_VERIFY = conventions.FLASH_VERIFY
ENV_EXCLUDE = conventions.FLASH_EXCLUDE
ENV_VARIANT = conventions.FLASH_VARIANT
ENV_MAX_RATE = conventions.FLASH_MAX_RATE

DEFAULT_CONCURRENCY = 4
DEFAULT_BUFFER_KB = 4096
DEFAULT_CHUNK_BYTES = 256 * 1024 * 1024
CACHE_PATTERN = ".cache/"
ALWAYS_EXCLUDED = (CACHE_PATTERN, ".git/")
"""Always skipped; under ``.cache/`` the Hugging Face hub cache (``.cache/huggingface/hub/``) is still staged."""
VARIANTS = ("fp16",)
TMP_SUFFIX = ".flash-tmp"

ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar(ENV_SRC, "(required)", "Directory (or file) holding the model weights; `--src`."),
    EnvVar(ENV_DST, "(required)", "Destination directory on tmpfs; `--dst`."),
    EnvVar(ENV_CONCURRENCY, str(DEFAULT_CONCURRENCY),
           "Copy threads (capped at the CPUs available); `--concurrency`.", Kind.INT, Policy.FALLBACK),
    EnvVar(ENV_BUFFER_KB, str(DEFAULT_BUFFER_KB), "Copy chunk size in KiB; `--buffer-kb`.", Kind.INT, Policy.FALLBACK),
    EnvVar(ENV_VERIFY, "false", "Verify every staged file by size and BLAKE2b checksum; `--verify`.",
           Kind.BOOL, Policy.FALLBACK),
    EnvVar(ENV_EXCLUDE, "", "Comma-separated path prefixes to skip (always plus .cache/ and .git/); `--exclude`."),
    EnvVar(ENV_VARIANT, "", "`fp16`: prefer `X.fp16.safetensors` over `X.safetensors`; `--variant`.", Kind.CHOICE),
    EnvVar(ENV_MAX_RATE, "0", "Largest copy rate in bytes per second, a number or a quantity (`200Mi`): spares a "
           "shared source volume; 0 = unlimited; `--max-rate`.", Kind.QUANTITY, Policy.FALLBACK),
)


@dataclass(frozen=True)
class StageSettings:
    """How to stage. ``exclude`` always contains ``ALWAYS_EXCLUDED`` (``with_defaults`` guarantees it).

    ``chunk_bytes``: files larger than this are split into ranges of this size so one big shard keeps
    every worker busy. ``variant``: ``"fp16"`` prefers ``X.fp16.safetensors`` over ``X.safetensors``.
    ``max_rate``: the copy's byte rate cap (bytes per second; 0 = none; ``flexinfer.flashloader.pacing``).
    """

    concurrency: int = DEFAULT_CONCURRENCY
    buffer_kb: int = DEFAULT_BUFFER_KB
    verify: bool = False
    exclude: tuple[str, ...] = ALWAYS_EXCLUDED
    variant: str | None = None
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    max_rate: int = 0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigError(f"concurrency must be at least 1, got {self.concurrency}")
        if self.buffer_kb < 1:
            raise ConfigError(f"buffer size must be at least 1 KiB, got {self.buffer_kb}")
        if self.chunk_bytes < 1:
            raise ConfigError(f"chunk size must be positive, got {self.chunk_bytes}")
        if self.max_rate < 0:
            raise ConfigError(f"the rate cap must not be negative, got {self.max_rate}")
        if self.variant is not None and self.variant not in VARIANTS:
            raise ConfigError(f"{ENV_VARIANT}: unknown variant {self.variant!r}; accepted: '' or {', '.join(VARIANTS)}")
        object.__setattr__(self, "exclude", merge_excludes(self.exclude))

    @property
    def buffer_bytes(self) -> int:
        return self.buffer_kb * 1024


@dataclass(frozen=True)
class StageRequest:
    """A complete staging job: source directory, destination directory, settings."""

    src: Path
    dst: Path
    settings: StageSettings = field(default_factory=StageSettings)


def merge_excludes(patterns: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """User patterns (trimmed, empties dropped, order kept, no duplicates) plus ``ALWAYS_EXCLUDED``."""
    merged: list[str] = []
    for raw in (*patterns, *ALWAYS_EXCLUDED):
        pattern = raw.strip()
        if pattern and pattern not in merged:
            merged.append(pattern)
    return tuple(merged)


def parse_exclude(value: str | None) -> tuple[str, ...]:
    """``FLASH_EXCLUDE``: a comma list, merged with ``ALWAYS_EXCLUDED``."""
    return merge_excludes((value or "").split(","))


def parse_variant(value: str | None) -> str | None:
    """``FLASH_VARIANT``: empty → none; ``fp16`` (any case); anything else is a ``ConfigError``."""
    word = (value or "").strip().lower()
    if not word:
        return None
    if word not in VARIANTS:
        raise ConfigError(f"{ENV_VARIANT}: unknown variant {value!r}; accepted: '' or {', '.join(VARIANTS)}")
    return word


def required_path(env: Mapping[str, str], name: str) -> Path:
    """A required directory setting; missing or blank → ``ConfigError`` naming the variable and flag."""
    value = (env.get(name) or "").strip()
    if not value:
        flag = "--" + name.removeprefix("FLASH_").lower()
        raise ConfigError(f"{name} is required (set the environment variable or pass {flag})")
    return Path(value)


def settings_from_env(env: Mapping[str, str], warn: Warn | None = process_settings.warn) -> StageSettings:
    """The ``StageSettings`` part of the ``FLASH_*`` environment (no paths needed); unparsable numbers and
    bools use the default and go to ``warn``."""
    read = EnvReader(env, warn)
    return StageSettings(
        concurrency=read.integer(ENV_CONCURRENCY, DEFAULT_CONCURRENCY, Policy.FALLBACK, minimum=1),
        buffer_kb=read.integer(ENV_BUFFER_KB, DEFAULT_BUFFER_KB, Policy.FALLBACK, minimum=1),
        verify=read.flag(ENV_VERIFY, False, Policy.FALLBACK),
        exclude=parse_exclude(env.get(ENV_EXCLUDE)),
        variant=parse_variant(env.get(ENV_VARIANT)),
        max_rate=read.size(ENV_MAX_RATE, 0, Policy.FALLBACK),
    )


def from_env(env: Mapping[str, str], warn: Warn | None = process_settings.warn) -> StageRequest:
    """``FLASH_SRC``/``FLASH_DST`` (required) plus the optional settings → a ``StageRequest``."""
    return StageRequest(
        src=required_path(env, ENV_SRC), dst=required_path(env, ENV_DST), settings=settings_from_env(env, warn),
    )
