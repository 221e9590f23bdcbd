"""Flash-loader settings resolution: which Models get the weight-staging init container, and how.

Precedence (spec §2.2), lowest to highest:

1. controller env defaults (``ControllerDefaults.flash_loader``);
2. the first matching v1alpha1 ``ModelCache`` with a ``spec.flashLoader`` block — its ``enabled`` is
   taken as is (a block without ``enabled: true`` disables), ``image`` if non-blank, ``concurrency`` if
   > 0, ``tmpfsSizeLimit`` if parsable;
3. ``Model.spec.cache.flashLoader`` — each field only when set;
4. auto-enable: ``spec.cache`` present, no ``spec.cache.flashLoader``, shared model, strategy ``Local``;
5. normalisation (concurrency < 1 → 4, buffer < 32 → 4096) and the gate: no persistent volume → disabled.

Both engines resolve through ``resolve_flash_loader``: the manifest renderer (``flexinfer.core.manifests.render``)
for the manager and ``flexinfer render``, and ``flexinfer serve`` (``flexinfer.local.flash_settings``) with the same
environment defaults and the ModelCache manifests loaded beside its Models. ``staging_variables`` is what the
flash-loader receives for a resolved config (the init container's ``FLASH_*`` environment; the local engine
parses the same mapping). The manager's store and reconciler use ``cache_matches_model`` to find the ModelCache
a Model takes its settings from. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from flexinfer.api import conventions
from flexinfer.api.model import FlashLoaderSpec, Model
from flexinfer.api.modelcache import CacheFlashLoaderSpec, ModelCache
from flexinfer.core.cache_strategy import effective_cache_strategy, uses_persistent_volume
from flexinfer.core.controller_defaults import (
    DEFAULT_FLASH_BUFFER_KB,
    DEFAULT_FLASH_CONCURRENCY,
    ControllerDefaults,
)
from flexinfer.core.envvalues import quantity_or_none

MIN_BUFFER_SIZE_KB = 32
HF_SCHEME = "hf://"


@dataclass(frozen=True)
class FlashLoaderConfig:
    """The resolved flash-loader settings of one Model."""

    enabled: bool
    image: str
    concurrency: int
    buffer_size_kb: int
    verify_integrity: bool
    exclude_patterns: str
    tmpfs_size_limit: str | None
    max_rate: str | None = None
    """Copy rate cap (``FLASH_MAX_RATE``), controller-wide only; ``None`` = unlimited."""


def staging_variables(model: Model, config: FlashLoaderConfig) -> dict[str, str]:
    """The ``FLASH_*`` staging settings (not the paths) the flash-loader gets for ``model``: concurrency, buffer,
    verification, exclusions, the ``fp16`` variant when ``spec.config.useFp16`` is the string ``"1"``, and the
    controller's copy rate cap when one is set."""
    return {
        conventions.FLASH_CONCURRENCY: str(config.concurrency),
        conventions.FLASH_BUFFER_KB: str(config.buffer_size_kb),
        conventions.FLASH_VERIFY: "true" if config.verify_integrity else "false",
        conventions.FLASH_EXCLUDE: config.exclude_patterns,
        conventions.FLASH_VARIANT: "fp16" if model.spec.config.get("useFp16") == "1" else "",
        **({conventions.FLASH_MAX_RATE: config.max_rate} if config.max_rate else {}),
    }


def cache_matches_model(cache: ModelCache, model: Model) -> bool:
    """Go ``matchingModelCache`` rule: HF source substring, or name == model, or name == ``<model>-cache``."""
    if cache.name in (model.name, f"{model.name}-cache"):
        return True
    source = model.spec.source
    if source.lower().startswith(HF_SCHEME):
        return source[len(HF_SCHEME):] in cache.spec.source
    return False


def matching_model_cache(model: Model, caches: Sequence[ModelCache]) -> ModelCache | None:
    """The first ModelCache (list order) in the Model's namespace with a flashLoader block that matches."""
    for cache in caches:
        if cache.namespace != model.namespace or cache.spec.flash_loader is None:
            continue
        if cache_matches_model(cache, model):
            return cache
    return None


def resolve_flash_loader(
    defaults: ControllerDefaults, model: Model, caches: Sequence[ModelCache] = (),
) -> FlashLoaderConfig:
    """Resolve the flash-loader settings of ``model`` (see the module docstring for the order)."""
    env = defaults.flash_loader
    config = FlashLoaderConfig(
        enabled=env.enabled, image=env.image, concurrency=env.concurrency, buffer_size_kb=env.buffer_size_kb,
        verify_integrity=env.verify_integrity, exclude_patterns=env.exclude_patterns,
        tmpfs_size_limit=env.tmpfs_size_limit, max_rate=env.max_rate,
    )
    cache = matching_model_cache(model, caches)
    if cache is not None:
        config = _apply_model_cache(config, cache)
    config = _apply_model_spec(config, model)
    if _auto_enables(model):
        config = replace(config, enabled=True)
    return _normalise(config, model)


def _apply_model_cache(config: FlashLoaderConfig, cache: ModelCache) -> FlashLoaderConfig:
    block = cache.spec.flash_loader
    assert block is not None  # matching_model_cache only returns caches with a block
    return _apply_shared_fields(replace(config, enabled=block.enabled), block)


def _apply_shared_fields(config: FlashLoaderConfig, block: CacheFlashLoaderSpec | FlashLoaderSpec) -> FlashLoaderConfig:
    """The fields both override layers may set: image (non-blank), concurrency (> 0), tmpfs (parsable)."""
    if block.image and block.image.strip():
        config = replace(config, image=block.image.strip())
    if block.concurrency is not None and block.concurrency > 0:
        config = replace(config, concurrency=block.concurrency)
    tmpfs = quantity_or_none(block.tmpfs_size_limit)
    if tmpfs is not None:
        config = replace(config, tmpfs_size_limit=tmpfs)
    return config


def _apply_model_spec(config: FlashLoaderConfig, model: Model) -> FlashLoaderConfig:
    block = model.spec.cache.flash_loader if model.spec.cache else None
    if block is None:
        return config
    if block.enabled is not None:
        config = replace(config, enabled=block.enabled)
    config = _apply_shared_fields(config, block)
    if block.buffer_size_kb is not None:
        config = replace(config, buffer_size_kb=block.buffer_size_kb)
    if block.verify_integrity is not None:
        config = replace(config, verify_integrity=block.verify_integrity)
    return config


def _auto_enables(model: Model) -> bool:
    cache = model.spec.cache
    return (
        cache is not None and cache.flash_loader is None and model.group is not None
        and effective_cache_strategy(model) == "Local"
    )


def _normalise(config: FlashLoaderConfig, model: Model) -> FlashLoaderConfig:
    if config.concurrency < 1:
        config = replace(config, concurrency=DEFAULT_FLASH_CONCURRENCY)
    if config.buffer_size_kb < MIN_BUFFER_SIZE_KB:
        config = replace(config, buffer_size_kb=DEFAULT_FLASH_BUFFER_KB)
    if not uses_persistent_volume(model):
        config = replace(config, enabled=False)
    return config
