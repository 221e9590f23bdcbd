"""A pass over a shared group that runs in a group pod (``flexinfer.core.group_pod_plan``), planned purely: when the
pod is scaled up and down, how each member's status mirrors the pod's report, when the manifests are pushed, who
is refused, and the wake-up at the end of an idle timeout (early, late and repeated passes around it)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flexinfer.api.model import Model
from flexinfer.api.modeldemand import ModelDemand
from flexinfer.core.controller_defaults import ControllerDefaults
from flexinfer.core.group_pod_plan import GroupPodFacts, GroupPodPass, plan_group_pod
from flexinfer.core.group_pod_report import PodReport
from flexinfer.core.model_status.plan import ManagerPolicy
from flexinfer.core.unit_facts import StoredModel, UnitFacts
from support.resource_builders import model_doc

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
POLICY = ManagerPolicy(group_strategies=(("g", "TimeSliced"),))
IMAGE = "registry.local/flexinfer-llamacpp:1"
URL = "http://10.0.0.7:8080"
Body = dict[str, Any]


def rfc3339(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def member(name: str, status: Body | None = None, created: int = 0, **spec: Any) -> StoredModel:
    values: dict[str, Any] = {"backend": "llamacpp", "source": f"file:///opt/{name}.gguf", "image": IMAGE,
                              "gpu": {"shared": "g"}, "serverless": {"idleTimeout": "60s"}}
    values.update(spec)
    doc = model_doc(name, "ns", uid=f"uid-{name}", **values)
    doc["metadata"].update(generation=1, creationTimestamp=rfc3339(NOW - timedelta(hours=1, seconds=-created)))
    doc["status"] = status or {}
    return StoredModel(doc, Model.model_validate(doc))


def demand(name: str, at: datetime) -> ModelDemand:
    return ModelDemand.model_validate({
        "apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDemand", "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"proxy": "proxy-x", "renewTime": rfc3339(NOW), "models": {name: {"lastActiveTime": rfc3339(at)}}}})


def report(revision: str | None = None, **phases: str) -> PodReport:
    body = {"models": [{"key": f"ns/{n}", "phase": p, "in_flight": 0, "queue_depth": 0} for n, p in phases.items()],
            "config": {"revision": revision}}
    return PodReport.from_status("pod-uid", URL, body)


def plan(*members: StoredModel, now: datetime = NOW, pod: PodReport | None = None, deployment: Body | None = None,
         demands: tuple[ModelDemand, ...] = (), own_pods: dict[str, list[Body]] | None = None,
         deployments: dict[str, Body] | None = None) -> GroupPodPass:
    unit = UnitFacts(now, members, reports=demands, group="g", pods=own_pods or {}, deployments=deployments or {})
    facts = GroupPodFacts(unit, "ns", "TimeSliced", deployment, [], pod, "flexinfer-group-g-admin")
    return plan_group_pod(facts, ControllerDefaults(), POLICY)


def statuses(result: GroupPodPass) -> dict[str, str | None]:
    return {m.model.name: m.status.phase for m in result.members}


def test_without_demand_the_pod_stays_at_zero_and_every_member_is_idle() -> None:
    result = plan(member("a"), member("b"))
    assert result.replicas == 0 and statuses(result) == {"a": "Idle", "b": "Idle"}
    deployment = result.objects[1]
    assert deployment["kind"] == "Deployment" and deployment["spec"]["replicas"] == 0
    assert not result.push and result.wake is None


def test_a_request_brings_the_pod_up_and_the_wanted_member_loads_until_the_pod_answers() -> None:
    result = plan(member("a"), member("b"), demands=(demand("a", NOW - timedelta(seconds=1)),))
    assert result.replicas == 1 and statuses(result) == {"a": "Loading", "b": "Idle"}
    assert result.wake == NOW - timedelta(seconds=1) + timedelta(seconds=60, milliseconds=100)
    shared = result.members[0].status.shared_group
    assert shared is not None and shared.group_endpoint is None and shared.strategy == "TimeSliced"


def test_a_pinned_member_keeps_the_pod_up_without_requests() -> None:
    assert plan(member("a", serverless={"minReplicas": 1})).replicas == 1


def test_a_members_own_pod_from_exclusive_mode_holds_the_device_so_the_group_pod_waits() -> None:
    held = {"a": [{"metadata": {"name": "a-1"}, "status": {"phase": "Running"}}]}
    wanted = (demand("a", NOW),)
    result = plan(member("a"), demands=wanted, own_pods=held, deployments={"a": {"spec": {"replicas": 1}}})
    assert result.replicas == 0 and result.retire == ("a",) and result.held_by == ("a-1",)
    exited = {"a": [{"metadata": {"name": "a-1"}, "status": {"phase": "Succeeded"}}]}
    up = plan(member("a"), demands=wanted, own_pods=exited)
    assert up.replicas == 1 and up.held_by == ()
    assert plan(member("a"), own_pods=held).held_by == (), "nobody wants it: nothing waits"


def test_phases_mirror_the_pods_report_and_the_pod_is_where_requests_go() -> None:
    first = plan(member("a"), member("b"))
    pod = report(first.revision, a="Ready", b="Preempted")
    result = plan(member("a"), member("b"), pod=pod)
    assert statuses(result) == {"a": "Ready", "b": "Preempted"} and not result.push
    a, b = (m.status for m in result.members)
    assert a.pod_endpoint == URL and b.pod_endpoint is None
    assert a.shared_group is not None and a.shared_group.group_endpoint == URL
    assert b.shared_group is not None and b.shared_group.group_endpoint == URL
    assert a.endpoint == "http://flexinfer-group-g.ns.svc:8080"
    assert result.replicas == 1  # a runs in the pod


def test_a_member_failing_inside_the_pod_is_failed_with_the_pods_error_once() -> None:
    pod = PodReport.from_status("uid", URL, {"models": [
        {"key": "ns/a", "phase": "Failed", "last_error": "llama-server exited with status 1"}]})
    result = plan(member("a"), pod=pod)
    mirror = result.members[0]
    assert mirror.status.phase == "Failed" and mirror.failure == ("StartFailed", "llama-server exited with status 1")
    again = plan(member("a", mirror.status.model_dump(by_alias=True, exclude_none=True, mode="json")), pod=pod)
    assert again.members[0].patch == {}


def test_another_revision_in_the_pod_is_pushed_and_an_unknown_member_waits_for_it() -> None:
    result = plan(member("a"), member("b"), pod=report("sha256:old", a="Ready"))
    assert result.push and statuses(result) == {"a": "Ready", "b": "Pending"}


def test_a_member_in_another_image_is_refused_by_name_and_left_out_of_the_pod() -> None:
    result = plan(member("a"), member("b", created=5, image="registry.local/other:2"))
    assert [r.body["metadata"]["name"] for r in result.rejections] == ["b"]
    assert "registry.local/other:2" in result.rejections[0].message
    assert [m.model.name for m in result.members] == ["a"]
    assert "name: b" not in result.manifest and "name: a" in result.manifest


def test_no_member_left_means_no_objects() -> None:
    result = plan()
    assert result.objects == () and result.replicas == 0 and not result.push


@pytest.mark.parametrize("offset_ms", [-1, 0, 1, 250])
def test_the_pod_goes_to_zero_only_once_the_idle_timeout_has_passed(offset_ms: int) -> None:
    """Passes just before, at, just after and well after the wake-up the plan asked for (an event loop wakes a
    timer up to a millisecond early; a late one must still decide the same)."""
    last = NOW - timedelta(seconds=30)
    wanted = plan(member("a"), demands=(demand("a", last),), pod=report(None, a="Idle"))
    assert wanted.replicas == 1 and wanted.wake is not None
    at = wanted.wake + timedelta(milliseconds=offset_ms)
    later = plan(member("a"), now=at, demands=(demand("a", last),), pod=report(None, a="Idle"))
    assert later.replicas == 0 and later.wake is None
    assert plan(member("a"), now=last + timedelta(seconds=59), demands=(demand("a", last),),
                pod=report(None, a="Idle")).replicas == 1


def group_pod(terminating: bool, exited: bool = False, pending_on_gpu: bool = False) -> Body:
    meta: Body = {"name": "flexinfer-group-g-1", "namespace": "ns", "creationTimestamp": rfc3339(NOW)}
    if terminating:
        meta["deletionTimestamp"] = rfc3339(NOW)
    state = {"terminated": {"exitCode": 0}} if exited else {"running": {}}
    status: Body = {"phase": "Running", "containerStatuses": [{"name": "flexinfer", "state": state}]}
    if pending_on_gpu:
        status = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                      "reason": "Unschedulable",
                                                      "message": "1 Insufficient amd.com/gpu."}]}
    spec = {"containers": [{"name": "flexinfer", "resources": {"limits": {"amd.com/gpu": "1"}}}]}
    return {"metadata": meta, "spec": spec, "status": status}


def test_from_zero_the_next_group_pod_waits_until_the_last_one_released_the_device() -> None:
    """A request right after the pod was scaled to zero: the old pod still terminates, so the Deployment stays at
    zero (its pod would be Pending on the device, then wait out the scheduler's back-off); once its containers
    exited it is deleted at once; a pod Pending on the device just after the old one went is a wait, not a
    failure."""
    wanted = (demand("a", NOW),)
    at_zero = {"spec": {"replicas": 0}}

    def result(*pods: Body, gone: datetime | None = None) -> GroupPodPass:
        unit = UnitFacts(NOW, (member("a"),), reports=wanted, group="g")
        facts = GroupPodFacts(unit, "ns", "TimeSliced", at_zero, list(pods), None, "s", gone)
        return plan_group_pod(facts, ControllerDefaults(), POLICY)

    assert result(group_pod(terminating=True)).replicas == 0
    assert result(group_pod(terminating=True)).held_by == ("flexinfer-group-g-1",)
    exited = result(group_pod(terminating=True, exited=True))
    assert exited.replicas == 0 and exited.reap == (("ns", "flexinfer-group-g-1"),)
    assert result().replicas == 1
    waiting = result(group_pod(terminating=False, pending_on_gpu=True), gone=NOW - timedelta(seconds=1))
    assert statuses(waiting) == {"a": "Loading"}
    assert waiting.wake is not None and waiting.wake <= NOW + timedelta(seconds=10)
    unexplained = result(group_pod(terminating=False, pending_on_gpu=True))
    assert statuses(unexplained) == {"a": "Failed"}


def test_a_member_that_turned_ready_after_its_request_is_idle_from_then_and_the_wake_says_so() -> None:
    """The request came 30 s ago and the member turned Ready 10 s ago: idle counts from Ready (as the replica rule
    counts it). The pass at the request's idle end finds it still wanted and wakes again at Ready + idle timeout,
    where the pod may go (no pass is left without a wake-up while a member still wants the pod)."""
    ready = {"phase": "Ready", "conditions": [{"type": "Ready", "status": "True", "reason": "BackendReady",
                                               "lastTransitionTime": rfc3339(NOW - timedelta(seconds=10))}]}
    asked = (demand("a", NOW - timedelta(seconds=30)),)
    first = plan(member("a", ready), demands=asked, pod=report(None, a="Ready"))
    assert first.replicas == 1 and first.wake is not None
    at_wake = plan(member("a", ready), now=first.wake, demands=asked, pod=report(None, a="Ready"))
    assert at_wake.replicas == 1 and at_wake.wake == NOW + timedelta(seconds=50, milliseconds=100)
    idle = plan(member("a", ready), now=at_wake.wake, demands=asked, pod=report(None, a="Idle"))
    assert idle.replicas == 0
