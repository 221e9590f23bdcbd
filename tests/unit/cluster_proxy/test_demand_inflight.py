"""In-flight reports (``inFlightAt`` in the replica's ModelDemand): written before the first request is
forwarded, then confirmed by a fresh read of the Model (still Ready), not per request, re-stamped while
busy, cleared at once when the model left Ready (a swap waits for it), lazily otherwise, and deleted on
shutdown. A refused first report (the API server has the model no longer Ready while the watch cache still
says Ready) is withdrawn and the request is not forwarded: it waits for the model to be activated again. A request
that waits for an activation has the report written with its demand and the Model read once; a Ready version the
watch delivers after that read's version needs no other write or read, an older one (or one after a re-list) is read
afresh; the report is withdrawn when the model turns Preempted or the last waiting request gives up, is not written
while the model is Preempted, and is kept by the heartbeat while requests wait."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import pytest

from flexinfer.api.conventions import INFLIGHT_PREFIX
from flexinfer.api.model import Model
from flexinfer.assembly.cluster_proxy import ClusterSide
from flexinfer.cluster_proxy import demand_activator
from flexinfer.cluster_proxy.demand_report import DemandReport, PodOwner
from flexinfer.cluster_proxy.inflight_report import InflightReporter, proxy_identity
from flexinfer.cluster_proxy.model_api import KubeApiError
from flexinfer.cluster_proxy.model_watch import ModelStore
from flexinfer.core.errors import ColdStartTimeoutError
from flexinfer.core.model_status.plan import busy_proxies
from flexinfer.runtime.ports import Grant
from support.cluster_side import cluster_side
from support.fake_model_api import FakeModelApi, idle_model_api, model_body
from support.polling import eventually
from support.recording_engine import key

KEY = INFLIGHT_PREFIX + "proxy-a"


def report(api: FakeModelApi, name: str = "m") -> str | None:
    return api.report(name).get("proxy-a", {}).get("inFlightAt")


def demand_writes(api: FakeModelApi) -> int:
    return len(api.field_writes("lastActiveTime"))


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
        assert len(api.field_writes("inFlightAt")) == 1 and api.get_calls == 1  # one write, one fresh read
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


def ten_requests(cluster: ClusterSide) -> asyncio.Future[list[Grant]]:
    """Ten requests for ``m`` arriving together."""
    return asyncio.gather(*(cluster.activator.acquire(key("m"), 5) for _ in range(10)))


async def test_requests_arriving_together_share_one_first_report() -> None:
    api = FakeModelApi()
    await ready_model(api)
    async with cluster_side(api) as cluster:
        (await asyncio.wait_for(cluster.activator.acquire(key("m"), 5), 2)).release()
        await cluster.reporter.refresh(())  # idle: the heartbeat clears the report
        writes, reads = len(api.field_writes("inFlightAt")), api.get_calls
        api.patch_gate = asyncio.Event()
        acquiring = ten_requests(cluster)
        await eventually(lambda: api.held_patches == 1)
        api.patch_gate.set()
        grants = await asyncio.wait_for(acquiring, 2)
        # one write and one fresh read for all ten, not one each
        assert (len(api.field_writes("inFlightAt")) - writes, api.get_calls - reads) == (1, 1)
        for grant in grants:
            grant.release()


async def test_a_due_restamp_is_written_once_in_the_background_and_no_request_waits_for_it() -> None:
    api = FakeModelApi()
    await ready_model(api)
    async with cluster_side(api) as cluster:
        (await asyncio.wait_for(cluster.activator.acquire(key("m"), 5), 2)).release()
        before, writes = report(api), len(api.field_writes("inFlightAt"))
        cluster.reporter._refresh = 0.0  # every request finds the stamp due
        api.patch_gate = asyncio.Event()  # the API server is slow to answer
        grants = await asyncio.wait_for(ten_requests(cluster), 2)
        assert api.held_patches == 1  # one re-stamp in flight, not one per request
        api.patch_gate.set()
        await eventually(lambda: len(api.field_writes("inFlightAt")) == writes + 1)
        assert report(api) != before
        for grant in grants:
            grant.release()


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


async def test_shutdown_deletes_the_replicas_reports() -> None:
    api = FakeModelApi()
    await ready_model(api)
    async with cluster_side(api) as cluster:
        await asyncio.wait_for(cluster.activator.acquire(key("m"), 5), 2)
        assert report(api) is not None and list(api.demands) == ["default/proxy-a"]
    assert api.demands == {}


async def test_a_failed_report_does_not_fail_the_request() -> None:
    api = FakeModelApi()
    api.patch_failures.append(KubeApiError("forbidden", 403))
    reporter = InflightReporter(DemandReport(api, "proxy-a"), api, ModelStore())
    assert await reporter.busy(Model.model_validate(model_body("m", phase="Ready")))  # logged, the request goes on
    assert reporter.writes == 0 and api.writes == []


async def test_the_report_lands_before_the_fresh_read_that_confirms_ready() -> None:
    """The order the manager relies on: our report is stored before we read the Model's phase."""
    api = FakeModelApi()
    await ready_model(api)
    seen: list[str | None] = []

    async def snapshot() -> None:
        seen.append(report(api))
    api.after_write.append(snapshot)
    calls_before = api.get_calls
    reporter = InflightReporter(DemandReport(api, "proxy-a"), api, ModelStore())
    assert await reporter.busy(Model.model_validate(api.objects["default/m"]))
    assert seen and seen[0] is not None and api.get_calls == calls_before + 1


