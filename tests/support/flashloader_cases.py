"""The flash-loader precedence table (spec §2.2): one row per case, shared by the core resolution test and the
test that both engines (the manifest renderer, ``flexinfer serve``) resolve every row alike.

Each row names its case; ``expected`` lists only the fields that case is about. ``env`` is the controller
environment, ``model`` the Model's spec overrides (named ``m``, source ``HF://org/model`` unless given),
``caches`` the ModelCaches in list order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flexinfer.api.model import Model
from flexinfer.api.modelcache import ModelCache
from flexinfer.core.controller_defaults import FLEXINFER_IMAGE
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


def case_model(case: Case) -> Model:
    """The row's Model."""
    return make_model(name="m", source=case.model.get("source", "HF://org/model"),
                      **{k: v for k, v in case.model.items() if k != "source"})
