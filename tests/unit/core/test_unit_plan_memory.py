"""One reconcile pass over a shared group on a ``multiModel`` GPU profile (flexinfer.core.unit_plan): every member
that fits is scaled up in the same pass with its need in ``status.sharedGroup``; an eviction is a preemption whose
message names the cause, and the member it makes room for waits until the victim's Deployment has no replicas;
a member larger than the budget is Failed with ``VRAMInsufficient``; without the profile, one member at a time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from flexinfer.api.model import Model
from flexinfer.core.controller_defaults import ControllerDefaults
from flexinfer.core.election import ElectionPolicy
from flexinfer.core.gpu_profiles import GPUProfile
from flexinfer.core.model_status.plan import ManagerPolicy
from flexinfer.core.unit_actions import MemberAction, UnitPlan
from flexinfer.core.unit_facts import StoredModel, UnitFacts
from flexinfer.core.unit_plan import plan_unit
from support.recording_kube import merged
from support.resource_builders import model_doc

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
PACKED = ManagerPolicy(election=ElectionPolicy(min_hold=0.0),
                       gpu_profiles=(GPUProfile("gfx1100", 2000, multi_model=True),))
Body = dict[str, Any]


def rfc3339(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def stored(name: str, need: int, status: Body | None = None, waiting: bool = False) -> StoredModel:
    doc = model_doc(name, "ns", gpu={"vendor": "amd", "shared": "g", "vramEstimateMB": need})
    doc["metadata"]["generation"] = 1
    if waiting:
        doc["metadata"]["annotations"] = {"flexinfer.ai/waiting-since": rfc3339(NOW - timedelta(seconds=1))}
    doc["status"] = status or {}
    return StoredModel(doc, Model.model_validate(doc))


def written(model: StoredModel, patch: Body) -> StoredModel:
    doc = {**model.body, "status": merged(model.body.get("status") or {}, patch)}
    return StoredModel(doc, Model.model_validate(doc))


def asked(name: str, need: int) -> StoredModel:
    return stored(name, need, {"phase": "Idle", "lastActiveTime": rfc3339(NOW - timedelta(seconds=1))}, waiting=True)


def ready(name: str, need: int, ago: timedelta = timedelta(minutes=10)) -> StoredModel:
    since = rfc3339(NOW - ago)
    return stored(name, need, {"phase": "Ready", "lastActiveTime": rfc3339(NOW - timedelta(minutes=10)),
                               "conditions": [{"type": "Ready", "status": "True", "reason": "BackendReady",
                                               "lastTransitionTime": since}],
                               "sharedGroup": {"groupName": "g", "state": "Active"}})


def running(*names: str) -> dict[str, Body]:
    return {n: {"spec": {"replicas": 1}, "status": {"readyReplicas": 1}} for n in names}


def plan(*models: StoredModel, policy: ManagerPolicy = PACKED, at: datetime = NOW, **facts: Any) -> UnitPlan:
    return plan_unit(UnitFacts(at, models, group="g", **facts), ControllerDefaults(), policy)


def member(result: UnitPlan, name: str) -> MemberAction:
    return next(m for m in result.members if m.model.name == name)


def replicas(action: MemberAction) -> int:
    return int(action.manifests[0]["spec"]["replicas"])


def test_members_that_fit_are_scaled_up_in_one_pass_with_their_need_shown() -> None:
    result = plan(asked("a", 1000), asked("b", 1000))
    assert [replicas(member(result, n)) for n in ("a", "b")] == [1, 1]
    shared = member(result, "a").status.shared_group
    assert shared is not None and (shared.state, shared.memory_need_mib, shared.memory_need_source) == (
        "Active", 1000, "declared")
    assert member(result, "a").patch["sharedGroup"]["memoryNeedMiB"] == 1000


def test_an_eviction_is_a_preemption_naming_the_cause_and_the_taker_waits_for_the_replicas() -> None:
    first = plan(ready("a", 1000), ready("b", 1000), asked("c", 1000), deployments=running("a", "b"))
    assert [p.model.name for p in first.preemptions] == ["a"] and not first.members
    assert first.preemptions[0].message == ("Preempted by c with priority 100 (evicted from GPU group ns/g to make "
                                            "room for ns/c (needs 1000 MiB (declared); 0 of 2000 MiB free))")
    preempted = written(ready("a", 1000), first.preemptions[0].patch)
    follow = plan(preempted, ready("b", 1000), asked("c", 1000), deployments=running("a", "b"),
                  decided=first.election)
    assert (replicas(member(follow, "a")), replicas(member(follow, "c"))) == (0, 0), "c waits for a's replicas"
    gone = written(preempted, member(follow, "a").patch)
    after = plan(gone, ready("b", 1000), asked("c", 1000), deployments={**running("b"), "a": {"spec": {"replicas": 0}}})
    activation = member(after, "c").status.activation
    assert replicas(member(after, "c")) == 1 and activation is not None
    assert (activation.kind, activation.preempted) == ("swap", "a"), "c's start is a swap from a"


def test_a_member_larger_than_the_budget_fails_at_once() -> None:
    action = member(plan(stored("big", 4000)), "big")
    ready_condition = next(c for c in action.status.conditions if c.type == "Ready")
    assert (action.status.phase, ready_condition.reason) == ("Failed", "VRAMInsufficient")
    assert action.status.message == "model ns/big needs 4000 MiB (declared) but GPU group ns/g has a memory budget " \
                                    "of 2000 MiB"
    assert action.announce and replicas(action) == 0


def test_without_a_multi_model_profile_the_group_runs_one_member() -> None:
    result = plan(asked("a", 1000), asked("b", 1000), policy=ManagerPolicy(election=ElectionPolicy(min_hold=0.0)))
    assert sorted(replicas(member(result, n)) for n in ("a", "b")) == [0, 1]
    assert all(m.status.shared_group and m.status.shared_group.memory_need_mib is None for m in result.members)


def test_on_a_one_gpu_node_a_second_active_member_waits_for_the_device_without_failing() -> None:
    """Both members fit the budget and are Active, but each pod requests the one ``amd.com/gpu``: the second pod
    stays Pending, and since another member holds the device the model is Loading (not Failed) and says why."""
    scheduled = {"metadata": {"name": "a-1", "creationTimestamp": rfc3339(NOW)}, "spec": {"nodeName": "node"},
                 "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    waiting = {"metadata": {"name": "b-1", "creationTimestamp": rfc3339(NOW)},
               "spec": {"containers": [{"name": "model", "resources": {"limits": {"amd.com/gpu": "1"}}}]},
               "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                          "message": "0/1 nodes are available: 1 Insufficient amd.com/gpu."}]}}
    b = stored("b", 1000, {"phase": "Loading", "lastActiveTime": rfc3339(NOW - timedelta(seconds=1)),
                           "sharedGroup": {"groupName": "g", "state": "Active"}}, waiting=True)
    deployments = {**running("a"), "b": {"spec": {"replicas": 1}, "status": {"unavailableReplicas": 1}}}
    result = plan(ready("a", 1000), b, deployments=deployments, pods={"a": [scheduled], "b": [waiting]})
    action = member(result, "b")
    assert (action.status.phase, action.status.loading_substage, replicas(action)) == ("Loading", "Initializing", 1)
    assert action.status.message == "pod not scheduled: 0/1 nodes are available: 1 Insufficient amd.com/gpu."
    assert action.failure is None


def test_the_hold_of_the_residents_ends_on_a_timer_and_an_early_late_or_repeated_pass_agrees() -> None:
    """Both residents became Ready 5 s ago (hold 15 s): the request for ``c`` waits, the plan's wake-up is the end of
    the hold; a pass a little early still waits, one at or after the wake-up evicts exactly one resident, and a
    repeated pass over the written preemption evicts nobody else."""
    held = ManagerPolicy(election=ElectionPolicy(min_hold=15.0, max_wait=300.0), gpu_profiles=PACKED.gpu_profiles)
    members = (ready("a", 1000, timedelta(seconds=5)), ready("b", 1000, timedelta(seconds=5)), asked("c", 1000))
    first = plan(*members, policy=held, deployments=running("a", "b"))
    assert not first.preemptions and first.wake is not None
    assert first.wake - NOW == timedelta(seconds=10) + timedelta(milliseconds=100)
    early = plan(*members, policy=held, at=first.wake - timedelta(milliseconds=500), deployments=running("a", "b"))
    assert not early.preemptions
    for late in (first.wake, first.wake + timedelta(seconds=7)):
        result = plan(*members, policy=held, at=late, deployments=running("a", "b"))
        assert [p.model.name for p in result.preemptions] == ["a"], late
    evicted = written(members[0], result.preemptions[0].patch)
    again = plan(evicted, members[1], members[2], policy=held, at=late, deployments=running("a", "b"))
    assert not again.preemptions and member(again, "c").status.shared_group.state == "Queued", "c waits for a"
