"""The local engine's estimate of a model's memory need, by backend: the dispatcher's ``estimate`` hook.

``MemoryEstimator`` answers for a model before it ever ran:

- llama.cpp: from its GGUF header (``flexinfer.local.gguf_estimate.estimate_mib``);
- vLLM: by vLLM's own rule (``flexinfer.core.vllm_need``): on a GPU, ``--gpu-memory-utilization`` times the total
  memory of the GPU(s) the engine pins it to (``flexinfer.local.gpu_discovery.pinned_gpus``: the same devices
  an ``auto`` budget counts); on the CPU, its ``*.safetensors`` files plus its KV cache space;
- anything else: ``None`` (its need stays unknown until it ran once).

``EstimateError`` when a figure cannot be computed (the dispatcher logs it and the need stays unknown).
Blocking (file reads, and the wait for GPU discovery): the dispatcher calls it in a worker thread, and the GPU
list comes through ``gpus``, a blocking callable (``discovery_reader`` bridges ``GpuInventory`` to that thread).
Built by ``flexinfer.assembly.run_local``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from flexinfer.api.model import Model
from flexinfer.core import vllm_need
from flexinfer.core.errors import ConfigError, EngineError
from flexinfer.local.gguf_estimate import EstimateError, estimate_mib
from flexinfer.local.gpu_bindings import Gpu
from flexinfer.local.gpu_discovery import GpuInventory, pinned_gpus
from flexinfer.local.sources import existing_source

DISCOVERY_WAIT = 30.0
"""How long a worker thread waits for GPU discovery (each vendor's probe is bounded on its own)."""


class MemoryEstimator:
    """The estimate hook (see the module docstring). ``base_dir``: where relative ``file://`` sources resolve;
    ``gpus``: the machine's GPUs (blocking); ``env``: the environment model servers inherit."""

    def __init__(self, base_dir: Path, *, gpus: Callable[[], Sequence[Gpu]],
                 env: Mapping[str, str] | None = None) -> None:
        self._base_dir, self._gpus, self._env = base_dir, gpus, dict(env or {})

    def __call__(self, model: Model) -> float | None:
        """The model's estimated need in MiB, or ``None`` when no rule covers it."""
        if vllm_need.covers(model):
            return self.vllm(model)
        return estimate_mib(model, self._base_dir)

    def vllm(self, model: Model) -> float | None:
        """vLLM's rule: the pinned GPUs' total memory on a GPU, the safetensors' size on the CPU."""
        on_gpu = model.gpu_count > 0
        device = device_mib(pinned_gpus(model, self._gpus())) if on_gpu else None
        weights = None if on_gpu else safetensors_bytes(model, self._base_dir)
        try:
            return vllm_need.need_mib(model, device_mib=device, weights_bytes=weights, inherited_env=self._env)
        except ConfigError as exc:
            raise EstimateError(str(exc)) from None


def device_mib(gpus: Sequence[Gpu]) -> float | None:
    """The total memory of ``gpus`` in MiB; ``None`` when there are none or one does not report its size."""
    sizes = [g.memory_mb for g in gpus]
    if not sizes or any(size is None for size in sizes):
        return None
    return float(sum(size for size in sizes if size is not None))


def safetensors_bytes(model: Model, base_dir: Path) -> int | None:
    """The size of the model's ``*.safetensors`` weights: every such file of a ``file://`` directory, or the
    file itself; ``None`` when the source is not on this machine or holds none."""
    try:
        path = existing_source(model, base_dir)
    except EngineError:
        return None
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path] if path.suffix == ".safetensors" else []
    return sum(f.stat().st_size for f in files) if files else None


def discovery_reader(inventory: GpuInventory, loop: asyncio.AbstractEventLoop,
                     timeout: float = DISCOVERY_WAIT) -> Callable[[], list[Gpu]]:
    """A blocking reader of ``inventory`` for a worker thread: discovery (once) runs on ``loop``, the thread waits.
    Never call it on ``loop``'s own thread (it would wait for itself)."""
    def read() -> list[Gpu]:
        return asyncio.run_coroutine_threadsafe(inventory.gpus(), loop).result(timeout)
    return read
