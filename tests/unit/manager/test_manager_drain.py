"""The manager's swap drain, through ``Reconciler.reconcile`` against a recording API: the Preempted status is
written before the proxies' reports are read afresh, and that read comes before the loser's Deployment is
applied; an in-flight report that landed after the watch cache was read (but before the Preempted write)
keeps the replica; a failed read falls back to the watch cache. The election is held once per reconcile. A
member whose Deployment changes is written before the others' status. The pass that deletes the loser's exited pod
scales the winner up right after it."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from flexinfer.api.conventions import WAITING_SINCE_ANNOTATION
from flexinfer.cluster_proxy.demand import rfc3339
from flexinfer.core.controller_defaults import ControllerDefaults
from flexinfer.core.election import ElectionPolicy
from flexinfer.core.model_status.build import merge_diff
from flexinfer.core.model_status.plan import ManagerPolicy
from flexinfer.manager.client import KubeApi
from flexinfer.manager.reconciler import Reconciler
from flexinfer.manager.store import Store, Unit
from support.recording_kube import RecordingKubeApi as Api
from support.recording_kube import merged
from support.resource_builders import model_doc

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
POLICY = ManagerPolicy(election=ElectionPolicy(max_wait=2.0))
GROUP = Unit("ns", "g", True)
Body = dict[str, Any]


class Sink:
    def __getattr__(self, _name: str) -> Any:
        return lambda *_a, **_k: None


def report(proxy: str, **models: Body) -> Body:
    return {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDemand",
            "metadata": {"name": proxy, "namespace": "ns"},
            "spec": {"proxy": proxy, "renewTime": rfc3339(NOW), "models": models}}


def member(store: Store, name: str, priority: int, **status: Any) -> None:
    doc = model_doc(name, "ns", gpu={"shared": "g", "priority": priority})
    if name == "low":
        doc["metadata"]["annotations"] = {WAITING_SINCE_ANNOTATION: rfc3339(NOW - timedelta(seconds=3))}
    doc["metadata"]["resourceVersion"] = "1"
    doc["status"] = status
    store.put("Model", doc)


def reconciler(store: Store, api: Api) -> Reconciler:
    """The group's reconciler over ``store``, writing through the recording ``api``, its clock at ``NOW``."""
    return Reconciler(cast(KubeApi, api), store, ControllerDefaults(), POLICY, sink=Sink(),
                      scope=lambda *_: contextlib.nullcontext(), wake=lambda *_: None,
                      clock=lambda: NOW)


def high_holds_the_gpu(reports: list[Body] | None, cached: tuple[Body, ...] = ()) -> tuple[Store, Api, Reconciler]:
    """``high`` Ready and Active, ``low`` starving; the reconciler of their group (its next pass preempts ``high``)."""
    store = Store()
    member(store, "high", 200, phase="Ready", lastActiveTime=rfc3339(NOW - timedelta(seconds=1)),
           sharedGroup={"state": "Active", "groupName": "g"})
    member(store, "low", 100, lastActiveTime=rfc3339(NOW - timedelta(seconds=3)))
    store.put("Deployment", {"apiVersion": "apps/v1", "kind": "Deployment",
                             "metadata": {"name": "high", "namespace": "ns", "resourceVersion": "1"},
                             "spec": {"replicas": 1}, "status": {"replicas": 1, "readyReplicas": 1}})
    for body in cached:
        store.put("ModelDemand", body)
    api = Api(store, reports)
    subject = reconciler(store, api)
    return store, api, subject


async def preempt_high(reports: list[Body] | None, cached: tuple[Body, ...] = ()) -> tuple[Store, Api]:
    """``high`` Ready and Active, ``low`` starving: this reconcile preempts ``high``."""
    store, api, subject = high_holds_the_gpu(reports, cached)
    await subject.reconcile(GROUP)
    return store, api


def high_replicas(api: Api) -> list[str]:
    return [c[3] for c in api.calls if c[:3] == ("apply", "Deployment", "high")]


