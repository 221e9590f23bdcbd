"""Proxy surface: routing sources, model list, health/readiness/metrics pages, observability hooks,
grant accounting under concurrency, and graceful shutdown."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, MutableMapping

import aiohttp
import pytest
from prometheus_client import Counter

from flexinfer.proxy.config import ProxyConfig
from support.polling import eventually

CHAT = "/v1/chat/completions"


async def test_model_from_body_alias_is_rewritten_to_served_name(make_proxy, fake):
    proxy = await make_proxy()
    async with proxy.session.post(proxy.url + CHAT, json={"model": "a", "messages": []}) as response:
        assert response.status == 200
    assert fake.requests[-1].path == CHAT
    assert fake.requests[-1].body["model"] == "alpha-served"


async def test_model_from_header_is_not_forwarded_and_body_gets_served_name(make_proxy, fake):
    proxy = await make_proxy()
    async with proxy.session.post(proxy.url + "/v1/embeddings", json={"input": "x"},
                                  headers={"X-Model-ID": "beta"}) as response:
        assert response.status == 200
    received = fake.requests[-1]
    assert received.body["model"] == "beta-served"
    assert "X-Model-ID" not in received.headers


async def test_model_path_prefix_is_stripped_and_query_kept(make_proxy, fake):
    proxy = await make_proxy()
    async with proxy.session.post(proxy.url + "/model/beta/v1/custom/op?x=1", json={"a": 1}) as response:
        body = await response.json()
    assert body == {"path": "/v1/custom/op?x=1", "method": "POST", "model": "beta-served"}


async def test_non_json_body_with_header_model_is_forwarded_untouched(make_proxy, fake):
    proxy = await make_proxy()
    async with proxy.session.post(proxy.url + "/v1/audio/transcriptions", data=b"RAWBYTES",
                                  headers={"X-Model-ID": "alpha", "Content-Type": "audio/wav"}) as response:
        assert response.status == 200
    assert fake.requests[-1].headers["Content-Type"] == "audio/wav"


async def test_model_list_from_catalog_hides_parked(make_proxy):
    proxy = await make_proxy()
    async with proxy.session.get(proxy.url + "/v1/models") as response:
        body = await response.json()
    assert body["object"] == "list"
    alpha = body["data"][0]
    assert [m["id"] for m in body["data"]] == ["alpha", "beta"]
    assert alpha["object"] == "model" and alpha["owned_by"] == "flexinfer" and alpha["created"] == 1700000000
    assert alpha["metadata"]["served_model_name"] == "alpha-served"
    assert alpha["metadata"]["phase"] == "Ready" and alpha["metadata"]["group"] == "gpu0"
    assert alpha["metadata"]["aliases"] == ["a"]


async def test_health_ready_and_metrics_pages(make_proxy):
    proxy = await make_proxy()
    Counter("flexinfer_test_marker_total", "marker", registry=proxy.registry).inc()
    async with proxy.session.get(proxy.url + "/healthz") as response:
        assert (response.status, await response.text()) == (200, "ok")
    async with proxy.session.get(proxy.url + "/readyz") as response:
        assert (response.status, await response.text()) == (200, "ok")
    async with proxy.session.get(proxy.url + "/metrics") as response:
        assert "flexinfer_test_marker_total 1.0" in await response.text()
        assert response.headers["Content-Type"].startswith("text/plain")


class RecordingMetrics:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, *args))


async def test_metric_calls_use_bounded_model_labels(make_proxy):
    metrics = RecordingMetrics()
    proxy = await make_proxy(metrics=metrics)
    for model in ("alpha", "who-knows", "sleepy"):
        async with proxy.session.post(proxy.url + CHAT, json={"model": model}) as response:
            await response.read()
    finished = [call[1:3] for call in metrics.calls if call[0] == "request_finished"]
    assert finished == [("default/alpha", "success"), (None, "error"), ("default/sleepy", "parked")]
    assert ("connection_opened", "default/alpha") in metrics.calls
    assert ("connection_closed", "default/alpha") in metrics.calls


async def chat_after_activation(proxy, model: str) -> int:
    """A chat request that must wait for ``model``'s activation (held until the request waits); its status."""
    gate = proxy.activator.gates[model] = asyncio.Event()
    task = asyncio.ensure_future(proxy.session.post(proxy.url + CHAT, json={"model": model}))
    await asyncio.wait_for(proxy.activator.waiting.wait(), 5)
    gate.set()
    async with await task as response:
        await response.read()
        return response.status


async def test_wait_metrics_recorded_for_waiting_requests(make_proxy):
    metrics = RecordingMetrics()
    proxy = await make_proxy(metrics=metrics)
    assert await chat_after_activation(proxy, "alpha") == 200
    names = [call[0] for call in metrics.calls]
    assert names.index("wait_started") < names.index("wait_finished") < names.index("connection_opened")
    waited = next(call for call in metrics.calls if call[0] == "wait_finished")
    assert waited[1] == "default/alpha" and waited[3] == "granted"


