"""Shared-GPU swaps driven by proxy demand, the in-flight drain, and a manager restart mid-swap — against a
real kube-apiserver (Deployments are marked ready through their status subresource)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from lightkube import ApiError
from lightkube.resources.core_v1 import Pod, ServiceAccount
from lightkube.types import PatchType

from flexinfer.api.conventions import WAITING_SINCE_ANNOTATION
from flexinfer.core.election import ElectionPolicy
from flexinfer.core.model_status.plan import ManagerPolicy
from flexinfer.manager.client import ModelResource
from support.kubelet_script import model_pod, pod_ready
from support.manager_harness import (
    Cluster,
    cluster,
    kube_testbed,
    manager_config,
    metric_value,
    rfc3339,
    start_manager,
)

pytestmark = pytest.mark.integration
__all__ = ["kube_testbed"]


def shared(priority: int) -> dict[str, Any]:
    return {"gpu": {"vendor": "amd", "shared": "gfx1100-0", "priority": priority}}


async def make_low_ready(c: Cluster) -> None:
    """``low`` (priority 100) activated by demand and Ready; ``high`` (200) idle in the same group."""
    await c.create_model("low", **shared(100))
    await c.create_model("high", **shared(200))
    await c.phase_is("low", "Idle")
    await c.phase_is("high", "Idle")
    await c.demand("low")
    await c.replicas_are("low", 1)
    await c.set_deployment_status("low", replicas=1, readyReplicas=1, availableReplicas=1)
    await c.phase_is("low", "Ready")


async def test_demand_for_a_higher_priority_member_swaps_the_gpu(kube_testbed: Any) -> None:
    async with cluster(kube_testbed) as c:
        running = await start_manager(manager_config(c))
        try:
            await make_low_ready(c)
            await c.demand("high")
            low = await c.phase_is("low", "Preempted")
            assert low["sharedGroup"]["state"] == "Preempted" and low["sharedGroup"]["preemptedBy"] == "high"
            assert low["loadingSubstage"] == "Preempted" and "high" in low["message"]
            await c.replicas_are("low", 0)
            await c.replicas_are("high", 1)

            async def activation_recorded() -> dict[str, Any] | None:
                status = await c.status("high")
                return status if "activation" in status else None
            high = await c.wait_for(activation_recorded, what="high's activation in status")
            assert high["activation"]["kind"] == "swap" and high["activation"]["preempted"] == "low"

            async def preempted_event() -> list[Any]:
                return [e for e in await c.events("low") if e["reason"] == "Preempted"]
            assert (await c.wait_for(preempted_event, what="Preempted event"))[0]["type"] == "Normal"

            await c.set_deployment_status("high", replicas=1, readyReplicas=1, availableReplicas=1)
            high = await c.phase_is("high", "Ready")
            assert "activation" not in high and "preemptedAt" not in high["sharedGroup"]
            text = await running.metric_is("flexinfer_model_swap_duration_seconds_count", 1, model="high")
            assert metric_value(text, "flexinfer_model_cold_start_duration_seconds_count", model="high") == 1
            assert metric_value(text, "flexinfer_model_cold_start_duration_seconds_count", model="low") == 1
            assert metric_value(text, "flexinfer_sharedgroup_preemptions_total", **{"from": "low", "to": "high"}) == 1
            assert metric_value(text, "flexinfer_sharedgroup_state", model="low", state="Preempted") == 1
        finally:
            assert await running.close() == 0


async def test_the_winner_is_scaled_up_only_once_the_losers_pod_is_gone(kube_testbed: Any) -> None:
    """Issue #28: scaled up while the loser's pod terminates, the winner's pod would sit Pending on the device
    through the scheduler's back-off. ``high`` takes the GPU from ``low``: ``low`` is scaled to zero at once,
    ``high`` stays at zero (Active, its swap recorded) while ``low``'s pod exists, and is scaled up when that pod
    is deleted; the swap is measured from the decision, so the wait for the pod counts in it. ``high``'s request
    has waited past ``high``'s own idle timeout by then: a waiting request keeps it from being idle."""
    async with cluster(kube_testbed) as c:
        running = await start_manager(manager_config(c))
        try:
            await make_low_ready(c)
            await c.client.patch(ModelResource, "high", {"spec": {"serverless": {"idleTimeout": "15s"}}},
                                 namespace=c.namespace, patch_type=PatchType.MERGE)
            pod = await model_pod(c, "low")
            await pod_ready(c, pod)
            asked = datetime.now(UTC) - timedelta(seconds=20)
            await c.report("high", lastActiveTime=rfc3339(asked), waitingSince=rfc3339(asked))
            await c.phase_is("low", "Preempted")
            await c.replicas_are("low", 0)

            async def swap_recorded() -> dict[str, Any] | None:
                status = await c.status("high")
                shared = status.get("sharedGroup") or {}
                return status if "activation" in status and shared.get("state") == "Active" else None
            high = await c.wait_for(swap_recorded, what="high Active with its swap recorded")
            assert high["activation"]["kind"] == "swap" and high["activation"]["preempted"] == "low"
            assert await c.replicas("high") == 0, "scaled up while low's pod still holds the device"
            await c.client.delete(Pod, pod, namespace=c.namespace, grace_period=0)
            await c.replicas_are("high", 1)
            await c.set_deployment_status("high", replicas=1, readyReplicas=1, availableReplicas=1)
            await c.phase_is("high", "Ready")
            await running.metric_is("flexinfer_model_swap_duration_seconds_count", 1, model="high")
        finally:
            assert await running.close() == 0


