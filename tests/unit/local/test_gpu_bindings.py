"""GPU discovery through the vendors' bindings (amdsmi, pynvml) and the fall-back to the CLI tools.

No GPU exists here: the binding path runs against fake binding modules (fault injection), the fall-back
path against absent bindings, the real ``pynvml`` without a driver, and fake ``rocm-smi``/``nvidia-smi``
scripts on a private PATH. The per-process device memory (``process_vram_mib``) is read from the fake bindings'
process lists, for the pids of a real process group (``flexinfer.local.process_memory.group_pids``).
"""

from __future__ import annotations

import importlib.util
import os
import stat
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from flexinfer.core.memory_need import MIB
from flexinfer.local.gpu_bindings import Gpu, amd_gpus, nvidia_gpus, process_vram_mib
from flexinfer.local.gpu_discovery import discover
from flexinfer.local.process_memory import group_pids

CLI_GPUS = [Gpu("amd", 0, "Navi 31"), Gpu("nvidia", 0, "NVIDIA from smi", 24564)]


def fake_tools(directory: Path) -> str:
    """``rocm-smi`` and ``nvidia-smi`` scripts that print one GPU each; returns the PATH to use."""
    scripts = {"rocm-smi": """echo '{"card0": {"Device Name": "Navi 31"}}'""",
               "nvidia-smi": "echo '0, NVIDIA from smi, 24564 MiB'"}
    for name, body in scripts.items():
        tool = directory / name
        tool.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return str(directory)


def fake_nvml(calls: list[str], fail_init: bool = False,
              processes: tuple[list[tuple[int, int | None]], ...] = ([], [])) -> ModuleType:
    """Two GPUs; ``processes``: each GPU's compute processes as (pid, used bytes or ``None``)."""
    module = ModuleType("pynvml")

    def init() -> None:
        calls.append("init")
        if fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    names = [b"NVIDIA GeForce RTX 4090", "NVIDIA A100-SXM4-80GB"]  # bytes from older bindings
    module.nvmlInit = init  # type: ignore[attr-defined]
    module.nvmlShutdown = lambda: calls.append("shutdown")  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: 2  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda index: index  # type: ignore[attr-defined]
    module.nvmlDeviceGetName = lambda handle: names[handle]  # type: ignore[attr-defined]
    module.nvmlDeviceGetMemoryInfo = (  # type: ignore[attr-defined]
        lambda handle: SimpleNamespace(total=(24564, 81920)[handle] * 1024 * 1024))
    module.nvmlDeviceGetComputeRunningProcesses = lambda handle: [  # type: ignore[attr-defined]
        SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in processes[handle]]
    return module


def fake_amdsmi(calls: list[str], processes: tuple[list[tuple[int, int]], ...] = ([], []), *,
                handles_only: bool = False) -> ModuleType:
    """Two GPUs; ``processes``: each GPU's processes as (pid, VRAM bytes), listed as dicts (recent ``amdsmi``) or,
    with ``handles_only``, as handles read through ``amdsmi_get_gpu_process_info`` (older ones)."""
    module = ModuleType("amdsmi")
    handles = ["h-a", "h-b"]
    info: dict[str, dict[str, Any]] = {
        "h-a": {"market_name": "Radeon RX 7900 XTX", "hip_id": 1, "vram_size": 24560},
        "h-b": {"market_name": "N/A", "hip_id": 0, "vram_size": 0},
    }
    module.amdsmi_init = lambda: calls.append("init")  # type: ignore[attr-defined]
    module.amdsmi_shut_down = lambda: calls.append("shutdown")  # type: ignore[attr-defined]
    module.amdsmi_get_processor_handles = lambda: handles  # type: ignore[attr-defined]
    module.amdsmi_get_gpu_asic_info = lambda h: {"market_name": info[h]["market_name"]}  # type: ignore[attr-defined]
    module.amdsmi_get_gpu_enumeration_info = lambda h: {"hip_id": info[h]["hip_id"]}  # type: ignore[attr-defined]
    module.amdsmi_get_gpu_vram_info = lambda h: {"vram_size": info[h]["vram_size"]}  # type: ignore[attr-defined]
    listed = {handle: [{"pid": pid, "name": "server", "memory_usage": {"vram_mem": vram, "gtt_mem": 7, "cpu_mem": 7}}
                       for pid, vram in processes[position]] for position, handle in enumerate(handles)}
    if handles_only:
        module.amdsmi_get_gpu_process_list = (  # type: ignore[attr-defined]
            lambda h: [(h, position) for position in range(len(listed[h]))])
        module.amdsmi_get_gpu_process_info = (  # type: ignore[attr-defined]
            lambda h, process: listed[process[0]][process[1]])
    else:
        module.amdsmi_get_gpu_process_list = lambda h: listed[h]  # type: ignore[attr-defined]
    return module