class RecordingSpan:
    def __init__(self, name: str, log: list) -> None:
        self.name, self.log, self.attributes = name, log, {}
        log.append(self)
        self.ended: list[tuple] = []

    def set_attribute(self, key, value) -> None:
        self.attributes[key] = value

    def end(self, status_code=None, error=None) -> None:
        self.ended.append((status_code, error))

    def cold_start(self, model: str) -> RecordingSpan:
        return RecordingSpan("proxy.cold_start", self.log)

    def upstream(self, method: str, url: str, headers: MutableMapping[str, str]) -> RecordingSpan:
        headers["traceparent"] = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        return RecordingSpan("upstream", self.log)


class RecordingTracer:
    def __init__(self) -> None:
        self.spans: list[RecordingSpan] = []

    def start_request(self, method: str, route: str, headers: Mapping[str, str]) -> RecordingSpan:
        return RecordingSpan("proxy.handle_request", self.spans)


async def test_trace_spans_and_upstream_header_injection(make_proxy, fake):
    tracer = RecordingTracer()
    proxy = await make_proxy(tracer=tracer)
    assert await chat_after_activation(proxy, "alpha") == 200
    names = [span.name for span in tracer.spans]
    assert names == ["proxy.handle_request", "proxy.cold_start", "upstream"]
    request_span, cold, upstream = tracer.spans
    assert request_span.attributes["flexinfer.model"] == "alpha"
    assert request_span.ended == [(200, None)] and cold.ended == [(None, None)] and upstream.ended == [(200, None)]
    assert fake.requests[-1].headers["traceparent"].startswith("00-0af7651916cd43dd")


async def test_trace_records_error_status(make_proxy):
    tracer = RecordingTracer()
    proxy = await make_proxy(tracer=tracer)
    async with proxy.session.post(proxy.url + CHAT, json={"model": "nope"}) as response:
        await response.read()
    assert tracer.spans[0].ended == [(404, "model_not_found")]


async def test_grants_released_exactly_once_under_concurrency(make_proxy):
    proxy = await make_proxy()

    async def one(index: int) -> int:
        body = {"model": ("alpha", "beta")[index % 2], "stream": index % 3 == 0}
        async with proxy.session.post(proxy.url + CHAT, json=body) as response:
            await response.read()
            return response.status

    statuses = await asyncio.gather(*(one(i) for i in range(60)))
    assert statuses == [200] * 60
    assert len(proxy.activator.releases) == 60
    proxy.activator.assert_released_once()


async def test_shutdown_drains_in_flight_then_stops_accepting(make_proxy, fake):
    fake.hold_after_first_chunk = asyncio.Event()
    proxy = await make_proxy(ProxyConfig(shutdown_drain_delay=1.0, graceful_shutdown_timeout=5))
    response = await proxy.session.post(proxy.url + CHAT, json={"model": "alpha", "stream": True})
    await fake.first_chunk_sent.wait()
    shutdown = asyncio.ensure_future(proxy.server.shutdown())
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as other:
        async with other.get(proxy.url + "/readyz") as ready:
            assert (ready.status, await ready.text()) == (503, "draining")
        await eventually(lambda: not proxy.server.state.accepting)
        with pytest.raises(aiohttp.ClientConnectionError):
            await other.get(proxy.url + "/healthz")
    assert not shutdown.done()
    fake.hold_after_first_chunk.set()
    body = await response.read()
    assert body.endswith(b"data: [DONE]\n\n")
    assert await shutdown == "completed"
    proxy.activator.assert_released_once()


async def test_shutdown_times_out_with_stuck_request(make_proxy, fake):
    fake.hold_after_first_chunk = asyncio.Event()
    proxy = await make_proxy(ProxyConfig(shutdown_drain_delay=0, graceful_shutdown_timeout=0.1))
    response = await proxy.session.post(proxy.url + CHAT, json={"model": "alpha", "stream": True})
    await fake.first_chunk_sent.wait()
    assert await proxy.server.shutdown() == "timeout"
    await proxy.activator.wait_released(1)
    proxy.activator.assert_released_once()
    response.close()


async def test_a_request_id_echoed_by_the_model_server_appears_once_with_the_proxys_value(make_proxy):
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    async def echo(request: web.Request) -> web.Response:  # llama.cpp's server echoes it, lower-cased
        return web.json_response({"ok": True}, headers={"x-request-id": request.headers["X-Request-ID"] + "-echo"})

    app = web.Application()
    app.router.add_post(CHAT, echo)
    upstream = TestServer(app)
    await upstream.start_server()
    try:
        proxy = await make_proxy()
        proxy.activator.base_url = str(upstream.make_url("")).rstrip("/")
        request = proxy.session.post(proxy.url + CHAT, json={"model": "a"}, headers={"X-Request-ID": "abc"})
        async with request as response:
            assert response.status == 200
            assert len(response.headers.getall("X-Request-ID")) == 1
            assert not response.headers["X-Request-ID"].endswith("-echo")
    finally:
        await upstream.close()