async def test_a_losers_pod_whose_containers_exited_is_deleted_at_once(kube_testbed: Any) -> None:
    """The kubelet deletes a pod whose containers have exited only at its next status sync (12 s seen on the node):
    the manager deletes it itself, with grace period 0, while the winner waits for it. ``low``'s pod (bound to a
    node, held by a finalizer here so the test sees the manager's delete) terminates; once its container has
    exited the manager's delete shortens its grace period to 0, and when it is gone ``high`` is scaled up."""
    async with cluster(kube_testbed) as c:
        running = await start_manager(manager_config(c))
        try:
            await make_low_ready(c)
            pod = "low-7d9c4-f5g6h"
            await c.client.create(ServiceAccount.from_dict({"metadata": {"name": "default",
                                                                         "namespace": c.namespace}}))
            await c.client.create(Pod.from_dict({
                "metadata": {"name": pod, "namespace": c.namespace, "finalizers": ["test.flexinfer.ai/hold"],
                             "labels": {"app.kubernetes.io/managed-by": "flexinfer", "flexinfer.ai/model": "low"}},
                "spec": {"nodeName": "gpu-node-0", "automountServiceAccountToken": False,
                         "containers": [{"name": "model", "image": "llama"}]}}))
            await c.client.patch(Pod.Status, pod, {"status": {"phase": "Running", "containerStatuses": [
                {"name": "model", "ready": True, "restartCount": 0, "image": "llama", "imageID": "",
                 "state": {"running": {"startedAt": rfc3339()}}}]}}, namespace=c.namespace,
                patch_type=PatchType.MERGE)
            await c.demand("high")
            await c.replicas_are("low", 0)
            await c.client.delete(Pod, pod, namespace=c.namespace)  # what the ReplicaSet does when scaled to 0

            async def grace() -> int | None:
                meta = (await c.client.get(Pod, pod, namespace=c.namespace)).metadata
                return meta.deletionGracePeriodSeconds if meta and meta.deletionTimestamp else None
            assert await c.wait_for(grace, what="low's pod terminating") > 0
            assert await c.replicas("high") == 0
            await c.client.patch(Pod.Status, pod, {"status": {"containerStatuses": [
                {"name": "model", "ready": False, "restartCount": 0, "image": "llama", "imageID": "",
                 "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": rfc3339(),
                                          "finishedAt": rfc3339()}}}]}}, namespace=c.namespace,
                patch_type=PatchType.MERGE)

            async def deleted_now() -> bool:
                return await grace() == 0
            await c.wait_for(deleted_now, what="the manager's delete with grace period 0")
            await c.client.patch(Pod, pod, {"metadata": {"finalizers": None}}, namespace=c.namespace,
                                 patch_type=PatchType.MERGE)
            await c.replicas_are("high", 1)
        finally:
            assert await running.close() == 0


