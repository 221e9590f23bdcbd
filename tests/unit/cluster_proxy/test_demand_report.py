"""The replica's ModelDemand report as one writer: one patch per object in flight, writes made meanwhile (any Model,
any field) go together in the next patch, a later value of a waiting field replaces the earlier one, each writer
returns when the patch that carried its fields landed and gets that patch's failure; an activation's demand, wait
marker and in-flight report land in one write; a renewal joins the same writer; shutdown ends the writes it drops."""

from __future__ import annotations

import asyncio

import pytest

from flexinfer.cluster_proxy.demand_report import DemandReport
from flexinfer.cluster_proxy.model_api import KubeApiError
from support.cluster_side import cluster_side
from support.fake_model_api import FakeModelApi, idle_model_api
from support.polling import eventually
from support.recording_engine import key


def patches(api: FakeModelApi) -> list[dict[str, dict[str, object]]]:
    """Per patch the API server received: model → fields (one ``writes`` entry per model of a patch)."""
    out: list[dict[str, dict[str, object]]] = []
    for _, model, fields in api.writes:
        if not out or model in out[-1]:
            out.append({})
        out[-1][model] = fields
    return out


async def held_first_write(api: FakeModelApi, report: DemandReport) -> asyncio.Task[None]:
    """A write of ``a`` whose patch the API server holds (``patch_gate``) until the test releases it."""
    api.patch_gate = asyncio.Event()
    first = asyncio.create_task(report.write("default", "a", {"lastActiveTime": "t1"}))
    await eventually(lambda: api.held_patches == 1)
    return first


async def test_writes_made_while_a_patch_is_in_flight_go_together_in_the_next_one() -> None:
    api = FakeModelApi()
    report = DemandReport(api, "proxy-a")
    first = await held_first_write(api, report)
    later = [asyncio.create_task(report.write("default", model, fields)) for model, fields in (
        ("a", {"waitingSince": "w1"}), ("b", {"inFlightAt": "f1"}), ("a", {"waitingSince": "w2"}),
        ("b", {"inFlightAt": None}))]
    await asyncio.sleep(0)  # every later write has joined the waiting batch
    assert api.held_patches == 1 and not any(task.done() for task in (first, *later))
    api.patch_gate.set()
    await asyncio.wait_for(asyncio.gather(first, *later), 2)
    assert patches(api) == [{"a": {"lastActiveTime": "t1"}},
                            {"a": {"waitingSince": "w2"}, "b": {"inFlightAt": None}}]
    assert report.writes == 2
    assert api.report("a") == {"proxy-a": {"lastActiveTime": "t1", "waitingSince": "w2"}}
    assert api.report("b") == {"proxy-a": {}}


async def test_every_writer_of_a_failed_patch_gets_its_error_and_the_next_batch_is_still_sent() -> None:
    api = FakeModelApi()
    report = DemandReport(api, "proxy-a")
    first = await held_first_write(api, report)
    doomed = [asyncio.create_task(report.write("default", m, {"inFlightAt": "f"})) for m in ("a", "b")]
    await asyncio.sleep(0)
    api.patch_failures = [KubeApiError("forbidden", 403)]  # the held patch fails
    api.patch_gate.set()
    with pytest.raises(KubeApiError):
        await first
    api.patch_gate = None
    await asyncio.wait_for(asyncio.gather(*doomed), 2)  # their own patch was sent after the failure
    assert patches(api) == [{"a": {"inFlightAt": "f"}, "b": {"inFlightAt": "f"}}]
    api.patch_failures = [KubeApiError("forbidden", 403)]
    together = [asyncio.create_task(report.write("default", m, {"waitingSince": "w"})) for m in ("a", "b")]
    results = await asyncio.gather(*together, return_exceptions=True)
    assert [type(r) for r in results] == [KubeApiError, KubeApiError], "one patch, both writers told"
    await report.write("default", "a", {"waitingSince": "w"})  # the report still writes afterwards
    assert api.report("a")["proxy-a"]["waitingSince"] == "w"


async def test_a_writer_that_stops_waiting_does_not_stop_the_patch_or_the_other_writers() -> None:
    api = FakeModelApi()
    report = DemandReport(api, "proxy-a")
    first = await held_first_write(api, report)
    quitter = asyncio.create_task(report.write("default", "a", {"waitingSince": "w"}))
    stayer = asyncio.create_task(report.write("default", "b", {"inFlightAt": "f"}))
    await asyncio.sleep(0)
    quitter.cancel()
    first.cancel()
    api.patch_gate.set()
    await asyncio.wait_for(stayer, 2)
    assert quitter.cancelled() and first.cancelled()
    assert patches(api) == [{"a": {"lastActiveTime": "t1"}}, {"a": {"waitingSince": "w"}, "b": {"inFlightAt": "f"}}]


async def test_writes_not_sent_at_shutdown_end_their_writers_and_nothing_is_written_after_the_delete() -> None:
    api = FakeModelApi()
    report = DemandReport(api, "proxy-a")
    first = await held_first_write(api, report)
    queued = asyncio.create_task(report.write("default", "b", {"inFlightAt": "f"}))
    await asyncio.sleep(0)
    await asyncio.wait_for(report.delete_all(), 2)
    assert first.done() and queued.done()
    api.patch_gate.set()
    await asyncio.sleep(0)
    assert api.demands == {} and api.writes == []


async def test_an_activation_writes_its_demand_wait_marker_and_inflight_report_in_one_patch() -> None:
    api = await idle_model_api()
    async with cluster_side(api) as cluster:
        request = asyncio.create_task(cluster.activator.acquire(key("m"), 5))
        await eventually(lambda: bool(api.writes))
        assert sorted(api.writes[0][2]) == ["inFlightAt", "lastActiveTime", "waitingSince"]
        await api.set_status("m", {"phase": "Ready", "endpoint": "http://m.default.svc:8000"})
        grant = await asyncio.wait_for(request, 2)
        grant.release()


async def test_a_renewal_due_while_a_patch_is_in_flight_waits_for_it_instead_of_racing_it() -> None:
    api = FakeModelApi()
    report = DemandReport(api, "proxy-a", renew_interval=0.0)
    await report.write("default", "a", {"waitingSince": "w"})  # a live field: renewals are due
    first = await held_first_write(api, report)
    renewal = asyncio.create_task(report.renew())
    await asyncio.sleep(0)
    assert api.held_patches == 1, "no second patch of the object while one is in flight"
    before = api.demands["default/proxy-a"]["spec"]["renewTime"]
    api.patch_gate.set()
    await asyncio.wait_for(asyncio.gather(first, renewal), 2)
    assert report.writes == 3 and len(api.writes) == 2, "the renewal's own patch carries no Model"
    assert api.demands["default/proxy-a"]["spec"]["renewTime"] >= before


async def test_a_write_whose_patch_had_not_started_at_shutdown_ends_and_the_report_still_writes_afterwards() -> None:
    api = FakeModelApi()
    report = DemandReport(api, "proxy-a")
    queued = asyncio.create_task(report.write("default", "a", {"waitingSince": "w"}))
    await asyncio.sleep(0)  # the write is queued and its sender created, not yet run
    await report.delete_all()  # awaited directly: a task around it would let the sender run first
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(queued, 2)
    await asyncio.wait_for(report.write("default", "a", {"waitingSince": "w2"}), 2)
    assert api.report("a") == {"proxy-a": {"waitingSince": "w2"}}
