"""Optional GPU discovery: which AMD/NVIDIA GPUs this machine has, and which devices a model may see.

Each vendor is asked through its Python binding when installed (``flexinfer.local.gpu_bindings``:
``amdsmi``, ``pynvml``), else through its CLI tool: pure parsers for ``rocm-smi --showid --json`` and
``nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader`` output; ``discover`` runs the
tools that exist on ``path`` (bounded by a timeout, failures are "no GPUs"); ``device_env`` picks
``HIP_VISIBLE_DEVICES``/``CUDA_VISIBLE_DEVICES`` for a model, or returns a warning when the machine lacks
the GPU the model names (the model still runs). Used by ``flexinfer.local.engine``."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from flexinfer.api.model import Model
from flexinfer.local.gpu_bindings import Gpu, amd_gpus, nvidia_gpus

log = logging.getLogger(__name__)

ROCM_SMI = ("rocm-smi", "--showid", "--json")
NVIDIA_SMI = ("nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader")
VISIBLE_DEVICES = {"amd": "HIP_VISIBLE_DEVICES", "nvidia": "CUDA_VISIBLE_DEVICES"}
TOOL_TIMEOUT = 5.0
_CARD = re.compile(r"^card(\d+)$")
_NAME_KEYS = ("Card Series", "Device Name", "Card series", "Card model", "Card SKU", "GPU ID", "Device ID")


def parse_rocm_smi(text: str) -> list[Gpu]:
    """GPUs from ``rocm-smi --showid --json`` (``{"card0": {"Device Name": ..., "Device ID": ...}}``)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return []
    if not isinstance(data, dict):
        return []
    gpus = []
    for key, fields in data.items():
        match = _CARD.match(str(key))
        if match is None or not isinstance(fields, dict):
            continue
        name = next((str(fields[k]) for k in _NAME_KEYS if fields.get(k)), f"AMD GPU {match.group(1)}")
        gpus.append(Gpu("amd", int(match.group(1)), name))
    return sorted(gpus, key=lambda g: g.index)


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """GPUs from ``nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader`` lines."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2 or not parts[0].isdigit():
            continue
        memory = parts[2].split()[0] if len(parts) > 2 and parts[2] else ""
        gpus.append(Gpu("nvidia", int(parts[0]), parts[1], int(memory) if memory.isdigit() else None))
    return gpus


@dataclass(frozen=True)
class DeviceChoice:
    """Environment to add to the model server, and a warning for the operator when the GPU is missing."""

    env: Mapping[str, str]
    warning: str | None = None


def device_env(model: Model, gpus: Sequence[Gpu]) -> DeviceChoice:
    """Pin the model to the first ``gpu_count`` devices of its vendor; warn (and pin nothing) if absent."""
    vendor, count = model.gpu_vendor, model.gpu_count
    if vendor == "cpu" or count == 0:
        return DeviceChoice({})
    candidates = [g for g in gpus if vendor in ("auto", g.vendor)]
    if not candidates:
        wanted = "a GPU" if vendor == "auto" else f"an {vendor.upper()} GPU"
        return DeviceChoice({}, f"model {model.key} asks for {wanted} but none was found on this machine; "
                                f"running it without GPU pinning")
    chosen = pinned_gpus(model, gpus)
    chosen_vendor = chosen[0].vendor
    warning = None
    if len(chosen) < count:
        warning = f"model {model.key} asks for {count} GPUs but this machine has {len(chosen)}; using those"
    devices = ",".join(str(g.index) for g in chosen)
    return DeviceChoice({VISIBLE_DEVICES[chosen_vendor]: devices}, warning)


def pinned_gpus(model: Model, gpus: Sequence[Gpu]) -> list[Gpu]:
    """The devices ``device_env`` pins the model to: the first ``gpu_count`` of the first vendor it may use
    (empty for a CPU model, or when the machine has no such GPU)."""
    if model.gpu_vendor == "cpu" or model.gpu_count == 0:
        return []
    candidates = [g for g in gpus if model.gpu_vendor in ("auto", g.vendor)]
    return [g for g in candidates if g.vendor == candidates[0].vendor][:model.gpu_count] if candidates else []


async def run_tool(argv: Sequence[str], path: str | None, timeout: float = TOOL_TIMEOUT) -> str:
    """stdout of a discovery tool, or ``""`` if it is not installed, fails or hangs."""
    executable = shutil.which(argv[0], path=path)
    if executable is None:
        return ""
    try:
        proc = await asyncio.create_subprocess_exec(
            executable, *argv[1:], stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
    except OSError:
        return ""
    try:
        async with asyncio.timeout(timeout):
            out, _ = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        log.warning("%s did not answer within %.0fs; assuming no GPUs", argv[0], timeout)
        return ""
    return out.decode(errors="replace") if proc.returncode == 0 else ""


async def discover(path: str | None = None) -> list[Gpu]:
    """Every AMD and NVIDIA GPU, each vendor through its binding or else its tool (empty when neither is there)."""
    amd, nvidia = await asyncio.gather(ask_vendor(amd_gpus, ROCM_SMI, parse_rocm_smi, path),
                                       ask_vendor(nvidia_gpus, NVIDIA_SMI, parse_nvidia_smi, path))
    return amd + nvidia


async def ask_vendor(binding: Callable[[], list[Gpu] | None], tool: Sequence[str],
                     parse: Callable[[str], list[Gpu]], path: str | None) -> list[Gpu]:
    """The binding's answer (in a thread, bounded by ``TOOL_TIMEOUT``), else the CLI tool's parsed output."""
    try:
        async with asyncio.timeout(TOOL_TIMEOUT):
            found = await asyncio.to_thread(binding)
    except TimeoutError:
        log.warning("%s did not answer within %.0fs; trying %s", binding.__name__, TOOL_TIMEOUT, tool[0])
        found = None
    if found is not None:
        return found
    return parse(await run_tool(tool, path))


class GpuInventory:
    """Discovers once, on first need (only models that ask for a GPU trigger it), then remembers."""

    def __init__(self, path: str | None = None, known: Sequence[Gpu] | None = None) -> None:
        self._path = path
        self._gpus: list[Gpu] | None = list(known) if known is not None else None
        self._lock = asyncio.Lock()

    async def gpus(self) -> list[Gpu]:
        """The machine's GPUs."""
        async with self._lock:
            if self._gpus is None:
                self._gpus = await discover(self._path)
                log.info("GPU discovery: %s", ", ".join(f"{g.vendor}:{g.index} {g.name}" for g in self._gpus)
                         or "no GPUs")
            return self._gpus

    async def device_env(self, model: Model) -> DeviceChoice:
        """``device_env`` for ``model`` (no discovery for CPU models)."""
        if model.gpu_vendor == "cpu" or model.gpu_count == 0:
            return DeviceChoice({})
        return device_env(model, await self.gpus())
