"""GPU profiles of the Kubernetes engine: which shared groups pack several models by memory, and their budget.

Go FlexInfer declares, per GPU architecture, a ``GPUProfile`` whose ``spec.vramMB`` is the usable memory of the
card and whose ``spec.features.multiModel`` lets a shared group on that architecture keep several members Active
at once (spec §3.3). The manager takes the same fields from ``FLEXINFER_GPU_PROFILES`` (the chart's
``controller.gpuProfiles``), a JSON list of GPUProfile specs::

    [{"architecture": "gfx1100", "vendor": "amd", "vramMB": 24576, "features": {"multiModel": true}}]

``parse_gpu_profiles`` reads that text (a ``ConfigError`` names the entry and field of a bad value);
``group_budget`` answers for one group: ``None`` when the group runs one model at a time (no profile for its
architecture, ``multiModel`` off, or members of different architectures), else the budget in MiB, where a
``vramMB`` of 0 or less means no limit (Go's rule). A member's architecture is that of its runtime profile
(``spec.config.runtimeProfile``, else by ``gpu.vendor``: ``gfx1100``, ``nvidia`` or ``cpu``). Pure; the manager's
settings (``flexinfer.manager.config``) parse, the reconcile plan (``flexinfer.core.unit_plan``) asks.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from flexinfer.api.model import Model
from flexinfer.core.errors import ConfigError
from flexinfer.core.profiles import runtime_profile

ARCHITECTURES: Final[dict[str, str]] = {"rocm-gfx1100": "gfx1100", "nvidia": "nvidia", "cpu": "cpu"}
"""The architecture each runtime profile (``flexinfer.core.profiles.PROFILES``) runs on."""
UNLIMITED: Final = math.inf


@dataclass(frozen=True)
class GPUProfile:
    """The fields of a Go ``GPUProfile.spec`` that the election reads."""

    architecture: str
    vram_mb: int
    multi_model: bool = False
    vendor: str = ""


def parse_gpu_profiles(text: str, where: str = "FLEXINFER_GPU_PROFILES") -> tuple[GPUProfile, ...]:
    """The profiles in ``text`` (a JSON list; empty text = none); ``ConfigError`` naming ``where`` and the field."""
    if not text.strip():
        return ()
    try:
        data = json.loads(text)
    except ValueError as error:
        raise ConfigError(f"{where}: not JSON ({error})") from None
    if not isinstance(data, list):
        raise ConfigError(f"{where}: expected a JSON list of GPUProfile specs, got {type(data).__name__}")
    profiles = tuple(_profile(entry, f"{where}[{index}]") for index, entry in enumerate(data))
    seen: set[str] = set()
    for profile in profiles:
        if profile.architecture in seen:
            raise ConfigError(f"{where}: architecture {profile.architecture!r} is given twice")
        seen.add(profile.architecture)
    return profiles


def _profile(entry: Any, where: str) -> GPUProfile:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected an object, got {type(entry).__name__}")
    unknown = sorted(set(entry) - {"architecture", "vendor", "vramMB", "features"})
    if unknown:
        raise ConfigError(f"{where}: unknown field {unknown[0]!r} (known: architecture, vendor, vramMB, features)")
    architecture = entry.get("architecture")
    if not isinstance(architecture, str) or not architecture.strip():
        raise ConfigError(f"{where}.architecture: expected a non-empty string (gfx1100, nvidia, cpu)")
    vram = entry.get("vramMB")
    if isinstance(vram, bool) or not isinstance(vram, int):
        raise ConfigError(f"{where}.vramMB: expected an integer number of MiB, got {vram!r}")
    vendor = entry.get("vendor", "")
    if not isinstance(vendor, str):
        raise ConfigError(f"{where}.vendor: expected a string, got {vendor!r}")
    features = entry.get("features", {})
    if not isinstance(features, dict):
        raise ConfigError(f"{where}.features: expected an object, got {type(features).__name__}")
    multi = features.get("multiModel", False)
    if not isinstance(multi, bool):
        raise ConfigError(f"{where}.features.multiModel: expected true or false, got {multi!r}")
    return GPUProfile(architecture.strip(), vram, multi, vendor)


def architecture(model: Model) -> str | None:
    """The architecture ``model`` runs on (``None`` for an unknown runtime profile: the model is rejected)."""
    try:
        return ARCHITECTURES.get(runtime_profile(model).name)
    except ConfigError:
        return None


def group_budget(profiles: Sequence[GPUProfile], members: Iterable[Model]) -> float | None:
    """The memory budget (MiB; ``UNLIMITED`` for ``vramMB`` <= 0) of a group whose members run on one architecture
    with a ``multiModel`` profile; ``None``: the group runs one model at a time."""
    if not profiles:
        return None
    arches = {architecture(m) for m in members}
    if len(arches) != 1:
        return None
    arch = arches.pop()
    profile = next((p for p in profiles if p.architecture == arch), None)
    if profile is None or not profile.multi_model:
        return None
    return float(profile.vram_mb) if profile.vram_mb > 0 else UNLIMITED