async def test_a_report_left_by_an_earlier_run_of_the_pod_is_reset() -> None:
    api = FakeModelApi()
    await ready_model(api)
    await api.create_demand("default", {"metadata": {"name": "proxy-a", "namespace": "default"}, "spec": {
        "proxy": "proxy-a", "models": {"old": {"waitingSince": "2020-01-01T00:00:00Z"}}}})
    reporter = InflightReporter(DemandReport(api, "proxy-a"), api, ModelStore())
    assert await reporter.busy(Model.model_validate(api.objects["default/m"]))
    assert api.report("old") == {} and report(api) is not None


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
        demand_before = demand_writes(api)
        await api.set_status("m", {"phase": "Preempted"})  # the watch catches up
        await eventually(lambda: demand_writes(api) > demand_before)  # activated again: demand signalled
        await eventually(lambda: "default/m" in cluster.store._waiters)  # the engine now waits for Ready
        assert not request.done() and report(api) is None  # none while it is Preempted: it would hold the drain
        await api.set_status("m", {"phase": "Ready"})
        grant = await asyncio.wait_for(request, 2)
        assert report(api) is not None and cluster.activator.in_flight == {"default/m": 1}
        grant.release()


async def test_with_a_lagging_watch_the_model_is_reactivated_and_the_request_times_out_unforwarded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demand_activator, "REFUSAL_WAIT", 0.05)
    api = FakeModelApi()
    await ready_model(api)
    async with cluster_side(api) as cluster:
        await served_then_idle(cluster)
        api.objects["default/m"]["status"]["phase"] = "Preempted"  # not delivered to the watch
        demand_before = demand_writes(api)
        with pytest.raises(ColdStartTimeoutError):
            await asyncio.wait_for(cluster.activator.acquire(key("m"), 0.3), 5)
        assert cluster.reporter.refusals >= 1
        assert demand_writes(api) > demand_before  # REFUSAL_WAIT passed: marked stopped, demand signalled
        assert report(api) is None and cluster.activator.in_flight == {}


def test_identity_is_a_valid_replica_name() -> None:
    assert proxy_identity("flexinfer-proxy-7d9f8-abcde", "host") == "flexinfer-proxy-7d9f8-abcde"
    assert proxy_identity("", "my host:123") == "my-host-123"
    assert len(proxy_identity("x" * 100, "")) == 63
    assert proxy_identity("---", "") == "flexinfer-proxy"