@pytest.mark.parametrize("legacy", [False, True], ids=["modeldemand", "legacy-annotation"])
async def test_a_member_waiting_past_max_wait_preempts_a_busy_higher_priority_leader(kube_testbed: Any,
                                                                                    legacy: bool) -> None:
    """The proxy's wait marker (``waitingSince`` in its ModelDemand; the ``flexinfer.ai/waiting-since``
    annotation of a pre-ModelDemand proxy still counts) feeds the starvation bound: ``high`` is Ready
    with fresh demand, ``low`` waits; once the wait exceeds ``max_wait`` (2 s here) the manager's timer
    fires and ``low`` takes the GPU."""
    policy = ManagerPolicy(election=ElectionPolicy(min_hold=0.0, max_wait=2.0))
    async with cluster(kube_testbed) as c:
        running = await start_manager(manager_config(c, policy=policy))
        try:
            await c.create_model("high", **shared(200))
            await c.create_model("low", **shared(100))
            await c.phase_is("low", "Idle")
            await c.demand("high")
            await c.replicas_are("high", 1)
            await c.set_deployment_status("high", replicas=1, readyReplicas=1, availableReplicas=1)
            await c.phase_is("high", "Ready")
            await c.demand("high")  # wanted: well inside the 2 m demand window for the rest of the test
            await c.report("high", "proxy-busy", inFlightAt=rfc3339())  # and busy: an idle holder would yield
            since = datetime.now(UTC) - timedelta(seconds=0.5)
            await c.demand("low", since, legacy=legacy)  # the proxy signals demand when the first request waits
            if legacy:
                await c.client.patch(ModelResource, "low", {"metadata": {"annotations": {
                    WAITING_SINCE_ANNOTATION: rfc3339(since)}}}, namespace=c.namespace, patch_type=PatchType.MERGE)
            else:
                await c.report("low", waitingSince=rfc3339(since))
            high = await c.phase_is("high", "Preempted")
            assert high["sharedGroup"]["preemptedBy"] == "low"
            preempted_at = datetime.fromisoformat(high["sharedGroup"]["preemptedAt"])
            assert preempted_at >= since + timedelta(seconds=1), "not before the bound (preemptedAt is in seconds)"
            await c.report("high", "proxy-busy", inFlightAt=None)  # its requests drained
            await c.replicas_are("high", 0)
            await c.replicas_are("low", 1)

            async def low_active() -> bool:  # the status is written after the Deployment is applied
                return (await c.status("low")).get("sharedGroup", {}).get("state") == "Active"
            await c.wait_for(low_active, what="low Active")
            await running.metric_is("flexinfer_sharedgroup_preemptions_total", 1, **{"from": "high", "to": "low"})
        finally:
            assert await running.close() == 0


async def test_an_idle_higher_priority_holder_gives_the_gpu_back_after_min_hold(kube_testbed: Any) -> None:
    """Issue #23, defect 7: ``low`` (100) cold-started, ``high`` (200) took the GPU, and ``low`` is asked for
    again. While ``high`` serves (an in-flight report) it keeps the GPU; once it is idle, ``low`` takes it back
    as soon as ``high`` has held it ``min_hold`` since Ready — well before ``max_wait`` (the starvation bound),
    and not after a 5-minute cooldown or ``high``'s idle timeout."""
    policy = ManagerPolicy(election=ElectionPolicy(min_hold=1.0, max_wait=120.0))
    async with cluster(kube_testbed) as c:
        running = await start_manager(manager_config(c, policy=policy))
        try:
            await make_low_ready(c)
            await c.demand("high")
            await c.phase_is("low", "Preempted")
            await c.replicas_are("high", 1)
            await c.set_deployment_status("high", replicas=1, readyReplicas=1, availableReplicas=1)
            high = await c.phase_is("high", "Ready")
            ready_at = datetime.fromisoformat(next(x["lastTransitionTime"] for x in high["conditions"]
                                                   if x["type"] == "Ready"))
            await c.report("high", "proxy-busy", inFlightAt=rfc3339())
            waiting = datetime.now(UTC)
            await c.demand("low", waiting)
            await c.report("low", waitingSince=rfc3339(waiting))

            async def hold_over() -> bool:
                return datetime.now(UTC) > ready_at + timedelta(seconds=1.2)
            await c.wait_for(hold_over, what="high's hold to end")
            queue = running.manager.queue
            before = queue.processed
            await c.report("high", "proxy-busy", inFlightAt=rfc3339())  # the proxy's heartbeat re-stamps it

            async def decided() -> bool:  # a pass after the hold has run and nothing else is queued
                if queue.processed <= before:
                    return False
                await queue.idle()
                return True
            await c.wait_for(decided, what="a reconcile after the hold")
            assert (await c.status("high"))["phase"] == "Ready", "a busy higher-priority holder keeps the GPU"
            await c.report("high", "proxy-busy", inFlightAt=None)  # its last request ended
            high = await c.phase_is("high", "Preempted")
            assert high["sharedGroup"]["preemptedBy"] == "low"
            preempted_at = datetime.fromisoformat(high["sharedGroup"]["preemptedAt"])
            assert preempted_at >= ready_at + timedelta(seconds=1), "not within min_hold of Ready"
            assert preempted_at < waiting + timedelta(seconds=60), "long before the starvation bound"
            await c.replicas_are("high", 0)
            await c.replicas_are("low", 1)
        finally:
            assert await running.close() == 0


