"""GPU discovery through the vendors' bindings (amdsmi, pynvml) and the fall-back to the CLI tools.

No GPU exists here: the binding path runs against fake binding modules (fault injection), the fall-back
path against absent bindings, the real ``pynvml`` without a driver, and fake ``rocm-smi``/``nvidia-smi``
scripts on a private PATH.
"""

from __future__ import annotations

import importlib.util
import stat
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from flexinfer.local.gpu_bindings import Gpu, amd_gpus, nvidia_gpus
from flexinfer.local.gpu_discovery import discover

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


def fake_nvml(calls: list[str], fail_init: bool = False) -> ModuleType:
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
    return module


def fake_amdsmi(calls: list[str]) -> ModuleType:
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
