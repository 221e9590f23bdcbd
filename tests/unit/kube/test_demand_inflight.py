"""In-flight reports (``inflight.flexinfer.ai/<proxy>``): written before the first request is forwarded
(a JSON patch guarded by ``status.phase == Ready``), not per request, re-stamped while busy, cleared at once
when the model left Ready (a swap waits for it), lazily otherwise, and on shutdown. A refused first report
(the API server has the model no longer Ready while the watch cache still says Ready) means the request is
not forwarded: it waits for the model to be activated again."""

from __future__ import annotations

import asyncio
from datetime import datetime

import pytest

from flexinfer.api.model import Model
from flexinfer.core.errors import ColdStartTimeoutError
from flexinfer.core.model_status_plan import busy_proxies
from flexinfer.kube import proxy_side
from flexinfer.kube.inflight_report import INFLIGHT_PREFIX, InflightReporter, proxy_identity
from flexinfer.kube.proxy_side import ClusterSide
from support.cluster_side import cluster_side
from support.fake_model_api import FakeModelApi, model_body
from support.polling import eventually
from support.recording_engine import key

KEY = INFLIGHT_PREFIX + "proxy-a"




def report(api: FakeModelApi, name: str = "m") -> str | None:
    return api.objects[f"default/{name}"]["metadata"].get("annotations", {}).get(KEY)


async def ready_model(api: FakeModelApi, name: str = "m") -> None:
    await api.put(model_body(name))
    await api.set_status(name, {"phase": "Ready", "endpoint": f"http://{name}:8000"})


async def test_the_first_grant_writes_the_report_before_returning_and_later_grants_do_not() -> None:
    api = FakeModelApi()
    await ready_model(api)
    async with cluster_side(api) as cluster:
        first = await asyncio.wait_for(cluster.activator.acquire(key("m"), 5), 2)
        stamp = report(api)
        assert stamp is not None
        assert busy_proxies({KEY: stamp}, datetime.fromisoformat(stamp), 30.0) == ["proxy-a"]
        second = await asyncio.wait_for(cluster.activator.acquire(key("m"), 5), 2)
        first.release()
        second.release()
        third = await asyncio.wait_for(cluster.activator.acquire(key("m"), 5), 2)
        third.release()
        assert len(api.json_patches) == 1 and api.metadata_patches == []
        _, _, ops, applied = api.json_patches[0]
        assert applied and ops[0] == {"op": "test", "path": "/status/phase", "value": "Ready"}
        assert report(api) == stamp  # still Ready: cleared lazily by the heartbeat, not per request


async def test_heartbeat_clears_idle_models_and_restamps_busy_ones() -> None:
    api = FakeModelApi()
    await ready_model(api, "idle")
    await ready_model(api, "busy")
    async with cluster_side(api) as cluster:
        reporter: InflightReporter = cluster.reporter
        (await asyncio.wait_for(cluster.activator.acquire(key("idle"), 5), 2)).release()
        held = await asyncio.wait_for(cluster.activator.acquire(key("busy"), 5), 2)
        reporter._refresh = 0.0  # every heartbeat re-stamps
        before = report(api, "busy")
        beat = asyncio.create_task(cluster.activator.heartbeat(interval=0.01))
        await eventually(lambda: report(api, "idle") is None and report(api, "busy") != before)
        beat.cancel()
        assert report(api, "busy") is not None
        held.release()


async def test_a_model_that_left_ready_is_cleared_when_its_last_request_ends() -> None:
    api = FakeModelApi()
    await ready_model(api)
    async with cluster_side(api) as cluster:
        held = await asyncio.wait_for(cluster.activator.acquire(key("m"), 5), 2)
        await api.set_status("m", {"phase": "Preempted"})
        await eventually(lambda: cluster.store.get("default/m").status.phase == "Preempted")  # type: ignore[union-attr]
        assert report(api) is not None  # the manager sees the report and drains
        held.release()
        await eventually(lambda: report(api) is None)


async def test_an_idle_model_that_left_ready_is_cleared_at_once() -> None:
    api = FakeModelApi()
    await ready_model(api)
    async with cluster_side(api) as cluster:
        (await asyncio.wait_for(cluster.activator.acquire(key("m"), 5), 2)).release()
        assert report(api) is not None  # lazily kept while Ready
        await api.set_status("m", {"phase": "Preempted"})
        await eventually(lambda: report(api) is None)


