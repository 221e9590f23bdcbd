"""A long flash-loader copy through the real apiserver: the pod's ``flash-loader`` init container runs
(what a kubelet reports), a scripted log tail stands in for the kubelet's ``pods/log`` (the testbed has
none) and carries the flash-loader's own progress lines; the manager's log timer turns the bytes staged
into ``status.message`` and moves ``loadingProgressAt`` while bytes move — and only then."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from lightkube.resources.core_v1 import Pod, ServiceAccount
from lightkube.types import PatchType

from flexinfer.core.model_status.plan import ManagerPolicy
from flexinfer.flashloader.progress import LogProgress
from support.manager_harness import Cluster, cluster, kube_testbed, manager_config, rfc3339, start_manager

pytestmark = pytest.mark.integration
__all__ = ["kube_testbed"]
MIB = 2**20


async def staging_pod(c: Cluster, model: str) -> str:
    """A pod of ``model`` whose ``flash-loader`` init container runs and whose ``model`` container waits."""
    name = f"{model}-5c7b-fghij"
    await c.client.create(ServiceAccount.from_dict({"metadata": {"name": "default", "namespace": c.namespace}}))
    await c.client.create(Pod.from_dict({
        "metadata": {"name": name, "namespace": c.namespace, "labels": {
            "app.kubernetes.io/managed-by": "flexinfer", "flexinfer.ai/model": model}},
        "spec": {"automountServiceAccountToken": False,
                 "initContainers": [{"name": "flash-loader", "image": "flexinfer"}],
                 "containers": [{"name": "model", "image": "vllm"}]},
    }))
    started = rfc3339(datetime.now(UTC))
    await c.client.patch(Pod.Status, name, {"status": {"phase": "Pending", "initContainerStatuses": [{
        "name": "flash-loader", "ready": False, "restartCount": 0, "image": "flexinfer", "imageID": "",
        "state": {"running": {"startedAt": started}}}], "containerStatuses": [{
        "name": "model", "ready": False, "restartCount": 0, "image": "vllm", "imageID": "",
        "state": {"waiting": {"reason": "PodInitializing"}}}]}}, namespace=c.namespace, patch_type=PatchType.MERGE)
    return name


async def test_staged_bytes_move_the_progress_stamp_and_a_stopped_copy_does_not(kube_testbed: Any) -> None:
    async with cluster(kube_testbed) as c:
        running = await start_manager(manager_config(c, policy=ManagerPolicy(log_poll_interval=0.2)))
        try:
            await c.create_model("big", serverless={"enabled": False},
                                 cache={"strategy": "SharedPVC", "flashLoader": {"enabled": True}})
            await c.replicas_are("big", 1)
            reads: list[tuple[str, str, str, int]] = []
            tail: list[str] = []
            clock = [0.0]
            progress = LogProgress(tail.append, clock=lambda: clock[0])

            async def scripted_tail(namespace: str, name: str, container: str, lines: int,
                                    previous: bool = False) -> Sequence[str]:
                reads.append((namespace, name, container, lines))
                return list(tail[-lines:])
            running.manager.api.pod_log_tail = scripted_tail  # type: ignore[method-assign]
            await c.set_deployment_status("big", replicas=1, unavailableReplicas=1)
            pod = await staging_pod(c, "big")

            async def message_is(text: str) -> dict[str, Any] | None:
                status = await c.status("big")
                return status if status.get("message") == text else None
            fixed = await c.wait_for(lambda: message_is("flash-loader staging weights into tmpfs"),
                                     what="substage from the init container state")
            assert fixed["phase"] == "Loading" and fixed["loadingSubstage"] == "LoadingWeights"

            progress.begin(4, 4096 * MIB)
            clock[0] += 5.0
            progress.advance(512 * MIB)
            first = await c.wait_for(lambda: message_is(
                "staging weights into tmpfs: 512.0 of 4096.0 MiB (12%), 0/4 files"), what="bytes staged")
            assert first["loadingSubstage"] == "LoadingWeights"
            assert first["loadingProgressAt"] > fixed["loadingProgressAt"]
            assert reads[-1] == (c.namespace, pod, "flash-loader", 200)

            clock[0] += 5.0
            progress.advance(1024 * MIB)
            second = await c.wait_for(lambda: message_is(
                "staging weights into tmpfs: 1536.0 of 4096.0 MiB (38%), 0/4 files"), what="more bytes staged")
            assert second["loadingProgressAt"] > first["loadingProgressAt"]

            reads_before = len(reads)
            await c.wait_for(lambda: _more(reads, reads_before + 3), what="three more log reads")
            assert (await c.status("big"))["loadingProgressAt"] == second["loadingProgressAt"], \
                "no new bytes, no progress: a copy that stopped still stalls"
        finally:
            await running.close()


async def _more(reads: list[Any], count: int) -> bool:
    return len(reads) >= count