async def test_bindings_answer_before_the_cli_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(calls))
    monkeypatch.setitem(sys.modules, "amdsmi", fake_amdsmi(calls))
    assert await discover(fake_tools(tmp_path)) == [
        Gpu("amd", 0, "AMD GPU 0"), Gpu("amd", 1, "Radeon RX 7900 XTX", 24560),
        Gpu("nvidia", 0, "NVIDIA GeForce RTX 4090", 24564), Gpu("nvidia", 1, "NVIDIA A100-SXM4-80GB", 81920)]
    assert sorted(calls) == ["init", "init", "shutdown", "shutdown"]


async def test_absent_bindings_fall_back_to_the_cli_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # None in sys.modules: the import fails
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    assert amd_gpus() is None and nvidia_gpus() is None
    assert await discover(fake_tools(tmp_path)) == CLI_GPUS


async def test_a_binding_without_its_driver_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(calls, fail_init=True))
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    assert await discover(fake_tools(tmp_path)) == CLI_GPUS
    assert calls == ["init"]


@pytest.mark.skipif(importlib.util.find_spec("pynvml") is None, reason="nvidia-ml-py not installed")
def test_the_real_nvml_binding_without_a_driver_is_none() -> None:
    assert nvidia_gpus() is None  # this machine has no NVIDIA driver: NVMLError_LibraryNotFound


OTHER = 2**22 + 4242  # a pid outside the group


def test_the_vram_of_the_groups_processes_is_summed_over_every_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    me = os.getpid()
    pids = group_pids(os.getpgid(0))
    assert pids is not None and me in pids and OTHER not in pids
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(
        calls, processes=([(me, 3 * MIB), (OTHER, 900 * MIB)], [(me, 5 * MIB), (OTHER, None)])))
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    assert process_vram_mib(pids) == 8.0
    assert calls == ["init", "shutdown"]


def test_a_process_whose_usage_nvml_does_not_know_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([], processes=([(10, None), (11, 2 * MIB)], [(10, None)])))
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    assert process_vram_mib({10, 11}) == 2.0
    assert process_vram_mib({10}) is None  # the binding answered, but knows no figure for the group


@pytest.mark.parametrize("handles_only", [False, True], ids=["dicts", "process-handles"])
def test_amd_smi_reads_either_shape_of_its_process_list(monkeypatch: pytest.MonkeyPatch, handles_only: bool) -> None:
    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "amdsmi", fake_amdsmi(
        calls, ([(10, 1024 * MIB), (OTHER, 4096 * MIB)], [(11, 512 * MIB)]), handles_only=handles_only))
    assert process_vram_mib({10, 11, 12}) == 1536.0
    assert process_vram_mib({OTHER + 1}) is None
    assert calls == ["init", "shutdown"] * 2


def test_both_bindings_add_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([], processes=([(10, 100 * MIB)], [])))
    monkeypatch.setitem(sys.modules, "amdsmi", fake_amdsmi([], ([], [(10, 28 * MIB)])))
    assert process_vram_mib([10]) == 128.0


def test_no_binding_no_driver_or_a_failing_driver_reads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    assert process_vram_mib({10}) is None
    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(calls, fail_init=True, processes=([(10, MIB)], [])))
    assert process_vram_mib({10}) is None and calls == ["init"]
    calls.clear()
    lost = fake_nvml(calls, processes=([(10, MIB)], []))

    def gpu_is_lost(handle: object) -> list[object]:
        raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
    lost.nvmlDeviceGetComputeRunningProcesses = gpu_is_lost  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", lost)
    assert process_vram_mib({10}) is None and calls == ["init", "shutdown"]
    assert process_vram_mib(set()) is None


def test_a_group_that_does_not_exist_has_no_pids() -> None:
    assert group_pids(2**22 + 12345) == set()


@pytest.mark.skipif(importlib.util.find_spec("pynvml") is None, reason="nvidia-ml-py not installed")
def test_the_real_nvml_binding_without_a_driver_reads_no_process_memory() -> None:
    assert process_vram_mib({os.getpid()}) is None
