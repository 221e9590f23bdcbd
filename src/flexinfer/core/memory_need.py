"""A model's memory need: how many MiB of its group's budget it takes, and where that figure comes from.

In order of preference (``flexinfer.core.arbiter.memory.MemoryLedger`` keeps the figures):

1. ``measured``: what the model's server reported once it was up (a llama.cpp server's buffer sizes from its
   log, ``measured_mib``; else the engine's reading of the processes' memory: on the GPU through the vendor's
   binding, else its resident memory; ``reported_need``). It replaces the others for later starts of the same
   manifest.
2. ``declared``: ``spec.gpu.vramEstimateMB`` (``declared_mib``).
3. ``estimated``: for llama.cpp, from the weights (``LlamaShape`` + ``LlamaRun``, read from a GGUF header by
   ``flexinfer.local.gguf_estimate``): the tensors, the KV cache for the context of every parallel slot, and
   llama.cpp's compute and output buffers (``llama_mib``); for vLLM, what vLLM reserves
   (``flexinfer.core.vllm_need``: ``--gpu-memory-utilization`` times the GPU's memory, or on the CPU the weights plus
   its KV cache space).
4. ``unknown``: none of these; the model then counts as the group's whole budget (it runs alone) until it
   was measured once.

The compute buffer is an approximation of what llama.cpp reserves for one micro-batch (logits, the feed-forward
and attention activations, the attention over one slot's context); against llama-server's own figures for the
test suite's generated models it is within 15 %, and the measured figure replaces it after the first start.

``first_known`` applies that order; both engines call it. The Kubernetes manager cannot read the weights: its only
estimate is vLLM's on a GPU (``flexinfer.core.active_set.need_of``); its measured figure comes from the model
server's log once it is Ready (``flexinfer.core.measured_memory``).

``out_of_memory`` recognises a start that failed for lack of memory. Pure; used by the arbiter
(``flexinfer.core.arbiter``), the local engine, the manager's election and the admin views.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Literal, cast

from flexinfer.api.model import Model
from flexinfer.core.server_memory import HOST, ServerMemory

NeedSource = Literal["measured", "declared", "estimated", "unknown"]
NEED_SOURCES: Final[tuple[NeedSource, ...]] = ("measured", "declared", "estimated", "unknown")
MIB: Final = 1024 * 1024
F32_BYTES: Final = 4
_OUT_OF_MEMORY: Final = re.compile(
    r"out of memory|outofmemory|failed to allocate|unable to allocate|cannot allocate memory|bad_alloc"
    r"|memoryerror|cudaerrormemoryallocation|alloc(?:ation)? failed|exited with signal sigkill", re.IGNORECASE)


@dataclass(frozen=True)
class MemoryNeed:
    """``mib`` of the group's budget, and where the figure comes from."""

    mib: float
    source: NeedSource

    def describe(self) -> str:
        """``512 MiB (measured)``."""
        return f"{self.mib:.0f} MiB ({self.source})"


def too_large_message(model: str, need: MemoryNeed, group: str, budget_mib: float) -> str:
    """The error of a model that can never fit its group, in both engines (a hint when the need is estimated)."""
    hint = "; if the estimate is wrong, set spec.gpu.vramEstimateMB" if need.source == "estimated" else ""
    return (f"model {model} needs {need.describe()} but GPU group {group} has a memory budget of "
            f"{budget_mib:.0f} MiB{hint}")


def eviction_cause(model: str, need: MemoryNeed, held_mib: float, group: str, budget_mib: float) -> str:
    """Why a resident was evicted, in both engines: for whom, its need, and what was free of the budget."""
    return (f"evicted from GPU group {group} to make room for {model} (needs {need.describe()}; "
            f"{max(budget_mib - held_mib, 0.0):.0f} of {budget_mib:.0f} MiB free)")

def out_of_memory_cause(model: str, group: str) -> str:
    """Why a resident was evicted after another member's start ran out of memory beside it, in both engines."""
    return f"evicted from GPU group {group}: model {model} ran out of memory starting beside it (retrying once)"


def out_of_memory_failure(model: str, need: MemoryNeed, group: str, budget_mib: float, *, held_mib: float,
                          error: str) -> str:
    """The error of a model whose start ran out of memory again (or with nobody left to evict), in both engines:
    its need, the budget, what the other members hold, and the server's own words."""
    return (f"out of memory starting model {model}: it needs {need.describe()}, GPU group {group} has a budget of "
            f"{budget_mib:.0f} MiB ({held_mib:.0f} MiB held by other models); {error}")


