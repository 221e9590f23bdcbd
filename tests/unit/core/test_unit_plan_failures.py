"""A model server that cannot start, as one reconcile pass plans it: phase Failed with the cause on ``Ready`` and in
``message``, a Warning event when it appears (not on every pass), a crash's cause read from its previous log, and
a shared member's pod waiting for the GPU during its group's swap left Loading."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from flexinfer.api.model import Model
from flexinfer.core.controller_defaults import ControllerDefaults
from flexinfer.core.election import ElectionPolicy
from flexinfer.core.model_status.plan import ManagerPolicy
from flexinfer.core.model_status.pod_failure import DEVICE_SETTLE
from flexinfer.core.unit_actions import LogRead, MemberAction, UnitPlan
from flexinfer.core.unit_facts import StoredModel, UnitFacts
from flexinfer.core.unit_plan import plan_unit
from support.recording_kube import merged
from support.resource_builders import model_doc

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
POLICY = ManagerPolicy(election=ElectionPolicy())
Body = dict[str, Any]
AFFINITY = "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity."
NO_GPU = "0/1 nodes are available: 1 Insufficient amd.com/gpu."


def rfc3339(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def stored(name: str, status: Body | None = None, **spec: Any) -> StoredModel:
    doc = model_doc(name, "ns", **spec)
    doc["metadata"]["generation"] = 1
    doc["status"] = status or {}
    return StoredModel(doc, Model.model_validate(doc))


def demanded(name: str, **spec: Any) -> StoredModel:
    return stored(name, {"phase": "Loading", "lastActiveTime": rfc3339(NOW - timedelta(seconds=2))}, **spec)


def written(model: StoredModel, patch: Body) -> StoredModel:
    doc = {**model.body, "status": merged(model.body.get("status") or {}, patch)}
    return StoredModel(doc, Model.model_validate(doc))


def loading_deployment() -> Body:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": 1},
            "status": {"unavailableReplicas": 1}}


def pod(name: str, conditions: list[Body] | None = None, containers: list[Body] | None = None) -> Body:
    return {"metadata": {"name": f"{name}-1", "creationTimestamp": rfc3339(NOW)},
            "spec": {"containers": [{"name": "model", "resources": {"limits": {"amd.com/gpu": "1"}}}]},
            "status": {"conditions": conditions or [], "containerStatuses": containers or []}}


def unschedulable(message: str) -> list[Body]:
    return [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]


def plan(*models: StoredModel, group: bool = False, **facts: Any) -> UnitPlan:
    return plan_unit(UnitFacts(NOW, models, group="g" if group else None, **facts), ControllerDefaults(), POLICY)


def member(result: UnitPlan, name: str) -> MemberAction:
    return next(m for m in result.members if m.model.name == name)


def ready_condition(action: MemberAction) -> tuple[str, str, str]:
    ready = next(c for c in action.status.conditions if c.type == "Ready")
    return ready.status, ready.reason, ready.message


def test_an_unschedulable_model_is_failed_with_the_cause_and_announced_once() -> None:
    model = demanded("m")
    facts: dict[str, Any] = {"deployments": {"m": loading_deployment()},
                             "pods": {"m": [pod("m", unschedulable(AFFINITY))]}}
    action = member(plan(model, **facts), "m")
    assert action.status.phase == "Failed" and action.status.message == f"Unschedulable: {AFFINITY}"
    assert ready_condition(action) == ("False", "Unschedulable", f"Unschedulable: {AFFINITY}")
    assert action.announce and action.failure is not None and action.failure.reason == "Unschedulable"
    assert action.manifests[0]["spec"]["replicas"] == 1, "the pod stays: the scheduler keeps trying"
    again = member(plan(written(model, action.patch), **facts), "m")
    assert again.patch == {} and not again.announce, "an unchanged failure is neither written nor announced again"


def test_a_pod_waiting_for_the_gpu_while_a_group_member_releases_it_stays_loading() -> None:
    """The swap: the winner's pod lacks ``amd.com/gpu`` until the loser's pod is gone (and a moment after, until
    the scheduler binds it). Only a pod still unschedulable after that is Failed."""
    old = stored("old", {"phase": "Preempted", "sharedGroup": {"state": "Preempted", "groupName": "g",
                                                                  "preemptedAt": rfc3339(NOW - timedelta(seconds=5))}},
                 gpu={"shared": "g", "priority": 100})
    new = stored("new", {"phase": "Loading", "lastActiveTime": rfc3339(NOW - timedelta(seconds=5)),
                         "sharedGroup": {"state": "Active", "groupName": "g"}}, gpu={"shared": "g", "priority": 200})
    waiting = {"new": [pod("new", unschedulable(NO_GPU))]}
    deployments = {"new": loading_deployment()}
    draining = plan(old, new, group=True, deployments=deployments, pods={**waiting, "old": [pod("old")]})
    assert member(draining, "new").status.phase == "Loading"
    gone = NOW - timedelta(seconds=1)
    settling = plan(old, new, group=True, deployments=deployments, pods=waiting, pods_gone_at={"old": gone})
    assert member(settling, "new").status.phase == "Loading"
    assert settling.wake is not None and settling.wake <= gone + timedelta(seconds=DEVICE_SETTLE)
    settled = plan(old, new, group=True, deployments=deployments, pods=waiting,
                   pods_gone_at={"old": NOW - timedelta(seconds=DEVICE_SETTLE)})
    assert member(settled, "new").status.phase == "Failed", "nothing of the group holds the GPU any more"
    exclusive = plan(demanded("solo", gpu={"vendor": "amd"}), deployments={"solo": loading_deployment()},
                     pods={"solo": [pod("solo", unschedulable(NO_GPU))]})
    assert member(exclusive, "solo").status.phase == "Failed", "no swap explains it"


def test_a_crash_loop_reads_the_previous_log_for_its_cause() -> None:
    crashed = {"name": "model", "ready": False, "restartCount": 2,
               "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s"}},
               "lastState": {"terminated": {"reason": "Error", "exitCode": 1}}}
    model = demanded("m")
    action = member(plan(model, deployments={"m": loading_deployment()}, pods={"m": [pod("m", containers=[crashed])]}),
                    "m")
    assert action.status.phase == "Failed" and action.log == LogRead("m-1", "model", 40, previous=True)
    refined = action.with_log(["loading model", "ValueError: Model path does not exist: /models/m.gguf"])
    assert refined.status.message == ("CrashLoopBackOff: container model crashed 2 times: "
                                      "ValueError: Model path does not exist: /models/m.gguf")
    assert refined.announce and refined.log is None
    stored_failed = written(model, refined.patch)
    again = member(plan(stored_failed, deployments={"m": loading_deployment()},
                        pods={"m": [pod("m", containers=[crashed])]}), "m").with_log([])
    assert again.patch == {} and not again.announce, "an unreadable log keeps the cause already written"


def test_a_model_whose_pod_recovers_is_ready_again() -> None:
    failed = written(demanded("m"), {"phase": "Failed", "message": "CrashLoopBackOff: container model crashed",
                                     "conditions": [{"type": "Ready", "status": "False", "reason": "CrashLoopBackOff",
                                                     "lastTransitionTime": rfc3339(NOW)}]})
    ready_deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": 1},
                        "status": {"readyReplicas": 1}}
    action = member(plan(failed, deployments={"m": ready_deployment}, pods={"m": [pod("m")]}), "m")
    assert action.status.phase == "Ready" and ready_condition(action)[:2] == ("True", "BackendReady")
    assert action.failure is None and not action.announce
