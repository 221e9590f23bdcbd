"""Flash-loader precedence (spec §2.2): env defaults → matching ModelCache → Model, auto-enable, gate.

Each row of the table names its case; ``expected`` lists only the fields that case is about.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from flexinfer.api.modelcache import ModelCache
from flexinfer.core.controller_defaults import (
    FLEXINFER_IMAGE,
    ControllerDefaults,
    FlashLoaderDefaults,
    controller_defaults,
)
from flexinfer.core.flashloader_settings import cache_matches_model, matching_model_cache, resolve_flash_loader
from support.resource_builders import make_cache, make_model

ON = {"DEFAULT_FLASH_LOADER_ENABLED": "true"}
SHARED_LOCAL: dict[str, Any] = {"gpu": {"vendor": "amd", "shared": "g"}, "cache": {"strategy": "Local"}}


@dataclass(frozen=True)
class Case:
    name: str
    expected: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    caches: tuple[dict[str, Any], ...] = ()


CASES = [
    Case("global defaults: off, flexinfer image, 4 workers, 4096 KiB",
         {"enabled": False, "image": FLEXINFER_IMAGE, "concurrency": 4, "buffer_size_kb": 4096,
          "verify_integrity": False, "exclude_patterns": "", "tmpfs_size_limit": None}),
    Case("global enable applies to a SharedPVC model", {"enabled": True}, env=ON),
    Case("global settings flow through",
         {"enabled": True, "image": "reg/fl:2", "concurrency": 6, "buffer_size_kb": 1024, "verify_integrity": True,
          "exclude_patterns": "*.onnx", "tmpfs_size_limit": "16Gi"},
         env={**ON, "DEFAULT_FLASH_LOADER_IMAGE": "reg/fl:2", "DEFAULT_FLASH_LOADER_CONCURRENCY": "6",
              "DEFAULT_FLASH_LOADER_BUFFER_KB": "1024", "DEFAULT_FLASH_LOADER_VERIFY": "yes",
              "DEFAULT_FLASH_LOADER_EXCLUDE": "*.onnx", "DEFAULT_FLASH_LOADER_TMPFS_SIZE_LIMIT": "16Gi"}),
    Case("unparsable env tmpfs is ignored", {"tmpfs_size_limit": None},
         env={**ON, "DEFAULT_FLASH_LOADER_TMPFS_SIZE_LIMIT": "a lot"}),
    Case("ModelCache overrides image, concurrency and tmpfs",
         {"enabled": True, "image": "reg/cache-fl:1", "concurrency": 8, "tmpfs_size_limit": "12Gi"},
         caches=({"name": "m-cache", "flash_loader": {"enabled": True, "image": " reg/cache-fl:1 ", "concurrency": 8,
                                                     "tmpfsSizeLimit": "12Gi"}},)),
    Case("ModelCache does not override buffer, verify or exclude",
         {"buffer_size_kb": 2048, "verify_integrity": True, "exclude_patterns": "x/"},
         env={"DEFAULT_FLASH_LOADER_BUFFER_KB": "2048", "DEFAULT_FLASH_LOADER_VERIFY": "1",
              "DEFAULT_FLASH_LOADER_EXCLUDE": "x/"},
         caches=({"name": "m", "flash_loader": {"enabled": True}},)),
    Case("ModelCache block without enabled disables the global default", {"enabled": False, "concurrency": 8},
         env=ON, caches=({"name": "m", "flash_loader": {"concurrency": 8}},)),
    Case("ModelCache blank image keeps the default image", {"image": FLEXINFER_IMAGE},
         caches=({"name": "m", "flash_loader": {"enabled": True, "image": "  "}},)),
    Case("ModelCache matched by HF source substring", {"enabled": True, "concurrency": 3},
         caches=({"name": "other", "source": "huggingface://org/model", "flash_loader": {"enabled": True,
                                                                                      "concurrency": 3}},)),
    Case("ModelCache in another namespace is ignored", {"enabled": False},
         caches=({"name": "m", "namespace": "elsewhere", "flash_loader": {"enabled": True}},)),
    Case("ModelCache without flashLoader is skipped; first matching with one wins", {"concurrency": 5},
         caches=({"name": "m"}, {"name": "m-cache", "flash_loader": {"enabled": True, "concurrency": 5}},
                 {"name": "x", "source": "HF://org/model", "flash_loader": {"enabled": True, "concurrency": 7}})),
    Case("Model overrides every field it sets",
         {"enabled": True, "image": "reg/model-fl:3", "concurrency": 2, "tmpfs_size_limit": "20Gi",
          "buffer_size_kb": 64, "verify_integrity": True},
         caches=({"name": "m", "flash_loader": {"enabled": False, "concurrency": 8, "tmpfsSizeLimit": "12Gi"}},),
         model={"cache": {"flashLoader": {"enabled": True, "image": "reg/model-fl:3", "concurrency": 2,
                                          "tmpfsSizeLimit": "20Gi", "bufferSizeKB": 64, "verifyIntegrity": True}}}),
    Case("Model enabled false beats global enable", {"enabled": False}, env=ON,
         model={"cache": {"flashLoader": {"enabled": False}}}),
    Case("Model block without enabled keeps the lower layers' value", {"enabled": True, "concurrency": 9}, env=ON,
         model={"cache": {"flashLoader": {"concurrency": 9}}}),
    Case("Local + shared auto-enables without a flashLoader block", {"enabled": True}, model=SHARED_LOCAL),
    Case("Local + shared auto-enable beats a ModelCache that disabled it", {"enabled": True, "concurrency": 8},
         model=SHARED_LOCAL, caches=({"name": "m", "flash_loader": {"enabled": False, "concurrency": 8}},)),
    Case("Local + shared with explicit enabled false stays off", {"enabled": False},
         model={**SHARED_LOCAL, "cache": {"strategy": "Local", "flashLoader": {"enabled": False}}}),
    Case("Local + shared with a flashLoader block but no enabled is not auto-enabled", {"enabled": False},
         model={**SHARED_LOCAL, "cache": {"strategy": "Local", "flashLoader": {"concurrency": 2}}}),
    Case("Local without sharing is not auto-enabled", {"enabled": False}, model={"cache": {"strategy": "Local"}}),
    Case("SharedPVC + shared is not auto-enabled", {"enabled": False},
         model={"gpu": {"shared": "g"}, "cache": {"strategy": "SharedPVC"}}),
    Case("Memory never gets a loader, even when enabled everywhere", {"enabled": False}, env=ON,
         model={"cache": {"strategy": "Memory", "flashLoader": {"enabled": True}}},
         caches=({"name": "m", "flash_loader": {"enabled": True}},)),
    Case("None never gets a loader", {"enabled": False}, env=ON,
         model={"cache": {"strategy": "None", "flashLoader": {"enabled": True}}}),
    Case("shared without strategy defaults to Memory: no loader", {"enabled": False}, env=ON,
         model={"gpu": {"shared": "g"}}),
    Case("pvc:// source is persistent: loader allowed for a shared model", {"enabled": True}, env=ON,
         model={"source": "pvc://weights/m", "gpu": {"shared": "g"}}),
    Case("pvc:// source with strategy None still gets a loader", {"enabled": True}, env=ON,
         model={"source": "pvc://weights/m", "cache": {"strategy": "None"}}),
]


def build_cache(raw: dict[str, Any]) -> ModelCache:
    return make_cache(name=raw["name"], namespace=raw.get("namespace", "default"),
                      source=raw.get("source", "HF://unrelated/thing"), flash_loader=raw.get("flash_loader"))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_precedence(case: Case) -> None:
    model = make_model(name="m", source=case.model.get("source", "HF://org/model"),
                       **{k: v for k, v in case.model.items() if k != "source"})
    warnings: list[str] = []
    defaults = controller_defaults(case.env, warn=warnings.append)
    config = resolve_flash_loader(defaults, model, [build_cache(c) for c in case.caches])
    assert bool(warnings) is ("unparsable" in case.name)
    actual = {key: getattr(config, key) for key in case.expected}
    assert actual == case.expected


@pytest.mark.parametrize(("name", "defaults", "concurrency", "buffer"), [
    ("concurrency below 1 becomes 4", FlashLoaderDefaults(enabled=True, concurrency=0), 4, 4096),
    ("buffer below 32 KiB becomes 4096", FlashLoaderDefaults(enabled=True, buffer_size_kb=16), 4, 4096),
    ("valid values are kept", FlashLoaderDefaults(enabled=True, concurrency=2, buffer_size_kb=32), 2, 32),
])
def test_normalisation(name: str, defaults: FlashLoaderDefaults, concurrency: int, buffer: int) -> None:
    config = resolve_flash_loader(ControllerDefaults(flash_loader=defaults), make_model(), [])
    assert (config.concurrency, config.buffer_size_kb) == (concurrency, buffer), name


@pytest.mark.parametrize(("name", "model_source", "cache_name", "cache_source", "matches"), [
    ("same name", "HF://a/b", "m", "HF://x/y", True),
    ("<model>-cache name", "HF://a/b", "m-cache", "HF://x/y", True),
    ("HF source contained in cache source", "HF://a/b", "z", "huggingface://a/b", True),
    ("lower-case hf scheme also matches", "hf://a/b", "z", "HF://a/b", True),
    ("different HF source", "HF://a/b", "z", "HF://a/c", False),
    ("non-HF sources never match by source", "ollama://a:b", "z", "ollama://a:b", False),
    ("other name suffix", "HF://a/b", "m-cache-2", "HF://x/y", False),
])
def test_model_cache_match_rules(
    name: str, model_source: str, cache_name: str, cache_source: str, matches: bool,
) -> None:
    cache = make_cache(name=cache_name, source=cache_source, flash_loader={"enabled": True})
    assert cache_matches_model(cache, make_model(name="m", source=model_source)) is matches, name


def test_matching_model_cache_returns_none_without_candidates() -> None:
    assert matching_model_cache(make_model(name="m"), [make_cache(name="x")]) is None
