"""The proxy's Kubernetes side end to end over a fake API: ``ClusterSide`` (watch cache → dispatcher sync →
KubeEngine) admitting requests the way the proxy handler does, plus its settings."""

from __future__ import annotations

import asyncio

import pytest

from flexinfer.assembly.cluster_proxy import cluster_proxy_settings
from flexinfer.core.errors import ModelFailedError, ModelNotFoundError
from flexinfer.runtime.ports import Endpoint, Grant
from support.cluster_side import cluster_side
from support.fake_model_api import FakeModelApi, idle_model_api, model_body
from support.polling import eventually
from support.recording_engine import key


async def ready(api: FakeModelApi, name: str, endpoint: str = "") -> None:
    await api.set_status(name, {"phase": "Ready", "endpoint": endpoint or f"http://{name}.default.svc:8000"})


def demand_patches(api: FakeModelApi, name: str) -> int:
    return sum(1 for _, n, _ in api.demand_writes if n == name)


async def test_a_request_for_an_idle_model_signals_demand_once_and_is_granted_on_ready() -> None:
    api = await idle_model_api()
    async with cluster_side(api) as cluster:
        waits: list[str] = []
        burst = [asyncio.create_task(cluster.activator.acquire(key("m"), 5, waits.append)) for _ in range(10)]
        await eventually(lambda: demand_patches(api, "m") == 1)
        await api.set_status("m", {"phase": "Loading"})
        await ready(api, "m")
        grants: list[Grant] = await asyncio.wait_for(asyncio.gather(*burst), 2)
        assert {g.endpoint for g in grants} == {Endpoint("http://m.default.svc:8000")}
        assert demand_patches(api, "m") == 1 and waits == ["cold_start"] * 10
        assert cluster.activator.in_flight == {"default/m": 10}
        for grant in grants:
            grant.release()
            grant.release()
        assert cluster.activator.in_flight == {}


async def test_a_ready_model_is_granted_without_a_new_activation() -> None:
    api = FakeModelApi()
    await api.put(model_body("m"))
    await ready(api, "m")
    async with cluster_side(api) as cluster:
        grant = await asyncio.wait_for(cluster.activator.acquire(key("m"), 5), 2)
        assert grant.endpoint == Endpoint("http://m.default.svc:8000")
        grant.release()
        await eventually(lambda: demand_patches(api, "m") == 1)  # the start's demand signal; keep-alive throttled
        second = await asyncio.wait_for(cluster.activator.acquire(key("m"), 5), 2)
        second.release()
        await eventually(lambda: not cluster.demand._background)  # any keep-alive started has finished
        assert demand_patches(api, "m") == 1


async def test_a_model_preempted_in_the_cluster_is_activated_again_by_the_next_request() -> None:
    api = FakeModelApi()
    await api.put(model_body("m"))
    await ready(api, "m")
    async with cluster_side(api) as cluster:
        (await asyncio.wait_for(cluster.activator.acquire(key("m"), 5), 2)).release()
        before = demand_patches(api, "m")
        await api.set_status("m", {"phase": "Preempted"})
        await eventually(lambda: any(s.phase == "Idle" for s in cluster.dispatcher.snapshot()))
        waiting = asyncio.create_task(cluster.activator.acquire(key("m"), 5))
        await eventually(lambda: demand_patches(api, "m") == before + 1)
        assert not waiting.done()
        await ready(api, "m", "http://m-new:8000")
        assert (await asyncio.wait_for(waiting, 2)).endpoint == Endpoint("http://m-new:8000")


async def test_a_grant_the_cluster_disagrees_with_is_replaced_by_a_new_activation() -> None:
    api = FakeModelApi()
    await api.put(model_body("m"))
    await ready(api, "m")
    async with cluster_side(api) as cluster:
        (await asyncio.wait_for(cluster.activator.acquire(key("m"), 5), 2)).release()
        listeners, cluster.store._listeners = cluster.store._listeners, []  # the dispatcher misses the change
        await api.set_status("m", {"phase": "Preempted"})
        await eventually(lambda: cluster.store.get("default/m").status.phase == "Preempted")  # type: ignore[union-attr]
        cluster.store._listeners = listeners
        before = demand_patches(api, "m")
        waiting = asyncio.create_task(cluster.activator.acquire(key("m"), 5))
        await eventually(lambda: demand_patches(api, "m") == before + 1)
        assert not waiting.done()
        await ready(api, "m", "http://m-again:8000")
        grant = await asyncio.wait_for(waiting, 2)
        assert grant.endpoint == Endpoint("http://m-again:8000")
        grant.release()
        assert cluster.activator.in_flight == {}


