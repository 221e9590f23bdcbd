"""GPU discovery through the vendors' Python bindings, when installed (the optional extras).

``flexinfer[rocm]`` installs ``amdsmi`` (AMD SMI); ``flexinfer[nvidia]`` installs ``nvidia-ml-py`` (module
``pynvml``, NVML). Each reader returns ``None`` when its binding is missing or cannot reach the driver
library (no ROCm / NVIDIA driver on this machine), so ``flexinfer.local.gpu_discovery`` falls back to the
CLI tools (``rocm-smi``, ``nvidia-smi``). Device indices are the ones the runtimes use in
``HIP_VISIBLE_DEVICES`` (AMD SMI's ``hip_id``, else enumeration order) and ``CUDA_VISIBLE_DEVICES`` (the NVML
index, as ``nvidia-smi`` numbers it).

``process_vram_mib`` reads what a set of processes (a model server's process group) holds on the GPUs: NVML's
compute processes (``usedGpuMemory``; graphics contexts are left out, since NVML reports a process's whole usage
in each list it appears in) and AMD SMI's process list (``memory_usage.vram_mem``: a list of dicts in recent
``amdsmi``, process handles read with ``amdsmi_get_gpu_process_info`` in older ones). The local engine reports it
as the measured need of a GPU model whose server logs no buffer sizes.

The calls block, so callers run them in a thread.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

from flexinfer.core.memory_need import MIB

T = TypeVar("T")
log = logging.getLogger(__name__)

AMD_BINDING = "amdsmi"
NVIDIA_BINDING = "pynvml"


@dataclass(frozen=True)
class Gpu:
    """One GPU: vendor (``amd``/``nvidia``), device index as the runtime numbers it, name, memory if known."""

    vendor: str
    index: int
    name: str
    memory_mb: int | None = None


def load(name: str) -> ModuleType | None:
    """The binding module, or ``None`` when it is not installed or fails to load (``amdsmi`` raises at
    import time when ``libamd_smi.so`` is absent)."""
    try:
        return importlib.import_module(name)
    except Exception as exc:
        log.debug("GPU binding %s unavailable: %s", name, exc)
        return None


def amd_gpus() -> list[Gpu] | None:
    """AMD GPUs through ``amdsmi``; ``None`` when the binding or the ROCm library is unavailable."""
    return _ask(AMD_BINDING, "amdsmi_init", "amdsmi_shut_down", _amd_gpus,
                failure="amdsmi could not list GPUs (%s); trying rocm-smi")


def _amd_gpus(smi: Any) -> list[Gpu]:
    handles = smi.amdsmi_get_processor_handles()
    return sorted((_amd_gpu(smi, position, handle) for position, handle in enumerate(handles)),
                  key=lambda gpu: gpu.index)


def _amd_gpu(smi: Any, position: int, handle: object) -> Gpu:
    asic = smi.amdsmi_get_gpu_asic_info(handle)
    name = str(asic.get("market_name") or "")
    index = position
    with contextlib.suppress(Exception):  # older amdsmi has no enumeration info
        hip_id = smi.amdsmi_get_gpu_enumeration_info(handle).get("hip_id")
        index = hip_id if isinstance(hip_id, int) else position
    memory: int | None = None
    with contextlib.suppress(Exception):
        size = smi.amdsmi_get_gpu_vram_info(handle).get("vram_size")
        memory = size if isinstance(size, int) and size > 0 else None
    return Gpu("amd", index, name if name and name != "N/A" else f"AMD GPU {index}", memory)


def nvidia_gpus() -> list[Gpu] | None:
    """NVIDIA GPUs through NVML (``pynvml``); ``None`` when the binding or the driver library is unavailable."""
    return _ask(NVIDIA_BINDING, "nvmlInit", "nvmlShutdown", _nvidia_gpus,
                failure="NVML could not list GPUs (%s); trying nvidia-smi")


def _nvidia_gpus(nvml: Any) -> list[Gpu]:
    gpus = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        name = nvml.nvmlDeviceGetName(handle)
        name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        total = nvml.nvmlDeviceGetMemoryInfo(handle).total
        gpus.append(Gpu("nvidia", index, name, int(total) // (1024 * 1024) if total else None))
    return gpus


def process_vram_mib(pids: Collection[int]) -> float | None:
    """The device memory processes ``pids`` hold on every GPU either binding sees, in MiB; ``None`` when no
    binding answers or ``pids`` show none there (a figure the binding does not know is skipped: NVML's
    ``usedGpuMemory`` is ``None`` under Windows' WDDM)."""
    wanted = frozenset(pids)
    if not wanted:
        return None
    readings = [_ask(NVIDIA_BINDING, "nvmlInit", "nvmlShutdown", lambda nvml: _nvidia_process_bytes(nvml, wanted),
                     failure="NVML could not list GPU processes (%s)", level=logging.DEBUG),
                _ask(AMD_BINDING, "amdsmi_init", "amdsmi_shut_down", lambda smi: _amd_process_bytes(smi, wanted),
                     failure="amdsmi could not list GPU processes (%s)", level=logging.DEBUG)]
    total = sum(used for used in readings if used is not None)
    return total / MIB if total > 0 else None


def _nvidia_process_bytes(nvml: Any, wanted: frozenset[int]) -> int:
    """The bytes ``wanted``'s compute contexts hold on every NVIDIA GPU."""
    used = (process.usedGpuMemory
            for index in range(nvml.nvmlDeviceGetCount())
            for process in nvml.nvmlDeviceGetComputeRunningProcesses(nvml.nvmlDeviceGetHandleByIndex(index))
            if process.pid in wanted)
    return _known_sum(used)


def _amd_process_bytes(smi: Any, wanted: frozenset[int]) -> int:
    """The VRAM bytes ``wanted`` hold on every AMD GPU (either shape of ``amdsmi_get_gpu_process_list``)."""
    used = []
    for handle in smi.amdsmi_get_processor_handles():
        for item in smi.amdsmi_get_gpu_process_list(handle):
            info = item if isinstance(item, dict) else smi.amdsmi_get_gpu_process_info(handle, item)
            if info.get("pid") in wanted:
                used.append((info.get("memory_usage") or {}).get("vram_mem"))
    return _known_sum(used)


def _known_sum(used: Iterable[object]) -> int:
    """The sum of the byte counts that are known."""
    return sum(value for value in used if isinstance(value, int) and value >= 0)


def _ask(binding: str, init: str, shut_down: str, read: Callable[[Any], T], *, failure: str,
         level: int = logging.WARNING) -> T | None:
    """Load ``binding``, call its ``init``, ``read`` from it and always call ``shut_down``; ``None`` when any step
    fails (logging ``failure`` with the error at ``level`` when the read does)."""
    module = load(binding)
    if module is None:
        return None
    try:
        getattr(module, init)()
    except Exception as exc:
        log.debug("%s failed: %s", init, exc)
        return None
    try:
        return read(module)
    except Exception as exc:
        log.log(level, failure, exc)
        return None
    finally:
        with contextlib.suppress(Exception):
            getattr(module, shut_down)()
