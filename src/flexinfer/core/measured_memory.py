"""The Kubernetes manager's measured memory need of a model server: read once from the server's log after it is
Ready, kept in ``status.sharedGroup.memoryMeasured`` for later starts.

The local engine reads its own child's output (``flexinfer.local.engine``); the manager reads the pod's log
(``pods/log``) through the reconcile plan's ``LogRead``. A member of a group that packs by memory (its decision
carries a need) whose ``llamacpp`` server is Ready gets its model container's log read (``wants_read``) when
there is no figure for its current generation and that server run was not read yet: one read per run, never one
per pass. ``measurement`` turns the lines into the record: the need by ``flexinfer.core.memory_need``'s rule for a
llama.cpp log (``measured_mib``: what it put on its GPU(s), else all of its buffers), or no figure when the lines
do not hold the whole start up to ``model loaded`` (fewer lines than asked, or the line that opens the weights'
loading, must be there, so a tail cut after the first buffer lines never under-counts).

The record names the generation it was measured for (``kept``: a changed spec, any field of it, drops it, as a
changed manifest does in the local engine) and the server run that was read. ``measured_need`` is what the
election (``flexinfer.core.active_set.need_of``) takes from it. Pure; used by ``flexinfer.core.unit_plan``,
``flexinfer.core.unit_actions`` and ``flexinfer.core.model_status.plan``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from flexinfer.api.model import MeasuredMemoryStatus, Model, SharedGroupStatus
from flexinfer.core.memory_need import measured_mib
from flexinfer.core.server_memory import parse_memory

MEASURE_LOG_LINES: Final = 2000
"""Lines of a Ready server's log read to measure it: its start (about 150 to 400 lines at ``--verbosity 4``) plus
the requests served before the manager's first pass after Ready (about 25 lines each)."""
LOAD_START: Final = "loading model tensors"
"""llama.cpp's line before its first buffer line (``load_tensors: loading model tensors, this can take a while``)."""
MEASURED_BACKENDS: Final = frozenset({"llamacpp"})


def kept(shared: SharedGroupStatus | None, generation: int | None) -> MeasuredMemoryStatus | None:
    """The stored record when it applies to ``generation`` (else ``None``: it is dropped)."""
    record = shared.memory_measured if shared is not None else None
    if record is None or record.observed_generation != generation:
        return None
    return record


def measured_need(model: Model) -> float | None:
    """The model's measured need in MiB, when its status holds one for its current generation."""
    record = kept(model.status.shared_group, model.metadata.generation)
    return record.need_mib if record is not None else None


def wants_read(model: Model, record: MeasuredMemoryStatus | None, run: str | None) -> bool:
    """Read the log of server run ``run`` of this Ready member: a llama.cpp server without a figure for this
    generation whose run was not read yet."""
    if run is None or model.backend not in MEASURED_BACKENDS:
        return False
    return record is None or (record.need_mib is None and record.server_run != run)


def measurement(lines: Sequence[str], asked: int, *, run: str, generation: int | None,
                on_gpu: bool) -> MeasuredMemoryStatus:
    """The record of one read of ``asked`` lines of server run ``run`` (see the module docstring)."""
    whole = len(lines) < asked or any(LOAD_START in line for line in lines)
    memory = parse_memory(lines) if whole else None
    mib = measured_mib(memory, on_gpu) if memory is not None else None
    return MeasuredMemoryStatus(need_mib=round(mib, 2) if mib is not None else None,
                                observed_generation=generation, server_run=run)