async def test_shutdown_clears_every_report() -> None:
    api = FakeModelApi()
    await ready_model(api)
    async with cluster_side(api) as cluster:
        await asyncio.wait_for(cluster.activator.acquire(key("m"), 5), 2)
        assert report(api) is not None
    assert report(api) is None


async def test_a_failed_report_does_not_fail_the_request() -> None:
    api = FakeModelApi()
    reporter = InflightReporter(api, "proxy-a")
    assert await reporter.busy(Model.model_validate(model_body("gone")))  # 404: logged, the request goes on
    assert reporter.writes == 0 and api.metadata_patches == [] and api.json_patches == []


async def test_the_first_report_keeps_other_annotations_whatever_the_cached_shape() -> None:
    api = FakeModelApi()
    await api.put(model_body("m", annotations={"team": "a"}))
    await api.set_status("m", {"phase": "Ready"})
    reporter = InflightReporter(api, "proxy-a")
    bare = Model.model_validate(model_body("m", phase="Ready"))  # cache without annotations: shape retried
    assert await reporter.busy(bare)
    assert api.objects["default/m"]["metadata"]["annotations"]["team"] == "a" and report(api) is not None
    assert [applied for *_, applied in api.json_patches] == [False, True]
    await api.put(model_body("n"))
    await api.set_status("n", {"phase": "Ready"})
    assert await reporter.busy(Model.model_validate(model_body("n", phase="Ready")))
    assert report(api, "n") is not None and api.json_patches[-1][3]


async def served_then_idle(cluster: ClusterSide) -> None:
    """One request served (the dispatcher has the model Ready), then the heartbeat cleared our report."""
    (await asyncio.wait_for(cluster.activator.acquire(key("m"), 5), 2)).release()
    await cluster.reporter.refresh(set())


async def test_a_refused_first_report_is_not_forwarded_and_the_request_waits_for_reactivation() -> None:
    api = FakeModelApi()
    await ready_model(api)
    async with cluster_side(api) as cluster:
        await served_then_idle(cluster)
        api.objects["default/m"]["status"]["phase"] = "Preempted"  # the server moved on; the watch lags
        request = asyncio.create_task(cluster.activator.acquire(key("m"), 10))
        await eventually(lambda: cluster.reporter.refusals == 1)
        assert report(api) is None and not request.done()
        demand_before = len(api.patches)
        await api.set_status("m", {"phase": "Preempted"})  # the watch catches up
        await eventually(lambda: len(api.patches) > demand_before)  # activated again: demand signalled
        await asyncio.sleep(0)
        assert not request.done() and report(api) is None
        await api.set_status("m", {"phase": "Ready"})
        grant = await asyncio.wait_for(request, 2)
        assert report(api) is not None and cluster.activator.in_flight == {"default/m": 1}
        grant.release()


async def test_with_a_lagging_watch_the_model_is_reactivated_and_the_request_times_out_unforwarded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(proxy_side, "REFUSAL_WAIT", 0.05)
    api = FakeModelApi()
    await ready_model(api)
    async with cluster_side(api) as cluster:
        await served_then_idle(cluster)
        api.objects["default/m"]["status"]["phase"] = "Preempted"  # not delivered to the watch
        demand_before = len(api.patches)
        with pytest.raises(ColdStartTimeoutError):
            await asyncio.wait_for(cluster.activator.acquire(key("m"), 0.3), 5)
        assert cluster.reporter.refusals >= 1
        assert len(api.patches) > demand_before  # REFUSAL_WAIT passed: marked stopped, demand signalled
        assert report(api) is None and cluster.activator.in_flight == {}


def test_identity_is_a_valid_annotation_name() -> None:
    assert proxy_identity("flexinfer-proxy-7d9f8-abcde", "host") == "flexinfer-proxy-7d9f8-abcde"
    assert proxy_identity("", "my host:123") == "my-host-123"
    assert len(proxy_identity("x" * 100, "")) == 63
    assert proxy_identity("---", "") == "flexinfer-proxy"
