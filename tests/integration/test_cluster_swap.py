"""A full shared-group swap driven by proxy requests: ``run_manager`` + ``start_proxy`` on the real testbed
apiserver, two Models in one shared group, each reached through the test-only endpoint override at its own
in-process fake OpenAI server. A small "kubelet" task marks Deployments ready (status subresource) as the
manager scales them. Requests alternate between the models; every one must succeed, the models must swap
(Preempted/Ready transitions, Preempted events) and the manager's swap histogram must have samples.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from aiohttp import web
from lightkube.resources.apps_v1 import Deployment
from lightkube.types import PatchType

from flexinfer.assembly.proxy import ClusterProxy, start_proxy
from flexinfer.core.election import ElectionPolicy
from flexinfer.core.model_status.plan import ManagerPolicy
from flexinfer.manager.client import ModelResource
from support.fake_openai import FakeOpenAI
from support.manager_harness import Cluster, cluster, kube_testbed, manager_config, start_manager

pytestmark = pytest.mark.integration
__all__ = ["kube_testbed"]  # the testbed fixture (session scope) comes from the manager harness

GROUP = {"gpu": {"vendor": "amd", "shared": "gfx1100-0", "priority": 100}, "cache": {"strategy": "Local"},
         "nodeSelector": {"kubernetes.io/hostname": "gfx1100-0"}}
FAST_ELECTION = ElectionPolicy(min_hold=1.0, demand_window=1.0, recent_window=30.0)
"""Hold and windows shortened so a test can swap back and forth (defaults: 15 s hold, 2 m demand window)."""


async def kubelet(c: Cluster) -> None:
    """Forever: make every Deployment's status report as many ready replicas as it asks for."""
    async for _, obj in c.client.watch(Deployment, namespace=c.namespace):
        wanted = int(obj.spec.replicas or 0)
        status = obj.status
        if status is None or int(status.readyReplicas or 0) != wanted:
            await c.client.patch(Deployment.Status, obj.metadata.name,
                                 {"status": {"replicas": wanted, "readyReplicas": wanted,
                                             "availableReplicas": wanted, "unavailableReplicas": 0}},
                                 namespace=c.namespace, patch_type=PatchType.MERGE)


async def record_phases(c: Cluster, seen: list[tuple[str, str]]) -> None:
    """Forever: append (model, phase) whenever a Model's phase changes."""
    last: dict[str, str] = {}
    async for _, obj in c.client.watch(ModelResource, namespace=c.namespace):
        body = obj.to_dict()
        name, phase = body["metadata"]["name"], (body.get("status") or {}).get("phase", "")
        if phase and last.get(name) != phase:
            last[name] = phase
            seen.append((name, phase))


@contextlib.asynccontextmanager
async def upstream() -> AsyncIterator[tuple[FakeOpenAI, str]]:
    fake = FakeOpenAI()
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield fake, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


async def chat(proxy: ClusterProxy, model: str) -> str:
    async with openai.AsyncOpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0, timeout=60) as client:
        reply = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    return reply.choices[0].message.content or ""


def swap_samples(metrics: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("flexinfer_model_swap_duration_seconds_count"))


async def test_requests_alternating_between_two_group_members_swap_the_gpu(kube_testbed: Any) -> None:
    async with cluster(kube_testbed) as c, upstream() as (alpha_fake, alpha_url), \
            upstream() as (beta_fake, beta_url):
        running = await start_manager(manager_config(c, policy=ManagerPolicy(election=FAST_ELECTION)))
        background = [asyncio.create_task(kubelet(c))]
        phases: list[tuple[str, str]] = []
        background.append(asyncio.create_task(record_phases(c, phases)))
        proxy = await start_proxy(host="127.0.0.1", port=0, env={
            "POD_NAMESPACE": c.namespace, "FLEXINFER_PROXY_ENDPOINT_OVERRIDE": "true", "POD_NAME": "proxy-0",
            "PROXY_SHUTDOWN_DRAIN_DELAY": "0", "PROXY_COLD_START_TIMEOUT": "60s", "FLEXINFER_OTEL_ENABLED": "false",
            "KUBECONFIG": str(c.kubeconfig)})
        try:
            for name, url in (("alpha", alpha_url), ("beta", beta_url)):
                await c.create_model(name, **GROUP)
                await c.client.patch(ModelResource, name, {"metadata": {"annotations": {
                    "flexinfer.ai/endpoint-override": url}}}, namespace=c.namespace, patch_type=PatchType.MERGE)
                await c.phase_is(name, "Idle")
            order = ["alpha", "beta", "alpha", "beta"]
            took = []
            for name in order:
                # No think time: the model that just served is idle (nothing in flight), so it yields to the one
                # asked for as soon as its hold (1 s here) has passed since it became Ready.
                started = time.monotonic()
                assert (await asyncio.wait_for(chat(proxy, name), 90)).startswith("tok0")
                took.append(time.monotonic() - started)
            assert [r.body["model"] for r in alpha_fake.requests if r.body] == ["alpha"] * 2  # its served name
            assert len(beta_fake.requests) == 2
            assert ("alpha", "Preempted") in phases and ("beta", "Preempted") in phases
            assert phases.count(("alpha", "Ready")) == 2 and phases.count(("beta", "Ready")) == 2
            events = [e["reason"] for e in await c.events("alpha")]
            assert "Preempted" in events

            async def three_swaps_observed() -> bool:  # observed just after the status write the proxy saw
                return swap_samples(await running.metrics()) >= 3
            assert await c.wait_for(three_swaps_observed, what="three swap observations")
            print("\nalternating requests (first = cold start, then swaps): "
                  + ", ".join(f"{n} {t:.2f}s" for n, t in zip(order, took, strict=True)))
        finally:
            await proxy.close()
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            assert await running.close() == 0
