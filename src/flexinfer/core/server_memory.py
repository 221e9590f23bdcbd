"""A llama.cpp server's memory, as it reports it: the buffer sizes in its start-up log.

While it loads, llama.cpp logs one line per buffer it allocates (at ``--verbosity 4``, which the local
engine starts ``llama-server`` with)::

    load_tensors:   CPU_Mapped model buffer size =     0.46 MiB
    llama_kv_cache:        CPU KV buffer size =     0.25 MiB
    llama_context:        CPU  output buffer size =     0.00 MiB
    sched_reserve:        CPU compute buffer size =     1.51 MiB

The device is the buffer type's name: ``CPU``, ``CPU_Mapped`` (weights mapped from the file), ``CPU_REPACK``
and ``<gpu>_Host`` (pinned host memory) are host memory; ``ROCm0``, ``CUDA0``, ``Vulkan0``… are that GPU.
``parse_memory`` sums them by kind (``model`` weights, ``kv`` cache, ``compute`` buffers, and ``other``:
output, recurrent-state and LoRA buffers) and by device. Weights, KV and other buffers add up (a model with
sliding-window attention logs two KV caches); a compute buffer replaces the one logged before it on the same
device (the scheduler reserves again when the graph changes). ``complete`` says the server finished loading
(``model loaded`` or ``listening on`` was seen), so the figures are final.

Pure; the local engine parses a server's output once it is Ready (``flexinfer.local.engine``) and the admin
API shows the result (``GET /admin/status`` → ``memory``, ``flexinfer ps -o wide``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

_BUFFER: Final = re.compile(
    r"\b(?P<who>\w+):\s+(?P<device>[A-Za-z][\w.-]*)\s+(?:(?P<kind>model|KV|RS|compute|output|LoRA)|DSV4 \w+ state)"
    r"\s+buffer size\s*=\s*(?P<mib>\d+(?:\.\d+)?)\s*MiB")
_DONE: Final = ("llama_server: model loaded", "llama_server: listening on")
_KINDS: Final = {"model": "model", "KV": "kv", "compute": "compute"}
HOST: Final = "host"


@dataclass(frozen=True)
class ServerMemory:
    """Buffer sizes in MiB by kind, and by device (``host`` or the GPU's name)."""

    model_mib: float = 0.0
    kv_mib: float = 0.0
    compute_mib: float = 0.0
    other_mib: float = 0.0
    devices: tuple[tuple[str, float], ...] = ()
    complete: bool = False

    @property
    def total_mib(self) -> float:
        return self.model_mib + self.kv_mib + self.compute_mib + self.other_mib

    def as_json(self) -> dict[str, object]:
        """The admin API's ``memory`` object (MiB rounded to 0.01)."""
        return {"model_mib": round(self.model_mib, 2), "kv_mib": round(self.kv_mib, 2),
                "compute_mib": round(self.compute_mib, 2), "other_mib": round(self.other_mib, 2),
                "total_mib": round(self.total_mib, 2), "devices": {d: round(m, 2) for d, m in self.devices},
                "complete": self.complete}


@dataclass
class _Tally:
    summed: dict[tuple[str, str], float] = field(default_factory=dict)
    compute: dict[str, float] = field(default_factory=dict)

    def add(self, kind: str, device: str, mib: float) -> None:
        if kind == "compute":
            self.compute[device] = mib
        else:
            self.summed[(kind, device)] = self.summed.get((kind, device), 0.0) + mib

    def by_kind(self, kind: str) -> float:
        if kind == "compute":
            return sum(self.compute.values())
        return sum(mib for (k, _), mib in self.summed.items() if k == kind)

    def by_device(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for (_, device), mib in [*self.summed.items(), *((("compute", d), m) for d, m in self.compute.items())]:
            out[device] = out.get(device, 0.0) + mib
        return out


def device_of(buffer_type: str) -> str:
    """``host`` for host-memory buffer types (``CPU``, ``CPU_Mapped``, ``CPU_REPACK``, ``ROCm_Host``…), else the
    GPU's name (``ROCm0``)."""
    if buffer_type.upper().startswith("CPU") or buffer_type.endswith("_Host"):
        return HOST
    return buffer_type


def parse_memory(lines: Iterable[str]) -> ServerMemory | None:
    """The memory a llama.cpp server reported in ``lines`` (one start: pass the lines since it was started);
    ``None`` when no buffer line is among them (another server, or a verbosity below 4)."""
    tally, complete, seen = _Tally(), False, False
    for line in lines:
        match = _BUFFER.search(line)
        if match is not None:
            seen = True
            tally.add(_KINDS.get(match["kind"] or "", "other"), device_of(match["device"]), float(match["mib"]))
        elif any(marker in line for marker in _DONE):
            complete = True
    if not seen:
        return None
    devices = tuple(sorted(tally.by_device().items(), key=lambda item: (item[0] != HOST, item[0])))
    return ServerMemory(model_mib=tally.by_kind("model"), kv_mib=tally.by_kind("kv"),
                        compute_mib=tally.by_kind("compute"), other_mib=tally.by_kind("other"),
                        devices=devices, complete=complete)
