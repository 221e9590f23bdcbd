"""Running ``flexinfer manager`` in-process against the real testbed apiserver.

- ``kube_testbed`` (session fixture): etcd + kube-apiserver (built on first use) with the generated CRDs.
- ``Cluster``: a lightkube client on one fresh namespace per test, with helpers to create Models, patch a
  Deployment's status subresource (there is no kubelet or deployment controller), read objects, and
  ``wait_for`` a condition with a deadline (watch-free polling every 20 ms, never a fixed sleep).
- ``RunningManager``: ``assembly.run_manager`` in a task, its registry, its ``/metrics`` text.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Event, Namespace, Service
from lightkube.types import PatchType
from prometheus_client import CollectorRegistry

from flexinfer.assembly.manager import run_manager
from flexinfer.core.election import ElectionPolicy
from flexinfer.core.model_status.plan import ManagerPolicy
from flexinfer.manager.client import ModelDemandResource, ModelResource
from flexinfer.manager.config import ManagerConfig
from flexinfer.manager.program import Manager
from support.kube_testbed import KubeTestbed
from support.polling import poll_until

T = TypeVar("T")
Body = dict[str, Any]


@pytest.fixture(scope="session")
def kube_testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeTestbed]:
    """A real apiserver with the FlexInfer CRDs established (built when missing; never skipped)."""
    with KubeTestbed(tmp_path_factory.mktemp("kube") / "tb") as testbed:
        yield testbed.install_crds()


def rfc3339(moment: datetime | None = None) -> str:
    return (moment or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def model_body(name: str, namespace: str, **spec: Any) -> Body:
    body: Body = {"backend": "vllm", "source": "HF://org/model"}
    body.update(spec)
    return {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model",
            "metadata": {"name": name, "namespace": namespace}, "spec": body}


@dataclass
class Cluster:
    """Test-side access to one namespace of the testbed."""

    client: AsyncClient
    namespace: str
    kubeconfig: Path

    async def create_model(self, name: str, **spec: Any) -> Body:
        created = await self.client.create(ModelResource.from_dict(model_body(name, self.namespace, **spec)))
        return created.to_dict()

    async def model(self, name: str) -> Body:
        return (await self.client.get(ModelResource, name, namespace=self.namespace)).to_dict()

    async def status(self, name: str) -> Body:
        return (await self.model(name)).get("status") or {}

    async def deployment(self, name: str) -> Body | None:
        try:
            return (await self.client.get(Deployment, name, namespace=self.namespace)).to_dict()
        except ApiError as error:
            if error.status.code == 404:
                return None
            raise

    async def service(self, name: str) -> Body | None:
        try:
            return (await self.client.get(Service, name, namespace=self.namespace)).to_dict()
        except ApiError as error:
            if error.status.code == 404:
                return None
            raise

    async def replicas(self, name: str) -> int | None:
        body = await self.deployment(name)
        return None if body is None else int(body["spec"].get("replicas", 0))

    async def set_deployment_status(self, name: str, **status: int) -> None:
        """What the deployment controller + kubelet would report (``readyReplicas``, ``unavailableReplicas``)."""
        await self.client.patch(Deployment.Status, name, {"status": status}, namespace=self.namespace,
                                patch_type=PatchType.MERGE)

    async def demand(self, name: str, when: datetime | None = None, *, legacy: bool = False) -> None:
        """The proxy's demand signal: ``lastActiveTime`` in the proxy's ModelDemand report, or (``legacy``)
        the merge patch of the Model's ``status.lastActiveTime`` a Go or pre-ModelDemand proxy writes."""
        if legacy:
            await self.client.patch(ModelResource.Status, name, {"status": {"lastActiveTime": rfc3339(when)}},
                                    namespace=self.namespace, patch_type=PatchType.MERGE)
        else:
            await self.report(name, lastActiveTime=rfc3339(when))

    async def report(self, name: str, proxy: str = "proxy-test", **fields: str | None) -> None:
        """Write ``fields`` about Model ``name`` into ``proxy``'s ModelDemand (created when absent), with a
        fresh ``renewTime``, as the proxy does."""
        patch = {"spec": {"proxy": proxy, "renewTime": rfc3339(), "models": {name: fields}}}
        try:
            await self.client.patch(ModelDemandResource, proxy, patch, namespace=self.namespace,
                                    patch_type=PatchType.MERGE)
        except ApiError as error:
            if error.status.code != 404:
                raise
            body = {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDemand",
                    "metadata": {"name": proxy, "namespace": self.namespace}, "spec": patch["spec"]}
            await self.client.create(ModelDemandResource.from_dict(body))

    async def events(self, name: str) -> list[Body]:
        return [e.to_dict() async for e in self.client.list(Event, namespace=self.namespace)
                if e.involvedObject.name == name]

    async def wait_for(self, probe: Callable[[], Awaitable[T]], timeout: float = 15.0, what: str = "") -> T:
        """Poll ``probe`` until it returns a truthy value; fail with the last value after ``timeout``."""
        return await poll_until(probe, timeout, what)

    async def phase_is(self, name: str, phase: str, timeout: float = 15.0) -> Body:
        async def probe() -> Body | None:
            status = await self.status(name)
            return status if status.get("phase") == phase else None
        return await self.wait_for(probe, timeout, f"{name} phase {phase}")

    async def replicas_are(self, name: str, replicas: int, timeout: float = 15.0) -> None:
        async def probe() -> bool:
            return await self.replicas(name) == replicas
        await self.wait_for(probe, timeout, f"{name} replicas {replicas}")


