"""The local engine's estimate hook (flexinfer.local.memory_estimate): vLLM members get vLLM's rule from the GPUs
the engine pins them to or from their safetensors files, llama.cpp members their GGUF estimate, and the
dispatcher uses the figure for a vLLM member of a group that packs by memory."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from flexinfer.api.model import Model
from flexinfer.core.arbiter.policy import ArbiterPolicy
from flexinfer.core.memory_need import MIB
from flexinfer.local.gguf_estimate import EstimateError
from flexinfer.local.gpu_bindings import Gpu
from flexinfer.local.gpu_discovery import GpuInventory
from flexinfer.local.memory_estimate import MemoryEstimator, discovery_reader, safetensors_bytes
from flexinfer.runtime.dispatcher import Dispatcher
from support.recording_engine import FakeClock, RecordingEngine
from support.tiny_gguf import write_tiny_gguf

GPUS = [Gpu("nvidia", 0, "big", 24576), Gpu("amd", 0, "card", 16384), Gpu("amd", 1, "card", 16384)]


def vllm(name: str, source: Path, *args: str, gpu: dict[str, Any] | None = None, **config: Any) -> Model:
    spec: dict[str, Any] = {"backend": "vllm", "source": f"file://{source}", "config": {"args": list(args), **config}}
    if gpu is not None:
        spec["gpu"] = gpu
    return Model.model_validate({"metadata": {"name": name}, "spec": spec})


def weights(directory: Path, sizes: dict[str, int]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, size in sizes.items():
        (directory / name).write_bytes(b"\0" * size)
    return directory


def test_a_vllm_member_on_a_gpu_takes_its_share_of_the_gpus_it_is_pinned_to(tmp_path: Path) -> None:
    estimator = MemoryEstimator(tmp_path, gpus=lambda: GPUS)
    one = vllm("a", tmp_path, "--gpu-memory-utilization", "0.5", gpu={"vendor": "amd", "shared": "g"})
    two = vllm("b", tmp_path, "--gpu-memory-utilization=0.25", gpu={"vendor": "amd", "shared": "g", "count": 2})
    default = vllm("c", tmp_path, gpu={"vendor": "auto", "shared": "g"})
    assert estimator(one) == 8192.0
    assert estimator(two) == 8192.0  # a quarter of each of the two AMD cards
    assert estimator(default) == pytest.approx(0.9 * 24576)  # auto: the first vendor found
    assert MemoryEstimator(tmp_path, gpus=lambda: [Gpu("amd", 0, "card")])(one) is None  # size not reported
    assert MemoryEstimator(tmp_path, gpus=list)(one) is None  # no such GPU here


def test_a_bad_utilization_is_an_estimate_error_naming_the_flag(tmp_path: Path) -> None:
    estimator = MemoryEstimator(tmp_path, gpus=lambda: GPUS)
    with pytest.raises(EstimateError, match="--gpu-memory-utilization must be a fraction in"):
        estimator(vllm("a", tmp_path, "--gpu-memory-utilization", "90", gpu={"vendor": "amd", "shared": "g"}))


def test_a_vllm_member_on_the_cpu_takes_its_safetensors_plus_its_kv_space(tmp_path: Path) -> None:
    directory = weights(tmp_path / "w", {"model-00001-of-00002.safetensors": 3 * MIB,
                                         "model-00002-of-00002.safetensors": MIB + 100, "config.json": 5 * MIB})
    assert safetensors_bytes(vllm("a", directory), tmp_path) == 4 * MIB + 100
    estimator = MemoryEstimator(tmp_path, gpus=lambda: GPUS, env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    assert estimator(vllm("a", directory)) == pytest.approx(4 + 100 / MIB + 1024)
    assert estimator(vllm("b", Path("w"), env={"VLLM_CPU_KVCACHE_SPACE": "2"})) == pytest.approx(
        4 + 100 / MIB + 2048)  # a relative source resolves against the base directory
    single = directory / "model-00001-of-00002.safetensors"
    assert MemoryEstimator(tmp_path, gpus=list)(vllm("c", single)) == pytest.approx(3 + 4096)
    assert estimator(vllm("d", weights(tmp_path / "empty", {"config.json": 10}))) is None
    assert estimator(vllm("e", tmp_path / "missing")) is None


def test_llamacpp_members_keep_their_gguf_estimate(tmp_path: Path) -> None:
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    llama = Model.model_validate({"metadata": {"name": "l"}, "spec": {
        "backend": "llamacpp", "source": f"file://{gguf}", "gpu": {"vendor": "cpu", "shared": "g"}}})
    figure = MemoryEstimator(tmp_path, gpus=list)(llama)
    assert figure is not None and 0 < figure < 1024


async def test_the_dispatcher_uses_a_vllm_members_estimate_from_gpu_discovery_in_a_worker_thread(
        tmp_path: Path) -> None:
    asked: list[int] = []

    class Inventory(GpuInventory):
        async def gpus(self) -> list[Gpu]:
            asked.append(threading.get_ident())
            return await super().gpus()

    inventory = Inventory(known=GPUS[1:])
    reader = discovery_reader(inventory, asyncio.get_running_loop())
    models = [vllm("small", tmp_path, "--gpu-memory-utilization", "0.25", gpu={"vendor": "amd", "shared": "g"}),
              vllm("default", tmp_path, gpu={"vendor": "amd", "shared": "g"})]
    policy = ArbiterPolicy(max_wait=30, min_hold=0, drain_timeout=20, cold_start_timeout=60,
                           group_budgets={"g": 16384.0})
    async with Dispatcher(RecordingEngine(), models, policy=policy, clock=FakeClock(), auto_tick=False,
                          estimate=MemoryEstimator(tmp_path, gpus=reader)) as d:
        await d.tick()
        assert {s.name: (s.need_mib, s.need_source) for s in d.snapshot()} == {
            "small": (4096.0, "estimated"), "default": (pytest.approx(0.9 * 16384), "estimated")}
    assert asked and set(asked) == {threading.get_ident()}, "discovery runs on the loop, the estimate waits for it"
