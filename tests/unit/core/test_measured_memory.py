"""The Kubernetes manager's measured memory need (flexinfer.core.measured_memory): a Ready llama.cpp member of a
group that packs by memory gets its log read once per server run; the figure (its GPU part, else every buffer)
lands in ``status.sharedGroup.memoryMeasured`` for its generation, the next pass elects with it, and a spec change
drops it. Both engines pick a need by one rule (``memory_need.first_known``). The log lines are captured from the
real ``llama-server`` built by hack/build-llama-server, at ``--verbosity 4``."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flexinfer.api.model import MeasuredMemoryStatus, Model
from flexinfer.core.arbiter.events import MemoryNeedReported
from flexinfer.core.arbiter.memory import MemoryLedger
from flexinfer.core.arbiter.policy import ArbiterPolicy
from flexinfer.core.arbiter.state import Slot
from flexinfer.core.controller_defaults import ControllerDefaults
from flexinfer.core.election import ElectionPolicy
from flexinfer.core.gpu_profiles import GPUProfile
from flexinfer.core.measured_memory import MEASURE_LOG_LINES, kept, measured_need, measurement, wants_read
from flexinfer.core.memory_need import MemoryNeed, first_known, reported_need
from flexinfer.core.model_status.plan import ManagerPolicy
from flexinfer.core.unit_actions import MemberAction, UnitPlan
from flexinfer.core.unit_facts import StoredModel, UnitFacts
from flexinfer.core.unit_plan import plan_unit
from support.recording_kube import merged
from support.resource_builders import model_doc

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
PACKED = ManagerPolicy(election=ElectionPolicy(min_hold=0.0),
                       gpu_profiles=(GPUProfile("cpu", 100, multi_model=True),))
START = """\
0.00.010.636 I llama_model_loader: loaded meta data with 22 key-value pairs and 21 tensors from tiny.gguf
0.00.012.060 I load_tensors: loading model tensors, this can take a while... (load_mode = mmap)
0.00.012.276 I load_tensors:   CPU_Mapped model buffer size =     0.46 MiB
0.00.012.600 I llama_context:        CPU  output buffer size =     0.00 MiB
0.00.012.631 I llama_kv_cache:        CPU KV buffer size =     0.25 MiB
0.00.012.776 I llama_kv_cache: size =    0.25 MiB (   512 cells,   2 layers,  1/1 seqs), K (f16):    0.12 MiB
0.00.012.818 I sched_reserve: reserving ...
0.00.013.790 I sched_reserve:        CPU compute buffer size =     1.51 MiB
0.00.286.406 I srv  llama_server: model loaded
0.00.286.423 I srv  llama_server: listening on http://127.0.0.1:18931
0.00.286.489 I srv  update_slots: all slots are idle
""".splitlines()
GPU = ["load_tensors: loading model tensors, this can take a while... (load_mode = mmap)",
       "load_tensors:        ROCm0 model buffer size =  4403.49 MiB",
       "load_tensors:   CPU_Mapped model buffer size =   281.81 MiB",
       "llama_kv_cache:      ROCm0 KV buffer size =   512.00 MiB",
       "sched_reserve:      ROCm0 compute buffer size =   296.00 MiB",
       "sched_reserve:  ROCm_Host compute buffer size =    16.01 MiB",
       "srv  llama_server: model loaded"]
Body = dict[str, Any]


def test_a_cpu_server_counts_every_buffer_and_a_gpu_server_its_gpu_part() -> None:
    cpu = measurement(START, MEASURE_LOG_LINES, run="a-1#0@t", generation=3, on_gpu=False)
    assert cpu == MeasuredMemoryStatus(need_mib=2.22, observed_generation=3, server_run="a-1#0@t")
    gpu = measurement(GPU, MEASURE_LOG_LINES, run="a-1#0@t", generation=3, on_gpu=True)
    assert gpu.need_mib == pytest.approx(4403.49 + 512 + 296)


@pytest.mark.parametrize(("lines", "why"), [
    (START[:-3], "not loaded yet: the figures may not be final"),
    (["srv  llama_server: model loaded", "srv  llama_server: listening on http://0.0.0.0:8080"],
     "no buffer lines: a verbosity below 4, or another server"),
    ([], "the log could not be read"),
])
def test_no_figure_without_a_complete_start(lines: list[str], why: str) -> None:
    assert measurement(lines, MEASURE_LOG_LINES, run="r", generation=1, on_gpu=False).need_mib is None, why


def test_a_full_tail_counts_only_when_it_holds_the_start_of_the_weights() -> None:
    """A tail as long as asked may have cut the first buffer lines off: it counts only when the line that opens
    the weights' loading is in it (every buffer line comes after it)."""
    served = [f"0.01.{i:03d} I slot print_timing: id  0 | task {i} | total time = 2.47 ms" for i in range(40)]
    cut = (START + served)[-40:]
    assert measurement(cut, 40, run="r", generation=1, on_gpu=False).need_mib is None
    whole = (START + served)[1:]  # from the line that opens the weights' loading
    assert measurement(whole, len(whole), run="r", generation=1, on_gpu=False).need_mib == 2.22
    assert measurement(START[2:], len(START) - 2, run="r", generation=1, on_gpu=False).need_mib is None