async def test_the_preemption_is_written_then_the_reports_read_afresh_then_the_loser_applied() -> None:
    store, api = await preempt_high([])
    assert api.calls == [
        ("status", "high", "Preempted"), ("event", "Normal", "Preempted"), ("list_demands", "ns"),
        ("apply", "Deployment", "high", "0"), ("apply", "Service", "high", ""),  # the loser first
        ("apply", "Deployment", "low", "1"), ("apply", "Service", "low", ""), ("status", "low", "Pending")]
    parsed = store.model("ns", "high")
    assert parsed is not None and parsed.model is not None and parsed.model.status.phase == "Preempted"


async def test_a_report_read_afresh_after_the_preemption_keeps_the_replica() -> None:
    late = report("proxy-x", high={"inFlightAt": rfc3339(NOW - timedelta(seconds=1))})
    _, api = await preempt_high([late])
    assert high_replicas(api) == ["1"], "held while the proxy reports a request in flight"


@pytest.mark.parametrize("renewed", [True, False], ids=["live", "dead-proxy"])
async def test_a_failed_read_falls_back_to_the_watch_cache(renewed: bool) -> None:
    cached = report("proxy-y", high={"inFlightAt": rfc3339(NOW - timedelta(seconds=1))})
    if not renewed:
        cached["spec"]["renewTime"] = rfc3339(NOW - timedelta(minutes=5))
    _, api = await preempt_high(None, (cached,))
    assert high_replicas(api) == (["1"] if renewed else ["0"])


def test_merge_helper_agrees_with_the_status_diff() -> None:
    before = {"phase": "Ready", "sharedGroup": {"state": "Active", "groupName": "g"}}
    after = {"phase": "Preempted", "sharedGroup": {"state": "Preempted", "groupName": "g"}}
    assert merged(before, merge_diff(before, after)) == after


def high_pod(version: str, *, finished: bool) -> Body:
    """``high``'s pod: running, or deleted by its ReplicaSet with every container exited (the kubelet keeps the
    object until its next status sync)."""
    meta: Body = {"name": "high-1", "namespace": "ns", "labels": {"flexinfer.ai/model": "high"},
                  "resourceVersion": version, "creationTimestamp": rfc3339(NOW - timedelta(minutes=1))}
    state: Body = {"running": {}}
    if finished:
        meta["deletionTimestamp"] = rfc3339(NOW)
        state = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    return {"metadata": meta, "status": {"phase": "Running", "containerStatuses": [
        {"name": "model", "restartCount": 0, "state": state}]}}


async def test_the_winner_is_scaled_up_right_after_the_reap_in_the_same_reconcile() -> None:
    store, api, subject = high_holds_the_gpu([])
    store.put("Pod", high_pod("5", finished=False))
    await subject.reconcile(GROUP)
    assert ("apply", "Deployment", "low", "0") in api.calls, "the winner waits while the loser's pod runs"
    store.put("Pod", high_pod("6", finished=True))
    api.calls.clear()
    await subject.reconcile(GROUP)
    writes = [c for c in api.calls if c[0] in ("delete", "apply", "status")]
    assert writes[:2] == [("delete", "Pod", "high-1", "0"), ("apply", "Deployment", "low", "1")], (
        "nothing decided with the pod still there is written between the delete and the scale-up, and no DELETED "
        "event or follow-up reconcile is needed")
    store.put("Pod", high_pod("7", finished=True))  # a late event for the deleted pod
    assert list(store.pods("ns", "high")) == []


async def test_a_cold_starts_scale_up_is_written_before_the_other_members_status() -> None:
    store = Store()
    for name, priority in (("high", 200), ("low", 100)):
        doc = model_doc(name, "ns", gpu={"shared": "g", "priority": priority})
        doc["metadata"]["resourceVersion"] = "1"
        store.put("Model", doc)
    api = Api(store, [])
    subject = reconciler(store, api)
    await subject.reconcile(GROUP)  # both idle: their Deployments at zero
    api.calls.clear()
    since = rfc3339(NOW - timedelta(seconds=1))
    store.put("ModelDemand", report("proxy-a", low={"lastActiveTime": since, "waitingSince": since}))
    await subject.reconcile(GROUP)
    writes = [c for c in api.calls if c[0] in ("apply", "status")]
    assert writes[0] == ("apply", "Deployment", "low", "1"), writes
    assert ("status", "high", "") in writes, "the other member's status still written, after the scale-up"
