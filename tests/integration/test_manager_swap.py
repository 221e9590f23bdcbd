"""Shared-GPU swaps driven by proxy demand, the in-flight drain, and a manager restart mid-swap — against a
real kube-apiserver (Deployments are marked ready through their status subresource)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from lightkube import ApiError
from lightkube.types import PatchType

from flexinfer.api.conventions import WAITING_SINCE_ANNOTATION
from flexinfer.core.election import ElectionPolicy
from flexinfer.core.model_status.plan import ManagerPolicy
from flexinfer.manager.client import ModelResource
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


@pytest.mark.parametrize("legacy", [False, True], ids=["modeldemand", "legacy-annotation"])
async def test_a_member_waiting_past_max_wait_preempts_a_busy_higher_priority_leader(kube_testbed: Any,
                                                                                    legacy: bool) -> None:
    """The proxy's wait marker (``waitingSince`` in its ModelDemand; the ``flexinfer.ai/waiting-since``
    annotation of a pre-ModelDemand proxy still counts) feeds the starvation bound: ``high`` is Ready
    with fresh demand, ``low`` waits; once the wait exceeds ``max_wait`` (2 s here) the manager's timer
    fires and ``low`` takes the GPU."""
    policy = ManagerPolicy(election=ElectionPolicy(max_wait=2.0))
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
            await c.demand("high")  # busy: well inside the 2 m demand window for the rest of the test
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
            await c.replicas_are("high", 0)
            await c.replicas_are("low", 1)

            async def low_active() -> bool:  # the status is written after the Deployment is applied
                return (await c.status("low")).get("sharedGroup", {}).get("state") == "Active"
            await c.wait_for(low_active, what="low Active")
            await running.metric_is("flexinfer_sharedgroup_preemptions_total", 1, **{"from": "high", "to": "low"})
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
