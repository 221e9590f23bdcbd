"""One reconcile pass over one unit, planned purely: scripted facts in, one plan out (rejections, preemptions,
per-member manifests and status patches, the log read, the wake-up), and the pass after a preemption."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from flexinfer.api.conventions import ACTIVE_SERVICES_ANNOTATION, WAITING_SINCE_ANNOTATION
from flexinfer.api.errors import FieldProblem, InvalidResourceError
from flexinfer.api.model import Model
from flexinfer.api.modeldemand import ModelDemand
from flexinfer.core.controller_defaults import ControllerDefaults
from flexinfer.core.election import ElectionPolicy
from flexinfer.core.model_status.build import merge_diff
from flexinfer.core.model_status.plan import WAKE_MARGIN, ManagerPolicy
from flexinfer.core.unit_actions import LogRead, UnitPlan
from flexinfer.core.unit_facts import StoredModel, UnitFacts
from flexinfer.core.unit_plan import plan_unit
from support.recording_kube import merged
from support.resource_builders import model_doc

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
POLICY = ManagerPolicy(election=ElectionPolicy(max_wait=2.0))
Body = dict[str, Any]


def rfc3339(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def stored(name: str, status: Body | None = None, annotations: dict[str, str] | None = None,
           **spec: Any) -> StoredModel:
    doc = model_doc(name, "ns", **spec)
    doc["metadata"].update(generation=1, annotations=annotations or {})
    doc["status"] = status or {}
    return StoredModel(doc, Model.model_validate(doc))


def shared(name: str, priority: int, status: Body | None = None, **kwargs: Any) -> StoredModel:
    return stored(name, status, gpu={"shared": "g", "priority": priority}, **kwargs)


def deployment(replicas: int, ready: int = 0, unavailable: int = 0) -> Body:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": replicas},
            "status": {"readyReplicas": ready, "unavailableReplicas": unavailable}}


def report(**models: Body) -> ModelDemand:
    return ModelDemand.model_validate({
        "apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDemand", "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"proxy": "proxy-x", "renewTime": rfc3339(NOW), "models": models}})


def plan(*models: StoredModel, group: bool = False, **facts: Any) -> UnitPlan:
    return plan_unit(UnitFacts(NOW, models, group="g" if group else None, **facts), ControllerDefaults(), POLICY)


def written(model: StoredModel, patch: Body) -> StoredModel:
    """``model`` after a status merge patch (what the store holds after the manager's write)."""
    doc = {**model.body, "status": merged(model.body.get("status") or {}, patch)}
    return StoredModel(doc, Model.model_validate(doc))


def test_demand_for_a_new_exclusive_model_scales_it_up_and_opens_a_cold_start() -> None:
    assert plan(stored("m")).members[0].manifests[0]["spec"]["replicas"] == 0, "no demand yet: idle"
    demand = [report(m={"lastActiveTime": rfc3339(NOW - timedelta(seconds=1))})]
    result = plan(stored("m"), reports=demand)
    assert not result.rejections and not result.preemptions and [m.name for m in result.declared] == ["m"]
    (member,) = result.members
    assert member.manifests[0]["kind"] == "Deployment" and member.manifests[0]["spec"]["replicas"] == 1
    assert member.manifests[1]["kind"] == "Service"
    assert member.status.phase == "Pending" and member.status.activation is not None
    assert (member.status.activation.kind, member.status.activation.decided_at) == ("cold_start", NOW)
    assert member.patch["phase"] == "Pending" and not member.stops and member.log is None
    again = plan(written(stored("m"), member.patch), deployments={"m": deployment(1)}, reports=demand)
    assert again.members[0].patch == {}, "an unchanged status is not written again"


def test_an_invalid_model_is_rejected_once_and_a_model_that_cannot_render_likewise() -> None:
    bad = StoredModel(model_doc("bad", "ns"), None, InvalidResourceError([FieldProblem("spec.source", "bad scheme")]))
    unrenderable = stored("odd", config={"parallel": 0})
    result = plan(bad, unrenderable)
    assert [r.body["metadata"]["name"] for r in result.rejections] == ["bad", "odd"]
    assert all(r.patch["phase"] == "Failed" and r.announce for r in result.rejections)
    assert "spec.config.parallel must be a positive integer" in result.rejections[1].message
    assert result.members == () and [m.name for m in result.declared] == ["odd"]
    failed = StoredModel({**bad.body, "status": merge_diff({}, result.rejections[0].patch)}, None, bad.error)
    assert plan(failed).rejections[0].patch == {}, "already Failed with that message: nothing to write"


def test_a_model_being_deleted_is_left_alone() -> None:
    doc = stored("m")
    doc.body["metadata"]["deletionTimestamp"] = rfc3339(NOW)
    assert plan(doc) == UnitPlan(NOW)


def test_a_ready_incumbent_is_preempted_first_and_its_drain_decided_by_the_next_pass() -> None:
    high = shared("high", 200, {"phase": "Ready", "lastActiveTime": rfc3339(NOW - timedelta(seconds=1)),
                                "sharedGroup": {"state": "Active", "groupName": "g"}})
    low = shared("low", 100, {"lastActiveTime": rfc3339(NOW - timedelta(seconds=3))},
                 annotations={WAITING_SINCE_ANNOTATION: rfc3339(NOW - timedelta(seconds=3))})
    first = plan(high, low, group=True, deployments={"high": deployment(1, 1)})
    (preemption,) = first.preemptions
    assert (preemption.model.name, preemption.by) == ("high", "low")
    assert preemption.patch["phase"] == "Preempted" and preemption.patch["sharedGroup"]["state"] == "Preempted"
    assert first.members == (), "the members wait for the reports read after the Preempted write"
    assert first.election is not None and first.election.leader == "low"

    after = [written(high, preemption.patch), low]
    facts: dict[str, Any] = {"deployments": {"high": deployment(1, 1)}, "decided": first.election}
    busy = plan(*after, group=True, reports=[report(high={"inFlightAt": rfc3339(NOW)})], **facts)
    assert busy.preemptions == () and [m.model.name for m in busy.members] == ["high", "low"], "loser first"
    held, winner = busy.members
    assert held.manifests[0]["spec"]["replicas"] == 1 and not held.stops and held.busy == ("proxy-x",)
    assert held.patch == {}, "the first pass wrote the Preempted status"
    assert busy.wake is not None and busy.wake <= NOW + timedelta(seconds=POLICY.drain_timeout) + WAKE_MARGIN
    assert winner.manifests[0]["spec"]["replicas"] == 1 and winner.patch["sharedGroup"]["state"] == "Active"
    assert ACTIVE_SERVICES_ANNOTATION in winner.manifests[1]["metadata"]["annotations"]
    assert winner.status.activation is not None and winner.status.activation.kind == "swap"
    idle = plan(*after, group=True, **facts).members[0]
    assert idle.manifests[0]["spec"]["replicas"] == 0 and idle.stops and idle.busy == ()


def test_the_follow_up_pass_keeps_the_election_of_the_pass_that_preempted() -> None:
    high = shared("high", 200, {"phase": "Ready", "lastActiveTime": rfc3339(NOW - timedelta(seconds=1)),
                                "sharedGroup": {"state": "Active", "groupName": "g"}})
    low = shared("low", 100, {"lastActiveTime": rfc3339(NOW - timedelta(seconds=3))},
                 annotations={WAITING_SINCE_ANNOTATION: rfc3339(NOW - timedelta(seconds=3))})
    first = plan(high, low, group=True, deployments={"high": deployment(1, 1)})
    moved_on = shared("low", 100, {"lastActiveTime": rfc3339(NOW - timedelta(seconds=3))})  # marker withdrawn
    after = [written(high, first.preemptions[0].patch), moved_on]
    assert plan(*after, group=True).election != first.election, "a new election would now decide otherwise"
    kept = plan(*after, group=True, decided=first.election)
    assert kept.election is not None and kept.election.leader == "low" and kept.preemptions == ()
    assert kept.declared == (), "declared by the pass that preempted"


def test_a_loading_server_asks_for_its_log_and_the_lines_refine_the_status() -> None:
    pod = {"metadata": {"name": "m-abc", "creationTimestamp": rfc3339(NOW)},
           "status": {"containerStatuses": [{"name": "model", "ready": False, "state": {"running": {}}}]}}
    model = stored("m", {"phase": "Loading", "lastActiveTime": rfc3339(NOW)})
    result = plan(model, deployments={"m": deployment(1, 0, 1)}, pods={"m": [pod]})
    (member,) = result.members
    assert member.log == LogRead("m-abc", "model", 200)
    assert member.status.loading_substage == "Initializing"
    assert result.wake == NOW + timedelta(seconds=POLICY.log_poll_interval)
    refined = member.with_log(["INFO:     Uvicorn running on http://0.0.0.0:8000"])
    assert refined.status.loading_substage == "HealthCheckPending" and refined.log is None
    assert refined.patch["loadingSubstage"] == "HealthCheckPending"
    assert member.with_log(["nothing to see"]) == member


def test_ready_carries_the_pod_ready_instant() -> None:
    since = NOW - timedelta(seconds=4)
    pod = {"metadata": {"name": "m-abc"}, "status": {"conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": rfc3339(since)}]}}
    model = stored("m", {"lastActiveTime": rfc3339(NOW)})
    (member,) = plan(model, deployments={"m": deployment(1, 1)}, pods={"m": [pod]}).members
    assert member.status.phase == "Ready" and member.ready_at == since and member.ready_seen is None
    watched = since + timedelta(milliseconds=412)
    seen = {("Pod", "m-abc"): watched, ("Deployment", "m"): watched + timedelta(milliseconds=40)}
    (member,) = plan(model, deployments={"m": deployment(1, 1)}, pods={"m": [pod]}, ready_seen=seen).members
    assert (member.ready_at, member.ready_seen) == (since, watched), "the pod's own transition, as the watch saw it"


