"""A model that can never become Ready fails its callers fast, naming the cause (issue #23, defect 6): ``run_manager``
and ``start_proxy`` on the real testbed apiserver, a request through the official ``openai`` client with the
proxy's cold-start budget at 10 minutes. The testbed has no scheduler or kubelet, so the test writes what they
would: the Model's pod with its status (unschedulable, an image pull in back-off, a crash loop) and the
Deployment's status. The manager must mark the Model Failed with the cause on its ``Ready`` condition and in
``message``, post a Warning event named after the cause, and the waiting request must get a 503 naming it within
seconds."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import openai
import pytest
from lightkube.resources.core_v1 import Pod, ServiceAccount
from lightkube.types import PatchType

from flexinfer.assembly.proxy import ClusterProxy, start_proxy
from support.manager_harness import Cluster, cluster, kube_testbed, manager_config, start_manager

pytestmark = pytest.mark.integration
__all__ = ["kube_testbed"]

FAIL_FAST_S = 10.0
"""How long a waiting request may take to learn that its model cannot start (its budget is 10 minutes)."""
AFFINITY = "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity."
CAUSES: dict[str, tuple[dict[str, Any], str, str]] = {
    "unschedulable": ({"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": AFFINITY}]},
        "Unschedulable", "didn't match Pod's node affinity"),
    "typo-image": ({"phase": "Pending", "containerStatuses": [{
        "name": "model", "ready": False, "restartCount": 0, "image": "docker.io/library/vlm:typo", "imageID": "",
        "state": {"waiting": {"reason": "ImagePullBackOff",
                              "message": 'Back-off pulling image "docker.io/library/vlm:typo"'}}}]},
        "ImagePullBackOff", 'Back-off pulling image "docker.io/library/vlm:typo"'),
    "crash-loop": ({"phase": "Running", "containerStatuses": [{
        "name": "model", "ready": False, "restartCount": 2, "image": "vllm", "imageID": "",
        "lastState": {"terminated": {"reason": "Error", "exitCode": 1, "startedAt": "2026-01-01T00:00:00Z",
                                     "finishedAt": "2026-01-01T00:00:01Z"}},
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s restarting failed container"}}}]},
        "CrashLoopBackOff", "container model crashed 2 times (Error, exit code 1)"),
}


async def failing_pod(c: Cluster, model: str, status: dict[str, Any]) -> None:
    """The model's pod, with the status the scheduler or the kubelet would report."""
    name = f"{model}-5c7d9-x2k4q"
    # No service-account controller runs in the testbed; the admission plugin still wants the account.
    await c.client.create(ServiceAccount.from_dict({"metadata": {"name": "default", "namespace": c.namespace}}))
    await c.client.create(Pod.from_dict({
        "metadata": {"name": name, "namespace": c.namespace, "labels": {
            "app.kubernetes.io/managed-by": "flexinfer", "flexinfer.ai/model": model}},
        "spec": {"automountServiceAccountToken": False, "containers": [
            {"name": "model", "image": "vllm", "resources": {"limits": {"amd.com/gpu": "1"}}}]},
    }))
    await c.client.patch(Pod.Status, name, {"status": status}, namespace=c.namespace, patch_type=PatchType.MERGE)


async def chat(proxy: ClusterProxy, model: str) -> str:
    async with openai.AsyncOpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0,
                                  timeout=600) as client:
        reply = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    return reply.choices[0].message.content or ""


@pytest.mark.parametrize("cause", list(CAUSES))
async def test_a_waiting_request_fails_fast_naming_why_its_model_cannot_start(kube_testbed: Any, cause: str) -> None:
    pod_status, reason, words = CAUSES[cause]
    async with cluster(kube_testbed) as c:
        running = await start_manager(manager_config(c))
        proxy = await start_proxy(host="127.0.0.1", port=0, env={
            "POD_NAMESPACE": c.namespace, "POD_NAME": "proxy-0", "PROXY_SHUTDOWN_DRAIN_DELAY": "0",
            "PROXY_COLD_START_TIMEOUT": "10m", "PROXY_QUEUE_TIMEOUT": "10m", "FLEXINFER_OTEL_ENABLED": "false",
            "KUBECONFIG": str(c.kubeconfig)})
        try:
            await c.create_model("broken", gpu={"vendor": "amd"})
            await c.phase_is("broken", "Idle")
            began = time.monotonic()
            request = asyncio.create_task(chat(proxy, "broken"))
            await c.replicas_are("broken", 1)  # the proxy's demand scaled it up
            await c.set_deployment_status("broken", replicas=1, unavailableReplicas=1)
            await failing_pod(c, "broken", pod_status)
            with pytest.raises(openai.APIStatusError) as failure:
                await asyncio.wait_for(request, FAIL_FAST_S)
            waited = time.monotonic() - began
            error = failure.value.body
            assert failure.value.status_code == 503 and isinstance(error, dict), failure.value
            assert error["code"] == "activation_failed" and reason in error["message"] and words in error["message"]
            print(f"\n{cause}: the waiting request got 503 after {waited:.2f}s: {error['message']}")

            status = await c.status("broken")
            assert status["phase"] == "Failed" and reason in status["message"] and words in status["message"]
            ready = next(x for x in status["conditions"] if x["type"] == "Ready")
            assert (ready["status"], ready["reason"]) == ("False", reason)
            warnings = [e for e in await c.events("broken") if e["type"] == "Warning"]
            assert [e["reason"] for e in warnings] == [reason] and words in warnings[0]["message"]

            started = time.monotonic()
            with pytest.raises(openai.APIStatusError) as again:  # a later request: at once, not the budget
                await asyncio.wait_for(chat(proxy, "broken"), FAIL_FAST_S)
            assert again.value.status_code == 503 and words in str(again.value.body)
            assert time.monotonic() - started < 2.0
        finally:
            await proxy.close()
            assert await running.close() == 0
