"""Proxy metrics on real request paths: a client that goes away is ``cancelled`` (not ``error``), and a
request held by the per-model concurrency cap (the arbiter's) is a waiting request in the queue metrics."""

from __future__ import annotations

import asyncio

import aiohttp
from prometheus_client import CollectorRegistry

from flexinfer.observability.metrics import ProxyMetrics
from support.polling import eventually
from support.recording_engine import RecordingEngine, key, make_model

CHAT = "/v1/chat/completions"
STREAM = {"model": "alpha", "stream": True}


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, {"model": "alpha", "namespace": "default", **labels})


async def _read_until(stream: aiohttp.StreamReader, marker: bytes) -> None:
    data = b""
    while marker not in data:
        chunk = await asyncio.wait_for(stream.readany(), 5)
        assert chunk, f"stream ended before {marker!r}; got {data!r}"
        data += chunk


async def test_a_client_that_leaves_mid_stream_counts_as_cancelled_not_error(make_proxy, fake):
    registry = CollectorRegistry()
    fake.hold_after_first_chunk = asyncio.Event()
    proxy = await make_proxy(metrics=ProxyMetrics(registry, ["default/alpha"]))
    response = await proxy.session.post(proxy.url + CHAT, json=STREAM)
    await _read_until(response.content, b"tok0")
    response.close()
    await eventually(lambda: sample(registry, "flexinfer_proxy_requests_total", status="cancelled") == 1)
    assert sample(registry, "flexinfer_proxy_requests_total", status="error") == 0
    assert sample(registry, "flexinfer_proxy_request_duration_seconds_count") == 1


async def test_a_client_that_leaves_while_waiting_counts_as_cancelled(make_proxy):
    registry = CollectorRegistry()
    proxy = await make_proxy(metrics=ProxyMetrics(registry, ["default/alpha"]))
    proxy.activator.gates["alpha"] = asyncio.Event()
    request = asyncio.ensure_future(proxy.session.post(proxy.url + CHAT, json={"model": "alpha"}))
    await eventually(lambda: sample(registry, "flexinfer_proxy_queue_depth") == 1)
    request.cancel()
    await eventually(lambda: sample(registry, "flexinfer_proxy_requests_total", status="cancelled") == 1)
    assert sample(registry, "flexinfer_proxy_requests_total", status="error") == 0
    assert sample(registry, "flexinfer_proxy_queue_depth") == 0
    assert sample(registry, "flexinfer_proxy_activation_duration_seconds_count", result="failure") == 0


async def test_requests_held_by_the_concurrency_cap_are_waiting_requests(make_proxy, fake, make_dispatcher):
    """Cap 1 and N parallel streams on a Ready model: while the first streams, N-1 wait in the model's queue,
    the queue metrics show them, and their streams say they are queued (not loading)."""
    registry, parallel = CollectorRegistry(), 4
    fake.hold_after_first_chunk = asyncio.Event()
    dispatcher = make_dispatcher([make_model("alpha", parallel=1)])
    assert await dispatcher.preload(key("alpha"), wait=True, timeout=5) == "Ready"
    proxy = await make_proxy(metrics=ProxyMetrics(registry, ["default/alpha"]), activator=dispatcher)

    async def stream() -> bytes:
        async with proxy.session.post(proxy.url + CHAT, json=STREAM) as response:
            return await response.read()

    streams = [asyncio.ensure_future(stream()) for _ in range(parallel)]
    await eventually(lambda: sample(registry, "flexinfer_proxy_queue_depth") == parallel - 1
                     and sample(registry, "flexinfer_proxy_active_connections") == 1)
    assert sample(registry, "flexinfer_proxy_queued_requests_total") == parallel - 1
    assert dispatcher.state(key("alpha")).queue_depth == parallel - 1  # the arbiter sees the real queue
    fake.hold_after_first_chunk.set()
    bodies = await asyncio.wait_for(asyncio.gather(*streams), 10)
    assert all(body.endswith(b"data: [DONE]\n\n") for body in bodies)
    assert sum(b": queued for alpha" in body for body in bodies) == parallel - 1
    assert not any(b": loading" in body for body in bodies)
    assert sample(registry, "flexinfer_proxy_queue_depth") == 0
    assert sample(registry, "flexinfer_proxy_queue_wait_duration_seconds_count") == parallel - 1
    assert sample(registry, "flexinfer_proxy_activation_duration_seconds_count", result="success") == 0


async def test_a_wait_for_an_activation_then_a_free_place_is_one_wait(make_proxy, fake, make_dispatcher):
    """Cap 1 while the model activates: every request waits for the activation in the model's one queue (each
    stream gets loading comments, each is one waiting request with one activation sample); at Ready one is
    granted and the others keep waiting in the same queue, under the same budget, for its place."""
    registry, parallel = CollectorRegistry(), 3
    fake.hold_after_first_chunk = asyncio.Event()
    engine = RecordingEngine(base_url=fake.base_url)
    engine.hold("default/alpha")
    dispatcher = make_dispatcher([make_model("alpha", parallel=1)], engine=engine)
    proxy = await make_proxy(metrics=ProxyMetrics(registry, ["default/alpha"]), activator=dispatcher)

    async def stream() -> bytes:
        async with proxy.session.post(proxy.url + CHAT, json=STREAM) as response:
            return await response.read()

    streams = [asyncio.ensure_future(stream()) for _ in range(parallel)]
    await eventually(lambda: sample(registry, "flexinfer_proxy_queue_depth") == parallel)
    assert dispatcher.state(key("alpha")).queue_depth == parallel
    engine.open("default/alpha")
    await eventually(lambda: sample(registry, "flexinfer_proxy_queue_depth") == parallel - 1)
    fake.hold_after_first_chunk.set()
    bodies = await asyncio.wait_for(asyncio.gather(*streams), 10)
    assert all(body.startswith(b": loading alpha") and body.endswith(b"data: [DONE]\n\n") for body in bodies)
    assert sample(registry, "flexinfer_proxy_queue_depth") == 0
    assert sample(registry, "flexinfer_proxy_queued_requests_total") == parallel
    assert sample(registry, "flexinfer_proxy_queue_wait_duration_seconds_count") == parallel
    assert sample(registry, "flexinfer_proxy_activation_duration_seconds_count", result="success") == parallel
