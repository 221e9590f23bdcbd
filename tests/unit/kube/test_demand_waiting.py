"""The proxy's wait marker (``flexinfer.ai/waiting-since``): written once per waiting period (not per request),
never replacing an older marker of another replica (a newer one is replaced), cleared when the model is Ready
(also a marker some other replica left behind) and when this replica's waits end (timeout, cancellation),
rewritten by a replica still waiting after another one cleared it."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta

import pytest

from flexinfer.core.election import WAITING_SINCE_ANNOTATION, parse_waiting_since
from flexinfer.core.errors import FlexInferError
from flexinfer.kube.demand import rfc3339
from flexinfer.kube.proxy_side import ClusterSide
from support.cluster_side import cluster_side
from support.fake_model_api import FakeModelApi, model_body
from support.polling import eventually
from support.recording_engine import key


def marker(api: FakeModelApi, name: str = "m") -> str | None:
    return api.objects[f"default/{name}"]["metadata"].get("annotations", {}).get(WAITING_SINCE_ANNOTATION)


def marker_patches(api: FakeModelApi) -> list[str | None]:
    """Every marker write (the value) and clear (``None``) the API server received, in order."""
    return [patch["metadata"]["annotations"][WAITING_SINCE_ANNOTATION] for _, _, patch in api.metadata_patches
            if WAITING_SINCE_ANNOTATION in patch.get("metadata", {}).get("annotations", {})]


async def ready(api: FakeModelApi, name: str = "m") -> None:
    await api.set_status(name, {"phase": "Ready", "endpoint": f"http://{name}.default.svc:8000"})


async def synced(cluster: ClusterSide, api: FakeModelApi, name: str = "m") -> None:
    """The watch cache shows the API server's current marker (and nothing more is being sent)."""
    await eventually(lambda: (m := cluster.store.get(f"default/{name}")) is not None
                     and m.metadata.annotations.get(WAITING_SINCE_ANNOTATION) == marker(api, name)
                     and not cluster.marker._workers)


async def test_a_waiting_period_writes_the_marker_once_and_ready_clears_it() -> None:
    api = FakeModelApi()
    await api.put(model_body("m", phase="Idle"))
    async with cluster_side(api) as cluster:
        before = datetime.now(UTC)
        burst = [asyncio.create_task(cluster.activator.acquire(key("m"), 5)) for _ in range(5)]
        await eventually(lambda: marker(api) is not None)
        stamp = parse_waiting_since(marker(api) or "")
        assert before <= stamp <= datetime.now(UTC)
        await synced(cluster, api)
        later = [asyncio.create_task(cluster.activator.acquire(key("m"), 5)) for _ in range(3)]
        await eventually(lambda: cluster.marker.waiting("default/m") == 8)
        await api.set_status("m", {"phase": "Loading"})
        await synced(cluster, api)
        assert marker_patches(api) == [rfc3339(stamp)], "one write per waiting period, not per request"
        await ready(api)
        grants = await asyncio.wait_for(asyncio.gather(*burst, *later), 2)
        await eventually(lambda: marker(api) is None)
        await synced(cluster, api)
        assert marker_patches(api) == [rfc3339(stamp), None]
        for grant in grants:
            grant.release()


async def test_an_older_marker_of_another_replica_is_kept_and_not_cleared_by_us() -> None:
    api = FakeModelApi()
    older = rfc3339(datetime.now(UTC) - timedelta(minutes=3))
    await api.put(model_body("m", phase="Idle", annotations={WAITING_SINCE_ANNOTATION: older}))
    async with cluster_side(api) as cluster:
        waiting = asyncio.create_task(cluster.activator.acquire(key("m"), 0.3))
        with pytest.raises(FlexInferError):
            await asyncio.wait_for(waiting, 2)
        await synced(cluster, api)
        assert cluster.marker.waiting("default/m") == 0
        assert marker(api) == older and marker_patches(api) == [], "the other replica's waits may still go on"


async def test_a_newer_or_garbage_marker_is_replaced_by_our_older_wait() -> None:
    api = FakeModelApi()
    newer = rfc3339(datetime.now(UTC) + timedelta(minutes=1))
    await api.put(model_body("m", phase="Idle", annotations={WAITING_SINCE_ANNOTATION: newer}))
    await api.put(model_body("g", phase="Idle", annotations={WAITING_SINCE_ANNOTATION: "soon"}))
    async with cluster_side(api) as cluster:
        tasks = [asyncio.create_task(cluster.activator.acquire(key(name), 5)) for name in ("m", "g")]
        await eventually(lambda: marker(api) not in (newer, None) and marker(api, "g") not in ("soon", None))
        assert parse_waiting_since(marker(api) or "") < parse_waiting_since(newer)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_the_marker_is_cleared_when_the_waits_end_by_timeout_or_cancellation() -> None:
    api = FakeModelApi()
    await api.put(model_body("m", phase="Idle"))
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
        await synced(cluster, api)
        assert len(marker_patches(api)) == 4 and marker_patches(api)[1::2] == [None, None]


async def test_a_stale_marker_on_a_ready_model_is_cleared_and_a_cleared_one_rewritten_while_waiting() -> None:
    api = FakeModelApi()
    left = rfc3339(datetime.now(UTC) - timedelta(hours=1))
    await api.put(model_body("r", annotations={WAITING_SINCE_ANNOTATION: left}))
    await ready(api, "r")
    await api.put(model_body("m", phase="Idle"))
    async with cluster_side(api) as cluster:
        await eventually(lambda: marker(api, "r") is None)
        waiting = asyncio.create_task(cluster.activator.acquire(key("m"), 5))
        await eventually(lambda: marker(api) is not None)
        ours = marker(api)
        await synced(cluster, api)
        await api.patch_model("default", "m", {"metadata": {"annotations": {WAITING_SINCE_ANNOTATION: None}}})
        await eventually(lambda: marker(api) == ours)  # another replica's waits ended; ours still go on
        await ready(api)
        (await asyncio.wait_for(waiting, 2)).release()
        await eventually(lambda: marker(api) is None)
    assert (marker(api, "r"), marker(api)) == (None, None)
