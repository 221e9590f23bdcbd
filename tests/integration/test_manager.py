"""``flexinfer manager`` against a real kube-apiserver: rendering, status, validation, caches, deletion.

There is no kubelet: pods never run, so the tests mark Deployments ready by patching their status
subresource, as the deployment controller would.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.batch_v1 import Job
from lightkube.types import PatchType

from flexinfer.api.conventions import FINALIZER
from flexinfer.api.model import Model
from flexinfer.core.controller_defaults import ControllerDefaults
from flexinfer.core.manifests.render import render_model
from flexinfer.manager.client import KubeApi, ModelResource
from flexinfer.manager.sync import ModelCacheResource
from support.manager_harness import (
    Cluster,
    cluster,
    kube_testbed,
    manager_config,
    metric_value,
    start_manager,
)

pytestmark = pytest.mark.integration
__all__ = ["kube_testbed"]

GFX1100_SHARED: dict[str, Any] = {
    "gpu": {"vendor": "amd", "shared": "gfx1100-0", "priority": 200},
    "cache": {"strategy": "Local"},
    "nodeSelector": {"kubernetes.io/hostname": "gfx1100-0"},
}


def _container(deployment: dict[str, Any], name: str, init: bool = False) -> dict[str, Any]:
    key = "initContainers" if init else "containers"
    return next(c for c in deployment["spec"]["template"]["spec"][key] if c["name"] == name)


async def test_renders_a_shared_local_gfx1100_model_without_update_loops(kube_testbed: Any) -> None:
    async with cluster(kube_testbed) as c:
        running = await start_manager(manager_config(c))
        try:
            await c.create_model("chat", **GFX1100_SHARED)
            status = await c.phase_is("chat", "Idle")
            deployment = await c.wait_for(lambda: c.deployment("chat"), what="deployment")
            service = await c.service("chat")

            pod = deployment["spec"]["template"]["spec"]
            volumes = {v["name"]: v for v in pod["volumes"]}
            assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
            assert volumes["flash-tmpfs"]["hostPath"]["path"] == f"/dev/shm/flexinfer/{c.namespace}/chat"
            assert _container(deployment, "flash-loader", init=True)
            model = _container(deployment, "model")
            assert model["resources"]["limits"]["amd.com/gpu"] == "1"
            assert {"name": "HSA_OVERRIDE_GFX_VERSION", "value": "11.0.0"} in model["env"]
            assert pod["securityContext"]["supplementalGroups"] == [109, 992]
            assert deployment["spec"]["replicas"] == 0
            assert deployment["metadata"]["ownerReferences"][0]["kind"] == "Model"
            assert service is not None and service["spec"]["ports"][0]["port"] == 8000
            assert status["endpoint"] == f"http://chat.{c.namespace}.svc:8000"
            assert status["sharedGroup"]["state"] == "Active"
            conditions = {x["type"]: x for x in status["conditions"]}
            assert conditions["ConfigValid"]["status"] == "True"
            assert conditions["Ready"]["reason"] == "WaitingForActivation"

            # Re-applying the unchanged rendering changes nothing but (on a 1.20 API server, whose no-op
            # apply in a new second re-stamps managedFields.time) the resourceVersion; the manager itself
            # does not re-apply on a status-only change of the Deployment, so there is no update loop.
            api = KubeApi(c.client)
            parsed = Model.model_validate(await c.model("chat"))
            rendered = render_model(parsed, [], ControllerDefaults(), 0)[0]
            live = await c.deployment("chat")
            assert live is not None
            # The answer as the harness reads objects (lightkube's typed round trip, which drops null fields).
            again = Deployment.from_dict(await api.apply(rendered)).to_dict()
            assert _essence(again) == _essence(live), _diff(live, again)
            assert again["metadata"]["generation"] == live["metadata"]["generation"]
            deployment = live
            before = running.manager.reconciler.applier.applies
            processed = running.manager.queue.processed
            await c.set_deployment_status("chat", observedGeneration=1)
            await c.wait_for(lambda: _gt(running.manager.queue.processed, processed), what="re-reconcile")
            await running.manager.queue.idle()
            after = await c.deployment("chat")
            assert after is not None and after["metadata"]["generation"] == deployment["metadata"]["generation"]
            assert running.manager.reconciler.applier.applies == before
            assert (await c.status("chat"))["conditions"] == status["conditions"]

            # kopf writes nothing on a Model but its finalizer (no diff-base or progress annotations).
            meta = (await c.model("chat"))["metadata"]
            assert meta["finalizers"] == [FINALIZER]
            assert [k for k in meta.get("annotations") or {} if k.startswith("flexinfer.ai/")] == []
        finally:
            assert await running.close() == 0


def _essence(body: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in body["metadata"].items() if k not in ("managedFields", "resourceVersion")}
    return {**body, "metadata": meta}


def _diff(old: dict[str, Any], new: dict[str, Any]) -> str:
    from flexinfer.core.model_status.build import merge_diff

    return repr(merge_diff(old, new))


async def _gt(value: int, floor: int) -> bool:
    return value > floor


async def test_status_follows_the_deployment_and_ready_is_reported_fast(kube_testbed: Any) -> None:
    async with cluster(kube_testbed) as c:
        running = await start_manager(manager_config(c))
        try:
            await c.create_model("solo", serverless={"enabled": False})
            await c.phase_is("solo", "Pending")
            assert await c.replicas("solo") == 1
            await c.set_deployment_status("solo", replicas=1, unavailableReplicas=1)
            await c.phase_is("solo", "Loading")

            started = time.monotonic()
            await c.set_deployment_status("solo", replicas=1, readyReplicas=1, availableReplicas=1,
                                          unavailableReplicas=0)
            status = await c.phase_is("solo", "Ready", timeout=5)
            latency = time.monotonic() - started
            print(f"\nDeployment ready -> Model Ready in status: {latency * 1000:.0f} ms (poll granularity 20 ms)")
            assert latency < 5.0
            assert {x["type"]: x["status"] for x in status["conditions"]}["Ready"] == "True"
            assert "activation" not in status
            text = await running.metric_is("flexinfer_model_cold_start_duration_seconds_count", 1, model="solo")
            assert metric_value(text, "flexinfer_model_phase", model="solo", phase="Ready") == 1
        finally:
            await running.close()


async def test_invalid_spec_fails_with_a_condition_and_a_warning_naming_the_field(kube_testbed: Any) -> None:
    async with cluster(kube_testbed) as c:
        running = await start_manager(manager_config(c))
        try:
            await c.create_model("bad", source="s3://bucket/weights")
            status = await c.phase_is("bad", "Failed")
            condition = next(x for x in status["conditions"] if x["type"] == "ConfigValid")
            assert condition["status"] == "False" and "spec.source" in condition["message"]

            async def warning() -> list[Any]:
                return [e for e in await c.events("bad") if e["type"] == "Warning"]
            events = await c.wait_for(warning, what="ValidationFailed event")
            assert events[0]["reason"] == "ValidationFailed" and "spec.source" in events[0]["message"]
            assert await c.deployment("bad") is None

            await c.client.patch(ModelResource, "bad", {"spec": {"source": "HF://org/fixed"}},
                                 namespace=c.namespace, patch_type=PatchType.MERGE)
            await c.phase_is("bad", "Idle")
        finally:
            await running.close()


async def test_a_matching_modelcache_change_re_renders_the_model(kube_testbed: Any) -> None:
    async with cluster(kube_testbed) as c:
        running = await start_manager(manager_config(c))
        try:
            await c.create_model("coder", source="HF://org/coder", cache={"strategy": "Local"})
            cache = {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
                     "metadata": {"name": "coder-cache", "namespace": c.namespace},
                     "spec": {"source": "HF://org/coder", "flashLoader": {"enabled": True, "concurrency": 8}}}
            await c.client.create(ModelCacheResource.from_dict(cache))
            await c.wait_for(lambda: _flash_concurrency(c, "coder", "8"), what="concurrency 8")
            await c.client.patch(ModelCacheResource, "coder-cache", {"spec": {"flashLoader": {"concurrency": 12}}},
                                 namespace=c.namespace, patch_type=PatchType.MERGE)
            await c.wait_for(lambda: _flash_concurrency(c, "coder", "12"), what="concurrency 12")
            assert not await _flash_concurrency(c, "coder", "8")
        finally:
            await running.close()


async def _flash_concurrency(c: Cluster, name: str, value: str) -> bool:
    deployment = await c.deployment(name)
    if deployment is None or not deployment["spec"]["template"]["spec"].get("initContainers"):
        return False
    loader = _container(deployment, "flash-loader", init=True)
    return value in " ".join(loader.get("args", []) + [str(e.get("value")) for e in loader.get("env", [])])


async def test_deletion_removes_the_objects_and_runs_the_tmpfs_cleanup(kube_testbed: Any) -> None:
    """The cleanup Job goes to the node the model's pod last ran on (``status.gpu.node``); a shared model that
    never ran anywhere gets none (its node selector names a node it never ran on, which may not exist)."""
    async with cluster(kube_testbed) as c:
        running = await start_manager(manager_config(c))
        try:
            for name in ("gone", "never"):
                await c.create_model(name, **GFX1100_SHARED)
                await c.phase_is(name, "Idle")
            model = await c.model("gone")
            assert "flexinfer.ai/model-cleanup" in model["metadata"]["finalizers"]
            await c.client.patch(ModelResource.Status, "gone", {"status": {"gpu": {"node": "node-3"}}},
                                 namespace=c.namespace, patch_type=PatchType.MERGE)
            for name in ("gone", "never"):
                await c.client.delete(ModelResource, name, namespace=c.namespace)

            async def gone() -> bool:
                names = [m.metadata.name async for m in c.client.list(ModelResource, namespace=c.namespace)]
                return not {"gone", "never"} & set(names)
            await c.wait_for(gone, what="models deleted")
            assert await c.deployment("gone") is None and await c.service("gone") is None
            job = (await c.client.get(Job, "gone-tmpfs-cleanup", namespace=c.namespace)).to_dict()
            spec = job["spec"]["template"]["spec"]
            assert spec["containers"][0]["command"] == ["rm", "-rf", f"/dev/shm/flexinfer/{c.namespace}/gone"]
            terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            assert terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["node-3"]
            assert not job["metadata"].get("ownerReferences")
            jobs = [j.metadata.name async for j in c.client.list(Job, namespace=c.namespace)]
            assert jobs == ["gone-tmpfs-cleanup"]
        finally:
            await running.close()


async def test_otel_disabled_start_serves_probes(kube_testbed: Any) -> None:
    async with cluster(kube_testbed) as c:
        running = await start_manager(manager_config(c))
        try:
            assert await running.readyz() == 200
            await asyncio.wait_for(running.metrics(), 5)
        finally:
            assert await running.close() == 0
