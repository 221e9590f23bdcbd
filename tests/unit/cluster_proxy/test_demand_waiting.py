"""The proxy's wait marker (``waitingSince`` in the replica's ModelDemand): the start of the oldest waiting
request, written once per change (not per request), kept after the model turned Ready until the requests'
in-flight report is written, cleared when this replica's waits end (forwarded, timeout, cancellation); each
replica writes only its own report and never touches the Model; the report is renewed while a wait is
reported (the manager ignores the waits of a replica whose heartbeat is stale)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from datetime import UTC, datetime, timedelta

import pytest

from flexinfer.api.conventions import WAITING_SINCE_ANNOTATION
from flexinfer.assembly.cluster_proxy import ClusterSide
from flexinfer.cluster_proxy.demand import rfc3339
from flexinfer.core.election import parse_waiting_since
from flexinfer.core.errors import FlexInferError
from support.cluster_side import cluster_side
from support.fake_model_api import FakeModelApi, idle_model_api
from support.polling import eventually
from support.recording_engine import key


def marker(api: FakeModelApi, name: str = "m", replica: str = "proxy-a") -> str | None:
    return api.report(name).get(replica, {}).get("waitingSince")


def marker_patches(api: FakeModelApi) -> list[str | None]:
    """Every marker write (the value) and clear (``None``) the API server received, in order."""
    return [value for _, _, value in api.field_writes("waitingSince")]


async def ready(api: FakeModelApi, name: str = "m") -> None:
    await api.set_status(name, {"phase": "Ready", "endpoint": f"http://{name}.default.svc:8000"})


async def settled(cluster: ClusterSide) -> None:
    await eventually(lambda: not cluster.marker._workers)


async def test_a_waiting_period_writes_the_marker_once_and_it_clears_after_the_inflight_report() -> None:
    api = await idle_model_api()
    async with cluster_side(api) as cluster:
        before = datetime.now(UTC)
        burst = [asyncio.create_task(cluster.activator.acquire(key("m"), 5)) for _ in range(5)]
        await eventually(lambda: marker(api) is not None)
        stamp = parse_waiting_since(marker(api) or "")
        assert before <= stamp <= datetime.now(UTC)
        later = [asyncio.create_task(cluster.activator.acquire(key("m"), 5)) for _ in range(3)]
        await eventually(lambda: cluster.marker.waiting("default/m") == 8)
        await api.set_status("m", {"phase": "Loading"})
        await settled(cluster)
        assert marker_patches(api) == [rfc3339(stamp)], "one write per waiting period, not per request"
        assert WAITING_SINCE_ANNOTATION not in api.objects["default/m"]["metadata"].get("annotations", {})
        await ready(api)
        grants = await asyncio.wait_for(asyncio.gather(*burst, *later), 2)
        await eventually(lambda: marker(api) is None)
        await settled(cluster)
        assert marker_patches(api) == [rfc3339(stamp), None]
        # Ready alone clears nothing: the manager must see the new holder waiting until it sees it busy, else a
        # starving member takes the GPU before a single request was forwarded (issue: swaps under contention).
        fields = [sorted(f) for _, _, f in api.writes]
        claimed = next(i for i, f in enumerate(fields) if "inFlightAt" in f)
        assert claimed < fields.index(["waitingSince"], 1), fields
        for grant in grants:
            grant.release()


async def test_replicas_write_their_own_reports_and_keep_their_own_start() -> None:
    api = await idle_model_api()
    async with cluster_side(api, identity="proxy-a") as a, cluster_side(api, identity="proxy-b") as b:
        first = asyncio.create_task(a.activator.acquire(key("m"), 5))
        await eventually(lambda: marker(api) is not None)
        second = asyncio.create_task(b.activator.acquire(key("m"), 5))
        await eventually(lambda: marker(api, replica="proxy-b") is not None)
        older, newer = marker(api), marker(api, replica="proxy-b")
        assert parse_waiting_since(older or "") <= parse_waiting_since(newer or "")
        second.cancel()
        await eventually(lambda: marker(api, replica="proxy-b") is None)
        assert marker(api) == older, "the other replica's wait goes on"
        first.cancel()
        await asyncio.gather(first, second, return_exceptions=True)


async def test_the_marker_is_cleared_when_the_waits_end_by_timeout_or_cancellation() -> None:
    api = await idle_model_api()
    async with cluster_side(api) as cluster:
        timed_out = asyncio.create_task(cluster.activator.acquire(key("m"), 0.3))
        await eventually(lambda: marker(api) is not None)
        with pytest.raises(FlexInferError):
            await asyncio.wait_for(timed_out, 2)
        await eventually(lambda: marker(api) is None)
        cancelled = asyncio.create_task(cluster.activator.acquire(key("m"), 5))
        await eventually(lambda: marker(api) is not None)
        cancelled.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await cancelled
        await eventually(lambda: marker(api) is None)
        await settled(cluster)
        assert len(marker_patches(api)) == 4 and marker_patches(api)[1::2] == [None, None]


async def test_the_report_is_renewed_while_a_wait_is_reported() -> None:
    api = await idle_model_api()
    async with cluster_side(api) as cluster:
        cluster.report._renew_interval = 0.0
        waiting = asyncio.create_task(cluster.activator.acquire(key("m"), 5))
        await eventually(lambda: marker(api) is not None)
        first = api.demands["default/proxy-a"]["spec"]["renewTime"]
        await cluster.report.renew()
        assert api.demands["default/proxy-a"]["spec"]["renewTime"] >= first
        writes = cluster.report.writes
        await cluster.report.renew()
        assert cluster.report.writes == writes + 1
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await eventually(lambda: marker(api) is None)
        writes = cluster.report.writes
        await cluster.report.renew()
        assert cluster.report.writes == writes, "nothing live: no heartbeat"


async def test_a_deleted_models_marker_is_cleared() -> None:
    """A Model deleted while requests wait must not leave a wait marker a new Model of that name inherits."""
    api = await idle_model_api()
    async with cluster_side(api) as cluster:
        waiting = asyncio.create_task(cluster.activator.acquire(key("m"), 5))
        await eventually(lambda: marker(api) is not None)
        await api.remove("m")
        with pytest.raises(FlexInferError):
            await asyncio.wait_for(waiting, 2)
        await eventually(lambda: marker(api) is None)


async def test_the_marker_follows_the_oldest_wait_in_steps_of_a_second_not_one_write_per_request() -> None:
    """While a backlog is forwarded the oldest wait moves on with every request: the marker is rewritten only
    when it lags by a second or more, and always names a request that is still waiting or an older instant."""
    api = await idle_model_api()
    async with cluster_side(api) as cluster:
        clock = [datetime(2026, 1, 1, tzinfo=UTC)]
        cluster.marker._now = lambda: clock[0]
        tokens = []
        for _ in range(100):  # 100 requests, 50 ms apart: 5 s of arrivals
            tokens.append(cluster.marker.begin("default/m"))
            clock[0] += timedelta(milliseconds=50)
        await settled(cluster)
        for token in tokens:  # forwarded one by one, oldest first
            cluster.marker.end("default/m", token)
            await settled(cluster)
        writes = marker_patches(api)
        assert writes[-1] is None
        instants = [parse_waiting_since(w) for w in writes[:-1] if w is not None]
        assert len(instants) <= 6, writes  # the first, then one per second of arrivals
        assert instants == sorted(instants) and instants[0] == datetime(2026, 1, 1, tzinfo=UTC)
        assert all(b - a >= timedelta(seconds=1) for a, b in itertools.pairwise(instants))