def test_one_read_per_server_run_and_none_once_measured() -> None:
    llama = model("a")
    assert wants_read(llama, None, "a-1#0@t")
    assert not wants_read(llama, None, None), "no running model container: nothing to read"
    assert not wants_read(model("v", backend="vllm", source="HF://org/m"), None, "v-1#0@t")
    failed = MeasuredMemoryStatus(observed_generation=1, server_run="a-1#0@t")
    assert not wants_read(llama, failed, "a-1#0@t"), "that run's log was read already"
    assert wants_read(llama, failed, "a-1#1@t2"), "a new run (a restart, a new pod) is read once"
    measured = MeasuredMemoryStatus(need_mib=2.0, observed_generation=1, server_run="a-1#0@t")
    assert not wants_read(llama, measured, "a-2#0@t3"), "measured for this generation: kept for later starts"


def test_the_record_applies_to_its_generation_only() -> None:
    record = {"needMiB": 2.22, "observedGeneration": 1, "serverRun": "a-1#0@t"}
    same = model("a", status={"sharedGroup": {"groupName": "g", "memoryMeasured": record}})
    assert measured_need(same) == 2.22
    changed = model("a", generation=2, status={"sharedGroup": {"groupName": "g", "memoryMeasured": record}})
    assert measured_need(changed) is None and kept(changed.status.shared_group, 2) is None


@pytest.mark.parametrize(("measured", "declared", "estimated", "expected"), [
    (650.0, 1000.0, 500.0, MemoryNeed(650.0, "measured")),
    (None, 1000.0, 500.0, MemoryNeed(1000.0, "declared")),
    (None, None, 500.0, MemoryNeed(500.0, "estimated")),
    (None, None, None, MemoryNeed(100.0, "unknown")),
])
def test_one_rule_for_both_engines(measured: float | None, declared: float | None, estimated: float | None,
                                   expected: MemoryNeed) -> None:
    assert first_known(measured, declared, estimated, unknown_mib=100.0) == expected


def test_the_local_ledger_and_the_manager_rank_a_measured_figure_over_a_declared_one_alike() -> None:
    """The same member, measured at 2.22 MiB for its manifest with 1000 MiB declared: both engines count 2.22."""
    record = {"needMiB": 2.22, "observedGeneration": 1, "serverRun": "a-1#0@t"}
    declared = model("a", need=1000, status={"sharedGroup": {"groupName": "g", "memoryMeasured": record}})
    result = plan(stored(declared), pods={"a": [pod("a")]}, deployments=running("a"))
    manager = member(result, "a").status.shared_group
    assert manager is not None and (manager.memory_need_mib, manager.memory_need_source) == (2.22, "measured")
    ledger = MemoryLedger(ArbiterPolicy(group_budgets={"g": 100.0}))
    assert ledger.need(declared).source == "declared"
    ledger.learn(MemoryNeedReported(declared.key, 2.22, "measured"), Slot(declared))
    assert ledger.need(declared) == MemoryNeed(2.22, "measured")


