"""GPU discovery: parsing captured rocm-smi / nvidia-smi output and choosing visible devices."""

from __future__ import annotations

import sys

import pytest

from flexinfer.local.gpu_discovery import Gpu, GpuInventory, device_env, parse_nvidia_smi, parse_rocm_smi
from support.local_processes import make_model

ROCM_SMI_6 = """{"card0": {"Device Name": "Navi 31 [Radeon RX 7900 XT/7900 XTX/7900 GRE/7900M]", "Device ID": "0x744c",
 "Device Rev": "0xc8", "Subsystem ID": "0x5304", "GUID": "45436"},
 "card1": {"Device Name": "Raphael", "Device ID": "0x164e", "Device Rev": "0xc6", "Subsystem ID": "0x8877",
 "GUID": "20318"}}"""
ROCM_SMI_5 = '{"card0": {"GPU ID": "0x73bf"}, "system": {"Driver version": "6.2.4"}}'
NVIDIA_SMI = "0, NVIDIA GeForce RTX 4090, 24564 MiB\n1, NVIDIA A100-SXM4-80GB, 81920 MiB\n"


def test_parse_rocm_smi_recent() -> None:
    assert parse_rocm_smi(ROCM_SMI_6) == [
        Gpu("amd", 0, "Navi 31 [Radeon RX 7900 XT/7900 XTX/7900 GRE/7900M]"),
        Gpu("amd", 1, "Raphael"),
    ]


def test_parse_rocm_smi_older_and_bad_input() -> None:
    assert parse_rocm_smi(ROCM_SMI_5) == [Gpu("amd", 0, "0x73bf")]
    assert parse_rocm_smi("WARNING: no AMD GPUs") == []
    assert parse_rocm_smi("[1, 2]") == []


def test_parse_nvidia_smi() -> None:
    assert parse_nvidia_smi(NVIDIA_SMI) == [
        Gpu("nvidia", 0, "NVIDIA GeForce RTX 4090", 24564),
        Gpu("nvidia", 1, "NVIDIA A100-SXM4-80GB", 81920),
    ]
    assert parse_nvidia_smi("No devices were found\n") == []
    assert parse_nvidia_smi("0, Tesla T4, [N/A]\n") == [Gpu("nvidia", 0, "Tesla T4", None)]


def model(vendor: str | None, count: int | None = None):
    gpu = None if vendor is None else {"vendor": vendor, **({"count": count} if count else {})}
    return make_model("g", "file:///w", **({"gpu": gpu} if gpu else {}))


AMD = parse_rocm_smi(ROCM_SMI_6)
NVIDIA = parse_nvidia_smi(NVIDIA_SMI)


@pytest.mark.parametrize("vendor, count, gpus, env", [
    ("amd", None, AMD, {"HIP_VISIBLE_DEVICES": "0"}),
    ("amd", 2, AMD + NVIDIA, {"HIP_VISIBLE_DEVICES": "0,1"}),
    ("nvidia", None, AMD + NVIDIA, {"CUDA_VISIBLE_DEVICES": "0"}),
    ("auto", None, NVIDIA, {"CUDA_VISIBLE_DEVICES": "0"}),
    ("cpu", None, AMD, {}),
    (None, None, AMD, {}),
])
def test_device_env(vendor, count, gpus, env) -> None:
    choice = device_env(model(vendor, count), gpus)
    assert dict(choice.env) == env and choice.warning is None


def test_missing_gpu_runs_with_a_warning() -> None:
    choice = device_env(model("amd"), NVIDIA)
    assert dict(choice.env) == {}
    assert choice.warning is not None and "asks for an AMD GPU but none was found" in choice.warning


def test_fewer_gpus_than_asked() -> None:
    choice = device_env(model("nvidia", 4), NVIDIA)
    assert dict(choice.env) == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert choice.warning is not None and "asks for 4 GPUs" in choice.warning


async def test_inventory_skips_discovery_for_cpu_models() -> None:
    inventory = GpuInventory(path="/nonexistent")
    assert dict((await inventory.device_env(model(None))).env) == {}
    assert inventory._gpus is None


async def test_inventory_without_tools_finds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    for binding in ("amdsmi", "pynvml"):
        monkeypatch.setitem(sys.modules, binding, None)  # no bindings either, even on a GPU machine
    inventory = GpuInventory(path="/nonexistent")
    choice = await inventory.device_env(model("amd"))
    assert inventory._gpus == [] and choice.warning is not None