@contextlib.asynccontextmanager
async def cluster(testbed: KubeTestbed) -> AsyncIterator[Cluster]:
    """A fresh namespace on the testbed and a client for it."""
    assert testbed.kubeconfig is not None
    client = AsyncClient(KubeConfig.from_file(testbed.kubeconfig), field_manager="test")
    namespace = f"t-{uuid.uuid4().hex[:8]}"
    await client.create(Namespace.from_dict({"metadata": {"name": namespace}}))
    try:
        yield Cluster(client, namespace, testbed.kubeconfig)
    finally:
        await client.close()


@dataclass
class RunningManager:
    """``run_manager`` running in a task of the test's loop."""

    task: asyncio.Task[int]
    stop: asyncio.Event
    registry: CollectorRegistry
    manager: Manager
    started: float = field(default_factory=time.monotonic)

    async def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.manager.endpoints.metrics_port}/metrics"
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            return await response.text()

    async def metric_is(self, name: str, value: float, timeout: float = 15.0, **labels: str) -> str:
        """Poll ``/metrics`` until one sample has ``value``; return that text. Metrics are observed after the
        status write that a test waits for, so a test reading them right after the status must wait too."""
        async def probe() -> str | None:
            text = await self.metrics()
            return text if metric_value(text, name, **labels) == value else None
        return await poll_until(probe, timeout, f"{name}{labels} == {value}")

    async def readyz(self) -> int:
        url = f"http://127.0.0.1:{self.manager.endpoints.health_port}/readyz"
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            return response.status

    async def close(self) -> int:
        self.stop.set()
        return await asyncio.wait_for(self.task, 40)


TEST_POLICY = ManagerPolicy(election=ElectionPolicy(min_hold=0.0))
"""The manager's policy in these tests unless one is given: no hold after Ready, so a swap a test asks for
happens at once (as ``serve`` tests run with ``FLEXINFER_SWAP_MIN_HOLD=0s``); tests of the hold set their own."""


def manager_config(c: Cluster, **overrides: Any) -> ManagerConfig:
    values: dict[str, Any] = {
        "metrics_bind_address": "127.0.0.1:0", "health_probe_bind_address": "127.0.0.1:0",
        "kubeconfig": str(c.kubeconfig), "namespaces": (c.namespace,), "pod_namespace": c.namespace,
        "identity": f"mgr-{uuid.uuid4().hex[:6]}", "policy": TEST_POLICY,
    }
    values.update(overrides)
    return ManagerConfig(**values)


async def start_manager(config: ManagerConfig, timeout: float = 60.0) -> RunningManager:
    """Start ``run_manager``; return once it serves and (as leader) its operator runs, or it is a ready standby."""
    stop, registry = asyncio.Event(), CollectorRegistry()
    serving: asyncio.Future[Manager] = asyncio.get_running_loop().create_future()
    env = {"FLEXINFER_OTEL_ENABLED": "false"}
    task = asyncio.create_task(run_manager(config, env=env, stop=stop, registry=registry,
                                           on_serving=serving.set_result))
    manager = await asyncio.wait_for(serving, timeout)
    running = RunningManager(task, stop, registry, manager)
    deadline = time.monotonic() + timeout
    while not manager.ready():
        if task.done() or time.monotonic() > deadline:
            raise AssertionError(f"manager did not become ready (task done: {task.done()})")
        await asyncio.sleep(0.02)
    return running


def metric_value(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text (0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