def test_a_ready_model_whose_pod_restarts_opens_a_restart_activation_and_keeps_its_replica() -> None:
    model = stored("m", {"phase": "Ready", "lastActiveTime": rfc3339(NOW - timedelta(seconds=30))})
    pod = {"metadata": {"name": "m-abc", "creationTimestamp": rfc3339(NOW)}, "status": {"containerStatuses": [
        {"name": "model", "ready": False, "restartCount": 1, "state": {"running": {}}}]}}
    (member,) = plan(model, deployments={"m": deployment(1, 0, 1)}, pods={"m": [pod]}).members
    assert member.manifests[0]["spec"]["replicas"] == 1 and member.status.phase == "Loading"
    act = member.status.activation
    assert act is not None and (act.kind, act.decided_at, act.demand_since) == ("cold_start", NOW, None)
    assert member.patch["activation"]["decidedAt"].startswith(NOW.strftime("%Y-%m-%dT%H:%M:%S"))


def test_fields_ignored_in_the_stored_model_are_named_in_config_valid() -> None:
    problem = FieldProblem("spec.cache.flashLoader.tmpfsSizeLimit", "not a quantity")
    model = stored("m")
    model = StoredModel(model.body, model.model, None, (problem,))
    (member,) = plan(model).members
    assert member.ignored.own and "tmpfsSizeLimit" in member.ignored.message
    valid = next(c for c in member.status.conditions if c.type == "ConfigValid")
    assert (valid.status, valid.reason) == ("False", "InvalidFieldIgnored")


def test_an_unreadable_wait_marker_is_reported_and_ignored() -> None:
    result = plan(shared("a", 100, annotations={WAITING_SINCE_ANNOTATION: "yesterday"}), group=True)
    assert result.unreadable_markers == (("ns/a", "yesterday"),)
