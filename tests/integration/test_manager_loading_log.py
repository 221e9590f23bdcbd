"""The loading substage refined from the model server's log, through the real apiserver: a pod whose
``model`` container runs but is not ready. The testbed has no kubelet, so the apiserver cannot serve the
log (the real failure path: the substage stays as the container state says); then a scripted log tail
stands in for the kubelet and the manager's log timer carries the vLLM shard progress into the status."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from lightkube.resources.core_v1 import Pod, ServiceAccount
from lightkube.types import PatchType

from flexinfer.core.model_status.plan import ManagerPolicy
from support.manager_harness import Cluster, cluster, kube_testbed, manager_config, rfc3339, start_manager

pytestmark = pytest.mark.integration
__all__ = ["kube_testbed"]


async def loading_pod(c: Cluster, model: str) -> str:
    """A pod of ``model`` whose ``model`` container is running and not ready (what a kubelet would report)."""
    name = f"{model}-7d9f-abcde"
    # No service-account controller runs in the testbed; the admission plugin still wants the account.
    await c.client.create(ServiceAccount.from_dict({"metadata": {"name": "default", "namespace": c.namespace}}))
    await c.client.create(Pod.from_dict({
        "metadata": {"name": name, "namespace": c.namespace, "labels": {
            "app.kubernetes.io/managed-by": "flexinfer", "flexinfer.ai/model": model}},
        "spec": {"automountServiceAccountToken": False, "containers": [{"name": "model", "image": "vllm"}]},
    }))
    started = rfc3339(datetime.now(UTC))
    await c.client.patch(Pod.Status, name, {"status": {"phase": "Running", "containerStatuses": [{
        "name": "model", "ready": False, "restartCount": 0, "image": "vllm", "imageID": "",
        "state": {"running": {"startedAt": started}}}]}}, namespace=c.namespace, patch_type=PatchType.MERGE)
    return name


async def test_the_log_tail_refines_the_loading_substage_and_moves_the_progress_stamp(kube_testbed: Any) -> None:
    async with cluster(kube_testbed) as c:
        running = await start_manager(manager_config(c, policy=ManagerPolicy(log_poll_interval=0.2)))
        try:
            await c.create_model("solo", serverless={"enabled": False})
            await c.replicas_are("solo", 1)
            await c.set_deployment_status("solo", replicas=1, unavailableReplicas=1)
            pod = await loading_pod(c, "solo")

            async def container_state_only() -> dict[str, Any] | None:
                status = await c.status("solo")
                return status if "readiness probe not passing" in str(status.get("message")) else None
            status = await c.wait_for(container_state_only, what="substage from the container state")
            assert status["phase"] == "Loading" and status["loadingSubstage"] == "Initializing"

            reads: list[tuple[str, str, str, int]] = []
            tail = ["INFO loading model", "Loading safetensors checkpoint shards:  25% Completed | 1/4 "
                    "[00:02<00:06,  2.00s/it]"]

            async def scripted_tail(namespace: str, name: str, container: str, lines: int,
                                    previous: bool = False) -> Sequence[str]:
                reads.append((namespace, name, container, lines))
                return list(tail)
            running.manager.api.pod_log_tail = scripted_tail  # type: ignore[method-assign]

            async def message_is(text: str) -> dict[str, Any] | None:
                status = await c.status("solo")
                return status if status.get("message") == text else None
            first = await c.wait_for(lambda: message_is("loading weights (1/4 shards, 2.00s/it)"),
                                     what="shard progress from the log timer")
            assert first["loadingSubstage"] == "LoadingWeights"
            assert reads[-1] == (c.namespace, pod, "model", 200)

            tail.append("Loading safetensors checkpoint shards:  75% Completed | 3/4 [00:06<00:02,  2.00s/it]")
            second = await c.wait_for(lambda: message_is("loading weights (3/4 shards, 2.00s/it)"),
                                      what="newer shard progress")
            assert second["loadingProgressAt"] > first["loadingProgressAt"]

            await c.set_deployment_status("solo", replicas=1, readyReplicas=1, availableReplicas=1,
                                          unavailableReplicas=0)
            ready = await c.phase_is("solo", "Ready")
            assert "loadingSubstage" not in ready and "message" not in ready
            reads_when_ready = len(reads)

            async def log_timer_done() -> bool:  # the last armed log timer fired and was not armed again
                return not running.manager.queue.pending_timers()
            await c.wait_for(log_timer_done, what="no pending reconcile timer")
            assert len(reads) == reads_when_ready, "a Ready model's log is not read"
        finally:
            await running.close()
