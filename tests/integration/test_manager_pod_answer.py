"""The manager asks a starting pod's server itself (issue #28, readiness without probe periods), against the real
apiserver and a real HTTP server standing in for the pod's model server on loopback (the pod's ``podIP`` is
127.0.0.1, as the kubelet would write the pod's address).

While the server answers 503 the Model stays Loading; once it answers 200 the Model is Ready, with
``status.podEndpoint`` naming the pod's own URL, although neither the kubelet (the pod's ``Ready`` condition) nor
the deployment controller (``readyReplicas``) has said so; the cold start ends at that answer. Turned off
(``FLEXINFER_POD_ENDPOINTS=false``), the same answer changes nothing until the kubelet speaks."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web
from lightkube import ApiError
from lightkube.resources.core_v1 import Pod, ServiceAccount
from lightkube.types import PatchType

from support.manager_harness import Cluster, cluster, kube_testbed, manager_config, metric_value, start_manager

pytestmark = pytest.mark.integration
__all__ = ["kube_testbed"]


class Server:
    """A model server's health endpoint: 503 until ``up`` is set; counts the requests."""

    def __init__(self) -> None:
        self.up = asyncio.Event()
        self.asked = 0
        self.asked_once = asyncio.Event()

    async def health(self, _: web.Request) -> web.Response:
        self.asked += 1
        self.asked_once.set()
        return web.Response(status=200 if self.up.is_set() else 503)


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[tuple[Server, int]]:
    server = Server()
    app = web.Application()
    app.router.add_get("/health", server.health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield server, port
    finally:
        await runner.cleanup()


def stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def container_running() -> dict[str, Any]:
    return {"phase": "Running", "containerStatuses": [{
        "name": "model", "ready": False, "restartCount": 0, "image": "llama", "imageID": "",
        "state": {"running": {"startedAt": stamp(datetime.now(UTC))}}}]}


CREATING = {"phase": "Pending", "containerStatuses": [{
    "name": "model", "ready": False, "restartCount": 0, "image": "llama", "imageID": "",
    "state": {"waiting": {"reason": "ContainerCreating"}}}]}
"""As the kubelet reports the pod once its sandbox has an address, before its relist saw the container start."""


async def starting_pod(c: Cluster, model: str, port: int, containers: dict[str, Any] | None = None) -> str:
    """The model's pod as the kubelet reports it once the model container runs (or ``containers``: phase and
    container statuses): on 127.0.0.1, not Ready."""
    name = f"{model}-5c7b9-x2k4p"
    with contextlib.suppress(ApiError):
        await c.client.create(ServiceAccount.from_dict({"metadata": {"name": "default", "namespace": c.namespace}}))
    await c.client.create(Pod.from_dict({
        "metadata": {"name": name, "namespace": c.namespace, "labels": {
            "app.kubernetes.io/managed-by": "flexinfer", "flexinfer.ai/model": model}},
        "spec": {"automountServiceAccountToken": False, "containers": [{
            "name": "model", "image": "llama", "ports": [{"name": "http", "containerPort": port}],
            "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}}}]},
    }))
    now = stamp(datetime.now(UTC))
    status = {"podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
              "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now}],
              **(containers or container_running())}
    await c.client.patch(Pod.Status, name, {"status": status}, namespace=c.namespace, patch_type=PatchType.MERGE)
    return name


async def test_a_pod_whose_server_answers_is_ready_before_the_kubelet_says_so(kube_testbed: Any) -> None:
    async with cluster(kube_testbed) as c, serving() as (server, port):
        running = await start_manager(manager_config(c))
        try:
            await c.create_model("solo", serverless={"enabled": False})
            await c.replicas_are("solo", 1)
            await starting_pod(c, "solo", port, CREATING)  # asked before the kubelet reports it running
            await c.set_deployment_status("solo", replicas=1, unavailableReplicas=1)
            await asyncio.wait_for(server.asked_once.wait(), 30)
            loading = await c.status("solo")
            assert loading["phase"] in ("Pending", "Loading") and "podEndpoint" not in loading
            server.up.set()
            ready = await c.phase_is("solo", "Ready")
            assert ready["podEndpoint"] == f"http://127.0.0.1:{port}"
            assert ready["endpoint"].startswith("http://solo.")
            text = await running.metric_is("flexinfer_model_cold_start_duration_seconds_count", 1, model="solo")
            assert metric_value(text, "flexinfer_model_cold_start_duration_seconds_count", model="solo") == 1
        finally:
            assert await running.close() == 0


async def test_turned_off_the_kubelet_and_the_service_decide(kube_testbed: Any) -> None:
    async with cluster(kube_testbed) as c, serving() as (server, port):
        config = manager_config(c)
        running = await start_manager(replace(config, policy=replace(config.policy, pod_endpoints=False)))
        try:
            await c.create_model("solo", serverless={"enabled": False})
            await c.replicas_are("solo", 1)
            server.up.set()
            pod = await starting_pod(c, "solo", port)
            await c.set_deployment_status("solo", replicas=1, unavailableReplicas=1)
            await c.phase_is("solo", "Loading")
            now = stamp(datetime.now(UTC))
            await c.client.patch(Pod.Status, pod, {"status": {"conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": now}]}}, namespace=c.namespace,
                patch_type=PatchType.MERGE)
            await c.set_deployment_status("solo", replicas=1, readyReplicas=1, availableReplicas=1)
            ready = await c.phase_is("solo", "Ready")
            assert "podEndpoint" not in ready and server.asked == 0
        finally:
            assert await running.close() == 0