def test_a_ready_member_is_read_once_and_the_next_pass_elects_with_the_figure() -> None:
    a = stored(model("a", status=ready_status()))
    first = member(plan(a, pods={"a": [pod("a")]}, deployments=running("a")), "a")
    assert first.log is not None
    assert (first.log.pod, first.log.container, first.log.lines, first.log.run) == (
        "a-1", "model", MEASURE_LOG_LINES, "a-1#0")
    read = first.with_log(START)
    assert read.log is None
    assert read.patch["sharedGroup"]["memoryMeasured"] == {
        "needMiB": 2.22, "observedGeneration": 1, "serverRun": "a-1#0"}
    assert read.status.pod_endpoint == first.status.pod_endpoint, "the rest of the status as built"
    after = written(a, read.patch)
    follow = member(plan(after, pods={"a": [pod("a")]}, deployments=running("a")), "a")
    assert follow.log is None, "measured: never read again"
    shared = follow.status.shared_group
    assert shared is not None and (shared.memory_need_mib, shared.memory_need_source) == (2.22, "measured")
    assert shared.memory_measured is not None and shared.memory_measured.need_mib == 2.22


def test_the_log_waits_until_the_kubelet_reports_the_container_running() -> None:
    """Ready by the server's answer before the kubelet's relist: its log cannot be read yet, and a read that failed
    would count for the run (never read again)."""
    a = stored(model("a", status=ready_status()))
    creating = pod("a")
    creating["status"] = {**creating["status"], "phase": "Pending", "containerStatuses": [
        {"name": "model", "ready": False, "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}]}
    assert member(plan(a, pods={"a": [creating]}, deployments=running("a")), "a").log is None
    later = member(plan(a, pods={"a": [pod("a")]}, deployments=running("a")), "a").log
    assert later is not None and later.run == "a-1#0", "the same run, read once it is reported running"


def test_a_run_without_figures_is_not_read_again_and_a_spec_change_drops_the_figure() -> None:
    a = stored(model("a", status=ready_status()))
    nothing = member(plan(a, pods={"a": [pod("a")]}, deployments=running("a")), "a").with_log(["listening on"])
    after = written(a, nothing.patch)
    assert member(plan(after, pods={"a": [pod("a")]}, deployments=running("a")), "a").log is None
    restarted = member(plan(after, pods={"a": [pod("a", restarts=1)]}, deployments=running("a")), "a")
    assert restarted.log is not None and restarted.log.run == "a-1#1"

    measured = written(a, member(plan(a, pods={"a": [pod("a")]}, deployments=running("a")), "a")
                       .with_log(START).patch)
    body = {**measured.body, "metadata": {**measured.body["metadata"], "generation": 2}}
    body["spec"] = {**body["spec"], "config": {"args": ["--ctx-size", "4096"]}}
    edited = member(plan(StoredModel(body, Model.model_validate(body)), pods={"a": [pod("a")]},
                         deployments=running("a")), "a")
    shared = edited.status.shared_group
    assert shared is not None and shared.memory_need_source == "unknown" and shared.memory_measured is None
    assert edited.patch["sharedGroup"]["memoryMeasured"] is None, "the stale record is removed"
    assert edited.log is not None, "the new generation's server is measured"


def test_members_outside_a_group_that_packs_are_never_read() -> None:
    a = stored(model("a", status=ready_status()))
    one_at_a_time = ManagerPolicy(election=ElectionPolicy(min_hold=0.0))
    action = member(plan(a, pods={"a": [pod("a")]}, deployments=running("a"), policy=one_at_a_time), "a")
    assert action.status.phase == "Ready" and action.log is None


# ------------------------------------------------------------------ builders


def model(name: str, *, generation: int = 1, need: int | None = None, status: Body | None = None,
          **spec: Any) -> Model:
    gpu: Body = {"vendor": "cpu", "shared": "g"}
    if need is not None:
        gpu["vramEstimateMB"] = need
    fields: Body = {"backend": "llamacpp", "source": "file:///m/tiny.gguf", "gpu": gpu,
                    "config": {"runtimeProfile": "cpu"}, **spec}
    doc = model_doc(name, "ns", **fields)
    doc["metadata"]["generation"] = generation
    doc["status"] = status or {}
    return Model.model_validate(doc)


def stored(m: Model) -> StoredModel:
    doc = m.model_dump(by_alias=True, mode="json", exclude_none=True)
    return StoredModel(doc, Model.model_validate(doc))


def written(model_: StoredModel, patch: Body) -> StoredModel:
    doc = {**model_.body, "status": merged(model_.body.get("status") or {}, patch)}
    return StoredModel(doc, Model.model_validate(doc))


def ready_status() -> Body:
    since = (NOW - timedelta(minutes=1)).isoformat().replace("+00:00", "Z")
    return {"phase": "Ready", "lastActiveTime": since, "sharedGroup": {"groupName": "g", "state": "Active"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "BackendReady", "lastTransitionTime": since}]}


def pod(name: str, restarts: int = 0) -> Body:
    started = "2026-03-01T11:59:00Z" if restarts == 0 else "2026-03-01T11:59:30Z"
    return {"metadata": {"name": f"{name}-1", "creationTimestamp": "2026-03-01T11:58:00Z"},
            "spec": {"nodeName": "node", "containers": [{"name": "model", "ports": [{"name": "http",
                                                                                        "containerPort": 8080}]}]},
            "status": {"phase": "Running", "podIP": "10.0.0.5",
                       "conditions": [{"type": "Ready", "status": "True"}],
                       "containerStatuses": [{"name": "model", "ready": True, "restartCount": restarts,
                                              "state": {"running": {"startedAt": started}}}]}}


def running(*names: str) -> dict[str, Body]:
    return {n: {"spec": {"replicas": 1}, "status": {"replicas": 1, "readyReplicas": 1, "availableReplicas": 1}}
            for n in names}


def plan(*models: StoredModel, policy: ManagerPolicy = PACKED, **facts: Any) -> UnitPlan:
    return plan_unit(UnitFacts(NOW, models, group="g", **facts), ControllerDefaults(), policy)


def member(result: UnitPlan, name: str) -> MemberAction:
    return next(m for m in result.members if m.model.name == name)


def test_a_local_server_reports_its_log_else_its_device_or_resident_memory() -> None:
    """The log's figures come first; without them a model with a GPU reports its processes' device memory (nothing
    when no binding answers: its declared or estimated need stands) and a model without one its resident memory.
    Resident memory does not show what is on the device: it is never read for a GPU model, nor device memory for a
    model without a GPU."""
    read: list[str] = []

    def reading(source: str, mib: float | None) -> Callable[[], float | None]:
        def read_it() -> float | None:
            read.append(source)
            return mib
        return read_it

    resident, device, no_binding = reading("resident", 812.0), reading("device", 6144.0), reading("device", None)
    assert reported_need(2.22, True, resident, device) == 2.22 and reported_need(2.22, False, resident, device) == 2.22
    assert not read
    assert reported_need(None, True, resident, device) == 6144.0 and read == ["device"]
    assert reported_need(None, True, resident, no_binding) is None and read == ["device", "device"]
    assert reported_need(None, False, resident, device) == 812.0 and read == ["device", "device", "resident"]
