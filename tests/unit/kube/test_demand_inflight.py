"""In-flight reports (``inflight.flexinfer.ai/<proxy>``): written before the first request is forwarded,
not per request, re-stamped while busy, cleared at once when the model left Ready (a swap waits for it),
lazily otherwise, and on shutdown."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import datetime

from flexinfer.api.model import Model
from flexinfer.core.model_status_plan import busy_proxies
from flexinfer.kube.inflight_report import INFLIGHT_PREFIX, InflightReporter, proxy_identity
from flexinfer.kube.proxy_side import ClusterProxySettings, ClusterSide
from support.fake_model_api import FakeModelApi, eventually, model_body

KEY = INFLIGHT_PREFIX + "proxy-a"


@contextlib.asynccontextmanager
async def side(api: FakeModelApi) -> AsyncIterator[ClusterSide]:
    cluster = ClusterSide(api, ClusterProxySettings(identity="proxy-a"))
    await cluster.start(sync_timeout=5)
    try:
        yield cluster
    finally:
        await cluster.close()


def report(api: FakeModelApi, name: str = "m") -> str | None:
    return api.objects[f"default/{name}"]["metadata"].get("annotations", {}).get(KEY)


async def ready_model(api: FakeModelApi, name: str = "m") -> None:
    await api.put(model_body(name))
    await api.set_status(name, {"phase": "Ready", "endpoint": f"http://{name}:8000"})


async def test_the_first_grant_writes_the_report_before_returning_and_later_grants_do_not() -> None:
    api = FakeModelApi()
    await ready_model(api)
    async with side(api) as cluster:
        first = await asyncio.wait_for(cluster.activator.acquire("m", 5), 2)
        stamp = report(api)
        assert stamp is not None
        assert busy_proxies({KEY: stamp}, datetime.fromisoformat(stamp), 30.0) == ["proxy-a"]
        second = await asyncio.wait_for(cluster.activator.acquire("m", 5), 2)
        first.release()
        second.release()
        third = await asyncio.wait_for(cluster.activator.acquire("m", 5), 2)
        third.release()
        assert len(api.metadata_patches) == 1
        assert report(api) == stamp  # still Ready: cleared lazily by the heartbeat, not per request


async def test_heartbeat_clears_idle_models_and_restamps_busy_ones() -> None:
    api = FakeModelApi()
    await ready_model(api, "idle")
    await ready_model(api, "busy")
    async with side(api) as cluster:
        reporter: InflightReporter = cluster.reporter
        (await asyncio.wait_for(cluster.activator.acquire("idle", 5), 2)).release()
        held = await asyncio.wait_for(cluster.activator.acquire("busy", 5), 2)
        reporter._refresh = 0.0  # every heartbeat re-stamps
        before = report(api, "busy")
        beat = asyncio.create_task(cluster.activator.heartbeat(interval=0.01))
        await eventually(lambda: report(api, "idle") is None and report(api, "busy") != before)
        beat.cancel()
        held.release()


async def test_a_model_that_left_ready_is_cleared_when_its_last_request_ends() -> None:
    api = FakeModelApi()
    await ready_model(api)
    async with side(api) as cluster:
        held = await asyncio.wait_for(cluster.activator.acquire("m", 5), 2)
        await api.set_status("m", {"phase": "Preempted"})
        await eventually(lambda: cluster.store.get("default/m").status.phase == "Preempted")  # type: ignore[union-attr]
        assert report(api) is not None  # the manager sees the report and drains
        held.release()
        await eventually(lambda: report(api) is None)


async def test_an_idle_model_that_left_ready_is_cleared_at_once() -> None:
    api = FakeModelApi()
    await ready_model(api)
    async with side(api) as cluster:
        (await asyncio.wait_for(cluster.activator.acquire("m", 5), 2)).release()
        assert report(api) is not None  # lazily kept while Ready
        await api.set_status("m", {"phase": "Preempted"})
        await eventually(lambda: report(api) is None)


async def test_shutdown_clears_every_report() -> None:
    api = FakeModelApi()
    await ready_model(api)
    async with side(api) as cluster:
        await asyncio.wait_for(cluster.activator.acquire("m", 5), 2)
        assert report(api) is not None
    assert report(api) is None


async def test_a_failed_report_does_not_fail_the_request() -> None:
    api = FakeModelApi()
    reporter = InflightReporter(api, "proxy-a")
    await reporter.busy(Model.model_validate(model_body("gone")))  # 404: logged, the request goes on
    assert reporter.writes == 0 and api.metadata_patches == []


def test_identity_is_a_valid_annotation_name() -> None:
    assert proxy_identity("flexinfer-proxy-7d9f8-abcde", "host") == "flexinfer-proxy-7d9f8-abcde"
    assert proxy_identity("", "my host:123") == "my-host-123"
    assert len(proxy_identity("x" * 100, "")) == 63
    assert proxy_identity("---", "") == "flexinfer-proxy"