async def test_the_report_in_the_pods_namespace_is_owned_by_the_pod_and_others_are_not() -> None:
    api = FakeModelApi()
    report = DemandReport(api, "proxy-a", owner=PodOwner("default", "proxy-a", "uid-1"))
    await report.write("default", "m", {"lastActiveTime": "2026-01-01T00:00:00Z"})
    await report.write("team-b", "m", {"lastActiveTime": "2026-01-01T00:00:00Z"})
    assert api.demands["default/proxy-a"]["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "proxy-a", "uid": "uid-1"}]
    assert "ownerReferences" not in api.demands["team-b/proxy-a"]["metadata"]


async def test_a_missing_crd_is_named() -> None:
    class NoCrd(FakeModelApi):
        async def create_demand(self, namespace: str, body: Any) -> None:
            raise KubeApiError("404 NotFound the server could not find the requested resource", 404)
    with pytest.raises(KubeApiError, match=r"the ModelDemand CRD \(modeldemands.ai.flexinfer\) is not installed"):
        await DemandReport(NoCrd(), "proxy-a").write("default", "m", {"lastActiveTime": None})


# --------------------------------------------------------------- reports written while a request waits


def stored(api: FakeModelApi, name: str = "m") -> Model:
    """The Model as the API server has it now (what the watch delivers next)."""
    return Model.model_validate(api.objects[f"default/{name}"])


async def early_reporter() -> tuple[FakeModelApi, ModelStore, InflightReporter]:
    """An idle ``m`` in the API server and in a watch cache this test feeds by hand, and the reporter over both."""
    api = await idle_model_api()
    store = ModelStore()
    store.replace_all([stored(api)])
    return api, store, InflightReporter(DemandReport(api, "proxy-a"), api, store)


async def settle_early(reporter: InflightReporter) -> None:
    await eventually(lambda: not reporter._early)


async def test_a_request_that_waited_is_forwarded_at_ready_without_another_write_or_read() -> None:
    api = await idle_model_api()
    async with cluster_side(api) as cluster:
        request = asyncio.create_task(cluster.activator.acquire(key("m"), 5))
        await eventually(lambda: report(api) is not None and api.get_calls == 1)  # written and read while waiting
        await api.set_status("m", {"phase": "Loading"})
        await api.set_status("m", {"phase": "Ready", "endpoint": "http://m:8000"})
        grant = await asyncio.wait_for(request, 2)
        assert (len(api.field_writes("inFlightAt")), api.get_calls) == (1, 1)
        assert report(api) is not None and cluster.activator.in_flight == {"default/m": 1}
        grant.release()


async def test_a_version_delivered_after_the_read_confirms_the_early_report() -> None:
    api, store, reporter = await early_reporter()
    reporter.waiting(stored(api))
    await settle_early(reporter)
    assert report(api) is not None and api.get_calls == 1
    await api.set_status("m", {"phase": "Ready", "endpoint": "http://m:8000"})
    store.upsert(stored(api))  # the watch delivers the Ready version, written after the read
    assert await reporter.busy(stored(api))
    assert (reporter.writes, api.get_calls) == (1, 1)


async def test_a_ready_version_older_than_the_read_is_confirmed_by_a_fresh_read_and_refused() -> None:
    """The server made the model Ready and then Preempted it before our read; the lagging watch delivers the Ready
    version only now. It was written before our report landed: the manager may not have seen the report."""
    api, store, reporter = await early_reporter()
    await api.set_status("m", {"phase": "Ready", "endpoint": "http://m:8000"})
    ready_version = stored(api)
    await api.set_status("m", {"phase": "Preempted"})
    reporter.waiting(store.get("default/m"))  # type: ignore[arg-type]  # the cache still has it Idle
    await settle_early(reporter)
    store.upsert(ready_version)
    assert not await reporter.busy(ready_version)
    assert api.get_calls == 2 and reporter.refusals == 1 and report(api) is None


async def test_a_relist_forgets_the_order_and_a_fresh_read_confirms() -> None:
    api, store, reporter = await early_reporter()
    reporter.waiting(stored(api))
    await settle_early(reporter)
    await api.set_status("m", {"phase": "Ready", "endpoint": "http://m:8000"})
    store.replace_all([stored(api)])  # a listing: it may be older than a version delivered before it
    assert await reporter.busy(stored(api))
    assert api.get_calls == 2 and reporter.writes == 1


async def test_an_early_read_that_finds_the_model_served_confirms_the_report() -> None:
    api, _, reporter = await early_reporter()
    await api.set_status("m", {"phase": "Ready", "endpoint": "http://m:8000"})
    reporter.waiting(stored(api))
    await settle_early(reporter)
    assert await reporter.busy(stored(api)) and api.get_calls == 1


async def test_a_waiting_models_report_is_withdrawn_when_it_is_preempted_and_kept_by_the_heartbeat() -> None:
    api = await idle_model_api()
    async with cluster_side(api) as cluster:
        request = asyncio.create_task(cluster.activator.acquire(key("m"), 10))
        await eventually(lambda: report(api) is not None)
        cluster.reporter._refresh = 0.0  # every heartbeat re-stamps
        stamp = report(api)
        await cluster.reporter.refresh(set(cluster.activator.admitting))
        assert report(api) not in (None, stamp), "re-stamped while the request waits"
        await api.set_status("m", {"phase": "Preempted", "sharedGroup": {"state": "Preempted"}})
        await eventually(lambda: report(api) is None)  # it must not hold the drain of a model nothing uses
        assert not request.done()
        request.cancel()


async def test_a_waiting_requests_report_is_withdrawn_when_it_gives_up() -> None:
    api = await idle_model_api()
    async with cluster_side(api) as cluster:
        with pytest.raises(ColdStartTimeoutError):
            await cluster.activator.acquire(key("m"), 0.2)
        await eventually(lambda: report(api) is None)
        assert cluster.activator.admitting == {}


async def test_no_report_is_written_for_a_preempted_model_until_its_turn_comes_back() -> None:
    api = await idle_model_api()
    await api.set_status("m", {"phase": "Preempted", "sharedGroup": {"state": "Preempted"}})
    async with cluster_side(api) as cluster:
        request = asyncio.create_task(cluster.activator.acquire(key("m"), 10))
        await eventually(lambda: demand_writes(api) == 1)
        assert report(api) is None, "it would hold the drain of the replica it waits to see go"
        await api.set_status("m", {"phase": "Loading", "sharedGroup": {"state": "Active"}})
        await eventually(lambda: report(api) is not None and api.get_calls == 1)
        await api.set_status("m", {"phase": "Ready", "endpoint": "http://m:8000"})
        grant = await asyncio.wait_for(request, 2)
        assert (len(api.field_writes("inFlightAt")), api.get_calls) == (1, 1)
        grant.release()


async def test_an_early_report_that_lands_after_the_model_turned_preempted_is_withdrawn() -> None:
    api, store, reporter = await early_reporter()
    api.patch_gate = asyncio.Event()
    reporter.waiting(stored(api))
    await eventually(lambda: api.held_patches == 1)
    await api.set_status("m", {"phase": "Preempted", "sharedGroup": {"state": "Preempted"}})
    store.upsert(stored(api))  # delivered while our write is on its way
    api.patch_gate.set()
    await settle_early(reporter)
    assert report(api) is None and reporter._written == {}