async def busy_patch(c: Cluster, model: str, proxy: str) -> None:
    """A pre-ModelDemand proxy's in-flight report: add the annotation only while the model is still Ready."""
    key = f"inflight.flexinfer.ai~1{proxy}"
    ops = [{"op": "test", "path": "/status/phase", "value": "Ready"},
           {"op": "add", "path": f"/metadata/annotations/{key}", "value": rfc3339()}]
    body = await c.model(model)
    if not body["metadata"].get("annotations"):
        ops.insert(1, {"op": "add", "path": "/metadata/annotations", "value": {}})
    await c.client.patch(ModelResource, model, ops, namespace=c.namespace, patch_type=PatchType.JSON)


async def test_a_preempted_member_drains_in_flight_requests_reported_in_a_modeldemand(kube_testbed: Any) -> None:
    async with cluster(kube_testbed) as c:
        running = await start_manager(manager_config(c))
        try:
            await make_low_ready(c)
            await c.report("low", "proxy-a", inFlightAt=rfc3339())
            await c.demand("high")
            await c.phase_is("low", "Preempted")
            await c.replicas_are("high", 1)
            await running.manager.queue.idle()
            assert await c.replicas("low") == 1, "kept serving while proxy-a reports in-flight requests"
            # A proxy reporting only now reads the Model afterwards and finds it no longer Ready: it does
            # not forward (kube.inflight_report), so the manager need not wait for it.
            await c.report("low", "proxy-b", inFlightAt=rfc3339())
            assert (await c.status("low"))["phase"] == "Preempted"
            await c.report("low", "proxy-b", inFlightAt=None)
            await c.report("low", "proxy-a", inFlightAt=None)
            await c.replicas_are("low", 0)
        finally:
            await running.close()


async def test_a_preempted_member_drains_in_flight_requests_of_a_pre_modeldemand_proxy(kube_testbed: Any) -> None:
    async with cluster(kube_testbed) as c:
        running = await start_manager(manager_config(c))
        try:
            await make_low_ready(c)
            await busy_patch(c, "low", "proxy-a")
            await c.demand("high")
            await c.phase_is("low", "Preempted")
            await c.replicas_are("high", 1)
            await running.manager.queue.idle()
            assert await c.replicas("low") == 1, "kept serving while proxy-a reports in-flight requests"
            with pytest.raises(ApiError):  # a proxy that has not reported yet can no longer start forwarding
                await busy_patch(c, "low", "proxy-b")

            await c.client.patch(ModelResource, "low",
                                 {"metadata": {"annotations": {"inflight.flexinfer.ai/proxy-a": None}}},
                                 namespace=c.namespace, patch_type=PatchType.MERGE)
            await c.replicas_are("low", 0)
        finally:
            await running.close()


async def test_a_manager_restarted_mid_swap_converges_and_still_measures_the_swap(kube_testbed: Any) -> None:
    async with cluster(kube_testbed) as c:
        first = await start_manager(manager_config(c))
        await make_low_ready(c)
        await c.demand("high")
        await c.phase_is("low", "Preempted")
        await c.replicas_are("high", 1)

        async def swap_recorded() -> bool:  # the decision is in high's status (written after the scale-up)
            return (await c.status("high")).get("activation", {}).get("kind") == "swap"
        await c.wait_for(swap_recorded, what="high's swap activation in status")
        assert await first.close() == 0

        # While no manager runs, the winner's pod becomes ready.
        await c.set_deployment_status("high", replicas=1, readyReplicas=1, availableReplicas=1)
        second = await start_manager(manager_config(c))
        try:
            high = await c.phase_is("high", "Ready")
            assert high["sharedGroup"]["state"] == "Active" and "activation" not in high
            low = await c.status("low")
            assert low["phase"] == "Preempted" and await c.replicas("low") == 0
            await second.metric_is("flexinfer_model_swap_duration_seconds_count", 1, model="high")
        finally:
            await second.close()


async def test_an_active_gpu_lease_parks_the_whole_group(kube_testbed: Any) -> None:
    from flexinfer.manager.sync import GPULeaseResource

    async with cluster(kube_testbed) as c:
        running = await start_manager(manager_config(c))
        try:
            await make_low_ready(c)
            lease = {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "GPULease",
                     "metadata": {"name": "finetune", "namespace": c.namespace},
                     "spec": {"group": "gfx1100-0", "owner": "trainer"}}
            await c.client.create(GPULeaseResource.from_dict(lease))
            low = await c.phase_is("low", "Preempted")
            assert low["sharedGroup"]["preemptedBy"] == "gpu-lease/trainer"
            await c.replicas_are("low", 0)
            await c.client.delete(GPULeaseResource, "finetune", namespace=c.namespace)
            await c.demand("low", legacy=True)  # a Go proxy's demand (status.lastActiveTime) still counts
            await c.replicas_are("low", 1)
        finally:
            await running.close()