def reported_need(logged: float | None, on_gpu: bool, resident: Callable[[], float | None],
                  device: Callable[[], float | None]) -> float | None:
    """What a Ready local server reports as its measured need: the buffers its log showed (``measured_mib``), else,
    for a model with a GPU, the device memory its processes hold as the GPU binding reports it (``device``), for a
    model without one, its processes' resident memory (``resident``). Each callable is read only when its figure
    is the one wanted: resident memory never counts for a GPU model (its memory is on the device, where resident
    memory does not show it). ``None`` (nothing reported; the declared or estimated need stands) when the chosen
    source has no figure, e.g. a GPU model without an installed binding."""
    if logged is not None:
        return logged
    return device() if on_gpu else resident()


def first_known(measured: float | None, declared: float | None, estimated: float | None, *,
                unknown_mib: float) -> MemoryNeed:
    """The need by the one rule both engines follow (the module docstring's order): the measured figure, else the
    declared one, else the estimate, else ``unknown_mib`` (``unknown``). Used by the arbiter's ledger
    (``flexinfer.core.arbiter.memory``) and the manager's election (``flexinfer.core.active_set.need_of``)."""
    for mib, source in ((measured, "measured"), (declared, "declared"), (estimated, "estimated")):
        if mib is not None:
            return MemoryNeed(mib, cast(NeedSource, source))
    return MemoryNeed(unknown_mib, "unknown")


def declared_mib(model: Model) -> float | None:
    """``spec.gpu.vramEstimateMB`` (``None`` when unset)."""
    gpu = model.spec.gpu
    return float(gpu.vram_estimate_mb) if gpu is not None and gpu.vram_estimate_mb is not None else None


def out_of_memory(error: str) -> bool:
    """A start failure that looks like a lack of memory: the backend's allocation failure (llama.cpp's
    ``failed to allocate buffer``, CUDA/HIP ``out of memory``, ``std::bad_alloc``, Python's ``MemoryError``…)
    or the server killed by SIGKILL (the kernel's OOM killer) before it was ready."""
    return _OUT_OF_MEMORY.search(error) is not None


def measured_mib(memory: ServerMemory, on_gpu: bool) -> float | None:
    """The need a llama.cpp server's log shows once it finished loading: for a model with a GPU, what it put on
    its GPU(s) (host buffers do not take the GPU's memory), else (or when it put nothing there) every buffer."""
    if not memory.complete:
        return None
    device = sum(mib for name, mib in memory.devices if name != HOST)
    return device if on_gpu and device > 0 else memory.total_mib


@dataclass(frozen=True)
class LlamaShape:
    """What a GGUF header says about a llama.cpp model's memory."""

    tensor_bytes: int
    layers: int
    context_train: int
    embedding: int
    feed_forward: int
    vocab: int
    heads: int
    kv_heads: Sequence[int]
    """Per layer (one value repeated when the header gives one for all)."""
    key_length: int
    value_length: int


@dataclass(frozen=True)
class LlamaRun:
    """How the server is started: ``--ctx-size`` (0 = the trained context per slot), ``--parallel``, a unified KV
    cache, the cache's bytes per element (K and V; f16 = 2) and ``--ubatch-size``."""

    context: int = 0
    parallel: int = 1
    unified: bool = False
    k_bytes: float = 2.0
    v_bytes: float = 2.0
    ubatch: int = 512


def context_cells(shape: LlamaShape, run: LlamaRun) -> int:
    """The KV cache's cells: ``--ctx-size`` when given (llama.cpp divides it among the slots), else the trained
    context for each slot (one shared context with a unified cache)."""
    if run.context > 0:
        return run.context
    return shape.context_train * (1 if run.unified else max(run.parallel, 1))


def kv_cache_bytes(shape: LlamaShape, run: LlamaRun) -> float:
    """Every layer's keys and values for every cell, at the cache's element size."""
    cells = context_cells(shape, run)
    per_cell = sum(heads * (shape.key_length * run.k_bytes + shape.value_length * run.v_bytes)
                   for heads in shape.kv_heads)
    return cells * per_cell


def compute_bytes(shape: LlamaShape, run: LlamaRun) -> float:
    """llama.cpp's compute buffer for one micro-batch, approximately (see the module docstring), plus its output
    buffer (one row of logits per slot)."""
    cells = context_cells(shape, run)
    per_slot = cells if run.unified else cells // max(run.parallel, 1)
    activations = run.ubatch * (shape.vocab + 2 * shape.feed_forward + 4 * shape.embedding)
    attention = per_slot * shape.embedding
    output = shape.vocab * max(run.parallel, 1)
    return F32_BYTES * (activations + attention + output)


def llama_mib(shape: LlamaShape, run: LlamaRun) -> float:
    """The estimated need of a llama.cpp server: weights + KV cache + compute and output buffers, in MiB."""
    return (shape.tensor_bytes + kv_cache_bytes(shape, run) + compute_bytes(shape, run)) / MIB