async def test_failed_rejects_waiting_requests_and_the_next_request_tries_again() -> None:
    api = await idle_model_api()
    async with cluster_side(api) as cluster:
        waiting = asyncio.create_task(cluster.activator.acquire(key("m"), 5))
        await eventually(lambda: demand_patches(api, "m") == 1)
        await api.set_status("m", {"phase": "Failed", "message": "no GPU node matches"})
        with pytest.raises(ModelFailedError, match="no GPU node matches"):
            await asyncio.wait_for(waiting, 2)
        retry = asyncio.create_task(cluster.activator.acquire(key("m"), 5))
        await eventually(lambda: demand_patches(api, "m") == 2)
        with pytest.raises(ModelFailedError):
            await asyncio.wait_for(retry, 2)


async def test_members_of_one_shared_group_are_served_side_by_side() -> None:
    api = FakeModelApi()
    for name in ("a", "b"):
        await api.put(model_body(name, gpu={"shared": "gpu0", "vendor": "amd"}))
        await ready(api, name)
    async with cluster_side(api) as cluster:
        a = await asyncio.wait_for(cluster.activator.acquire(key("a"), 5), 2)
        b = await asyncio.wait_for(cluster.activator.acquire(key("b"), 5), 2)
        assert (a.endpoint, b.endpoint) == (Endpoint("http://a.default.svc:8000"), Endpoint("http://b.default.svc:8000"))
        a.release()
        b.release()


async def test_a_new_model_is_admitted_immediately_and_a_deleted_one_rejects_its_waiters() -> None:
    api = FakeModelApi()
    async with cluster_side(api) as cluster:
        await api.put(model_body("late", phase="Idle"))
        await eventually(lambda: cluster.catalog.resolve("late") is not None)
        waiting = asyncio.create_task(cluster.activator.acquire(key("late"), 5))
        await eventually(lambda: demand_patches(api, "late") == 1)
        await api.remove("late")
        with pytest.raises(ModelNotFoundError):
            await asyncio.wait_for(waiting, 2)


async def test_keep_alive_patches_for_long_running_requests() -> None:
    api = FakeModelApi()
    await api.put(model_body("m"))
    await ready(api, "m")
    async with cluster_side(api) as cluster:
        grant = await asyncio.wait_for(cluster.activator.acquire(key("m"), 5), 2)
        await eventually(lambda: demand_patches(api, "m") == 1)
        cluster.demand._last.clear()  # the minute has passed
        heartbeat = asyncio.create_task(cluster.activator.heartbeat(interval=0.01))
        await eventually(lambda: demand_patches(api, "m") == 2)
        heartbeat.cancel()
        grant.release()
    assert demand_patches(api, "m") == 2


async def test_the_manager_owns_scaling_a_min_replicas_model_waits_for_a_request_and_idle_is_never_stopped() -> None:
    api = FakeModelApi()
    await api.put(model_body("warm", serverless={"minReplicas": 1}))
    await api.put(model_body("m", serverless={"idleTimeout": "1s"}))
    await ready(api, "m")
    async with cluster_side(api) as cluster:
        (await asyncio.wait_for(cluster.activator.acquire(key("m"), 5), 2)).release()
        await cluster.dispatcher.tick()
        phases = cluster.dispatcher.phases()
        assert phases == {"default/m": "Ready", "default/warm": "Idle"}, "nothing starts without a request"
        assert cluster.dispatcher.next_wake is None, "no idle deadline: the manager scales idle models down"
        assert demand_patches(api, "warm") == 0


def test_settings_from_the_environment(caplog: pytest.LogCaptureFixture) -> None:
    assert cluster_proxy_settings({"POD_NAMESPACE": "ml"}).namespace == "ml"
    default = cluster_proxy_settings({})
    assert default.namespace == "default" and not default.endpoint_override
    assert "POD_NAMESPACE is not set" in caplog.text
    assert cluster_proxy_settings({"FLEXINFER_PROXY_ALL_NAMESPACES": "true", "POD_NAMESPACE": "x"}).namespace is None
    assert cluster_proxy_settings({"FLEXINFER_PROXY_ENDPOINT_OVERRIDE": "true"}).endpoint_override
    wide = cluster_proxy_settings({"FLEXINFER_PROXY_ALL_NAMESPACES": "true", "POD_NAMESPACE": "x", "POD_UID": "u"})
    assert (wide.pod_namespace, wide.pod_uid) == ("x", "u")
    assert "tests only" in caplog.text
