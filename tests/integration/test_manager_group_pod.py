"""Group-pod mode (issue #28): a shared group whose strategy is ``TimeSliced`` runs in one group pod — against a
real kube-apiserver, with a real ``flexinfer serve`` (real llama.cpp servers) standing in for the group pod's
container on loopback (the testbed runs no kubelet: ``support.group_pod.StandIn`` starts ``serve`` with the
Deployment's own command, the manifests of the ConfigMap the manager rendered and the admin token of the Secret it
made, and writes the pod as the ReplicaSet and kubelet would, its ``podIP`` 127.0.0.1 and its ``http`` port the one
``serve`` listens on).

The group pod is scaled up by demand and down once every member is idle; the members' phases follow the pod's
own swaps (``kubectl get mdl`` shows them) and ``sharedGroup.groupEndpoint`` names the pod; the pod's cold starts
and swaps reach the manager's histograms; a changed Model is handed to the running pod (its manifest revision
follows) without a restart; a member in another image is refused by name; the last member's deletion removes the
group pod's objects."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import ConfigMap
from lightkube.types import PatchType

from flexinfer.core.manifest_revision import manifest_revision
from flexinfer.manager.client import ModelResource
from support.group_pod import IMAGE, StandIn, admin, chat, pod
from support.group_pod import member as group_member
from support.kube_testbed import KubeTestbed
from support.llama_server import needs_llama_server
from support.local_serve import histogram_count
from support.manager_harness import TEST_POLICY, Cluster, cluster, kube_testbed, manager_config, start_manager
from support.tiny_gguf import write_tiny_gguf

pytestmark = [pytest.mark.integration, needs_llama_server]
__all__ = ["kube_testbed", "pod"]
GROUP = "tiny"
NAME = "flexinfer-group-tiny"
Body = dict[str, Any]


def member(weights: Path, image: str = IMAGE, **extra: Any) -> Body:
    return group_member(GROUP, weights, image, **extra)


async def test_a_time_sliced_group_runs_in_one_group_pod(kube_testbed: KubeTestbed, tmp_path: Path,
                                                         pod: StandIn) -> None:
    weights = {n: write_tiny_gguf(tmp_path / n / "model.gguf", seed=i) for i, n in enumerate(("a", "b"))}
    policy = replace(TEST_POLICY, group_strategies=((GROUP, "TimeSliced"),))
    async with cluster(kube_testbed) as c:
        manager = await start_manager(manager_config(c, policy=policy))
        try:
            for name, path in weights.items():
                await c.create_model(name, **member(path))
            await c.replicas_are(NAME, 0)  # nobody asked yet: no pod holds the GPU
            idle = await c.phase_is("a", "Idle")
            assert idle["sharedGroup"]["strategy"] == "TimeSliced" and "groupEndpoint" not in idle["sharedGroup"]
            assert await c.deployment("a") is None  # no Deployment of its own

            await c.demand("a")  # the proxy's demand brings the group pod up
            await c.replicas_are(NAME, 1)
            await c.phase_is("a", "Loading")
            # reported Pending with its address (the kubelet's relist has not seen the container yet): the
            # manager asks it already, and serve answers
            run = await pod.start(c, tmp_path, phase="Pending")
            url, token = run.url, run.token
            assert "--no-watch" in run.args  # the rendered command's own flags

            async def forwarded() -> Body | None:
                status = await c.status("a")
                return status if status.get("sharedGroup", {}).get("groupEndpoint") == url else None
            await c.wait_for(forwarded, what="a forwarded to the group pod")
            assert (await admin(url, None))[0] == 401  # the admin API wants the Secret's token

            await chat(url, "a")
            await c.phase_is("a", "Ready")
            await chat(url, "b")  # a swap inside the pod: no pod starts or stops
            await c.phase_is("b", "Ready")
            await c.phase_is("a", "Preempted")  # as the pod's engine says: swapped out for b
            assert (await c.status("a"))["sharedGroup"]["groupEndpoint"] == url
            metrics = await manager.metric_is("flexinfer_model_swap_duration_seconds_count", 1, model="b")
            assert histogram_count(metrics, "flexinfer_model_cold_start_duration_seconds", model="a") == 1

            revision = manifest_revision(((await c.client.get(ConfigMap, NAME, namespace=c.namespace))
                                          .to_dict())["data"]["models.yaml"].encode())
            await c.client.patch(ModelResource, "b", {"spec": {"gpu": {"priority": 300}}}, namespace=c.namespace,
                                 patch_type=PatchType.MERGE)

            async def handed_over() -> str | None:
                text = (await c.client.get(ConfigMap, NAME, namespace=c.namespace)).to_dict()["data"]["models.yaml"]
                pushed = manifest_revision(text.encode())
                _, status = await admin(url, token)
                return pushed if pushed != revision and status["config"]["revision"] == pushed else None
            await c.wait_for(handed_over, what="the changed Model handed to the running pod")
            assert run.serve.proc.poll() is None and len(pod.runs) == 1  # reloaded, not restarted

            await c.create_model("c", **member(weights["a"], image="ghcr.io/example/other:2"))
            failed = await c.phase_is("c", "Failed")
            assert "ghcr.io/example/other:2" in failed["message"] and "group-pod mode" in failed["message"]

            await c.replicas_are(NAME, 0, timeout=30)  # every member idle past its idle timeout
            for name in ("a", "b", "c"):
                await c.client.delete(ModelResource, name, namespace=c.namespace)
            await c.wait_for(lambda: _gone(c), what="the group pod's objects deleted")
        finally:
            await manager.close()


async def _gone(c: Cluster) -> bool:
    for kind in (Deployment, ConfigMap):
        try:
            await c.client.get(kind, NAME, namespace=c.namespace)
        except ApiError as error:
            if error.status.code == 404:
                continue
            raise
        return False
    return True
