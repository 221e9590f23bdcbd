"""The stalled-load rule against a long flash-loader copy: the manager's status passes, scripted (the
flash-loader's pod state and log tail every 10 s), through the proxy's ``stall_deadline``. A copy whose
bytes keep moving is never stalled, however long it takes; a copy whose bytes stop is stalled 120 s after
they stopped. (Before, the status said ``LoadingWeights`` with a fixed message while the init container
ran, so ``loadingProgressAt`` never moved and every copy longer than 120 s was called stalled.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from flexinfer.api.model import Model
from flexinfer.cluster_proxy.demand import STALL_AFTER, stall_deadline
from flexinfer.core.loading_logs import refine_from_log
from flexinfer.core.model_status.build import StatusInputs, build_status, loading_detail
from flexinfer.flashloader.progress import CHECKSUMMING, COPYING, LogProgress
from support.resource_builders import make_model

T0 = datetime(2026, 1, 1, tzinfo=UTC)
POD: dict[str, Any] = {"metadata": {"name": "m-1"}, "status": {
    "initContainerStatuses": [{"name": "flash-loader", "ready": False, "state": {"running": {}}}],
    "containerStatuses": [{"name": "model", "ready": False, "state": {"waiting": {"reason": "PodInitializing"}}}]}}
GIB, MIB = 2**30, 2**20


class Copy:
    """The flash-loader's real progress writer, driven by a scripted clock and byte count."""

    def __init__(self, total: int, task: str = COPYING) -> None:
        self.clock = 0.0
        self.lines: list[str] = []
        self.progress = LogProgress(self.lines.append, clock=lambda: self.clock)
        self.progress.begin(8, total, task)

    def advance(self, seconds: float, nbytes: int) -> None:
        self.clock += seconds
        if nbytes:
            self.progress.advance(nbytes)


def manager_pass(model: Model, tail: list[str], now: datetime) -> Model:
    """What the reconciler does for a Loading member: the pod's detail, refined by the container's log
    tail when the detail names a container to read, then the status build."""
    detail = loading_detail(POD)
    assert detail is not None
    if detail.log_container is not None:
        detail = refine_from_log(tail) or detail
    status = build_status(model, StatusInputs(phase="Loading", now=now, loading=detail))
    return model.model_copy(update={"status": status})


def run(copy: Copy, rates: list[int], start: Model | None = None) -> list[Model]:
    """One manager pass every 10 s; ``rates[i]`` bytes staged during the i-th interval."""
    model, seen = start or make_model("m"), []
    for index, nbytes in enumerate([0, *rates]):
        copy.advance(10.0 if index else 0.0, nbytes)
        model = manager_pass(model, copy.lines[-200:], T0 + timedelta(seconds=10 * index))
        seen.append(model)
    return seen


def test_a_copy_that_moves_bytes_is_never_stalled_however_long_it_runs() -> None:
    copy = Copy(total=40 * GIB)
    passes = run(copy, [100 * MIB] * 60)  # 100 MiB every 10 s: a 10-minute copy
    for index, model in enumerate(passes):
        now = T0 + timedelta(seconds=10 * index)
        deadline = stall_deadline(model)
        assert deadline is not None and deadline > now, f"stalled after {10 * index} s: {model.status.message}"
    last = passes[-1].status
    assert last.loading_substage == "LoadingWeights"
    assert last.message == "staging weights into tmpfs: 6000.0 of 40960.0 MiB (15%), 0/8 files"
    assert last.loading_progress_at == T0 + timedelta(seconds=600)


def test_a_copy_whose_bytes_stop_is_stalled_120s_after_the_last_byte() -> None:
    copy = Copy(total=40 * GIB)
    passes = run(copy, [100 * MIB] * 6 + [0] * 14)
    stuck_since = T0 + timedelta(seconds=60)
    assert [m.status.loading_progress_at for m in passes[6:]] == [stuck_since] * 15
    assert stall_deadline(passes[-1]) == stuck_since + timedelta(seconds=STALL_AFTER)
    assert stall_deadline(passes[-1]) < T0 + timedelta(seconds=200)  # the proxy fails the waiting requests


def test_a_long_checksum_pass_that_hashes_bytes_is_not_stalled_either() -> None:
    copy = Copy(total=80 * GIB, task=CHECKSUMMING)
    passes = run(copy, [300 * MIB] * 30)  # a 5-minute verification
    for index, model in enumerate(passes):
        deadline = stall_deadline(model)
        assert deadline is not None and deadline > T0 + timedelta(seconds=10 * index), model.status.message
    assert passes[-1].status.message == "checksumming weights: 9000.0 of 81920.0 MiB (11%), 0/8 files"
