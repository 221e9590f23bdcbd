"""Proxy spans end to end: a minimal aiohttp proxy handler built on the span helpers, a recording upstream,
and a real OTLP receiver. Proves the trace is continued from the client's ``traceparent`` and carried on to
the upstream request, or restarted when incoming context is not trusted."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from flexinfer.core.errors import ColdStartTimeoutError, ModelNotFoundError, RequestError
from flexinfer.observability.tracing.config import tracing_settings
from flexinfer.observability.tracing.provider import Tracing, init_tracing
from flexinfer.observability.tracing.proxy import request_span
from support.otlp_receiver import OTLPReceiver

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
ROUTE = "/v1/chat/completions"
ERROR, UNSET = 2, 0
SERVER, CLIENT, INTERNAL = 2, 3, 1


@dataclass
class Upstream:
    """A model-server stand-in that records the headers of every request and answers ``status``."""

    status: int = 200
    seen: list[dict[str, str]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append({key.lower(): value for key, value in request.headers.items()})
        return web.json_response({"ok": True}, status=self.status)


def proxy_app(tracing: Tracing, upstream_url: str, cold_start_error: RequestError | None = None) -> web.Application:
    """The smallest proxy: span, activation wait, forward (copying the client's headers naively)."""
    async def handle(request: web.Request) -> web.Response:
        try:
            async with request_span(tracing, request.method, ROUTE, request.path, request.headers) as span:
                span.set_model("tiny")
                async with span.cold_start("tiny"):
                    if cold_start_error is not None:
                        raise cold_start_error
                headers = {key: value for key, value in request.headers.items() if key.lower() != "host"}
                async with span.upstream("POST", upstream_url, headers) as call, aiohttp.ClientSession() as session, \
                        session.post(upstream_url, headers=headers, data=await request.read()) as response:
                    call.set_status_code(response.status)
                    body = await response.read()
                span.set_status_code(response.status)
                return web.Response(status=response.status, body=body, content_type="application/json")
        except RequestError as error:
            return web.json_response({"error": {"code": error.code}}, status=error.status)

    app = web.Application()
    app.router.add_post(ROUTE, handle)
    return app


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    with OTLPReceiver() as running:
        yield running


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[Upstream, str]]:
    recorder = Upstream()
    app = web.Application()
    app.router.add_post(ROUTE, recorder.handle)
    async with TestServer(app) as server:
        yield recorder, str(server.make_url(ROUTE))


async def call_proxy(tracing: Tracing, upstream_url: str, headers: dict[str, str],
                     cold_start_error: RequestError | None = None) -> int:
    async with TestServer(proxy_app(tracing, upstream_url, cold_start_error)) as server, \
            aiohttp.ClientSession() as session, \
            session.post(server.make_url(ROUTE), json={"model": "tiny"}, headers=headers) as response:
        await response.read()
        return response.status


def enabled(receiver: OTLPReceiver, **extra: str) -> Tracing:
    env = {"FLEXINFER_OTEL_ENABLED": "1", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, **extra}
    return init_tracing("flexinfer-proxy", tracing_settings(env))


def traceparent_ids(header: str) -> tuple[str, str]:
    version, trace_id, parent_id, flags = header.split("-")
    assert version == "00" and int(flags, 16) & 1, header  # sampled (0x02 = random trace id may be set too)
    return trace_id, parent_id


async def test_trace_continues_from_client_through_proxy_to_upstream(
    receiver: OTLPReceiver, upstream: tuple[Upstream, str],
) -> None:
    recorder, url = upstream
    tracing = enabled(receiver)
    assert await call_proxy(tracing, url, {"traceparent": TRACEPARENT, "baggage": "tenant=a"}) == 200
    tracing.shutdown()
    handle, wait, call = (receiver.span(name) for name in ("proxy.handle_request", "proxy.cold_start",
                                                             "proxy.upstream"))
    assert (handle.trace_id, handle.parent_span_id, handle.kind) == (CLIENT_TRACE, CLIENT_SPAN, SERVER)
    assert handle.attributes == {"http.request.method": "POST", "http.route": ROUTE, "url.path": ROUTE,
                                 "flexinfer.model": "tiny", "http.response.status_code": 200}
    assert handle.status_code == UNSET and handle.scope == "flexinfer/proxy"
    assert handle.resource["service.name"] == "flexinfer-proxy"
    assert (wait.parent_span_id, wait.trace_id, wait.kind) == (handle.span_id, CLIENT_TRACE, INTERNAL)
    assert wait.attributes == {"flexinfer.model": "tiny", "flexinfer.outcome": "granted"}
    assert (call.parent_span_id, call.trace_id, call.kind) == (handle.span_id, CLIENT_TRACE, CLIENT)
    assert call.attributes["url.full"] == url and call.attributes["http.response.status_code"] == 200
    assert call.attributes["server.address"] == "127.0.0.1"
    [seen] = recorder.seen
    assert traceparent_ids(seen["traceparent"]) == (CLIENT_TRACE, call.span_id)
    assert seen["baggage"] == "tenant=a"


async def test_untrusted_incoming_context_starts_a_new_trace(
    receiver: OTLPReceiver, upstream: tuple[Upstream, str],
) -> None:
    recorder, url = upstream
    tracing = enabled(receiver, FLEXINFER_OTEL_TRUST_INCOMING="false")
    assert await call_proxy(tracing, url, {"traceparent": TRACEPARENT, "baggage": "tenant=a"}) == 200
    tracing.shutdown()
    handle, call = receiver.span("proxy.handle_request"), receiver.span("proxy.upstream")
    assert handle.trace_id != CLIENT_TRACE and handle.parent_span_id == ""
    assert call.trace_id == handle.trace_id
    [seen] = recorder.seen
    assert traceparent_ids(seen["traceparent"]) == (handle.trace_id, call.span_id)
    assert "baggage" not in seen


async def test_request_without_traceparent_is_a_root_span(
    receiver: OTLPReceiver, upstream: tuple[Upstream, str],
) -> None:
    recorder, url = upstream
    tracing = enabled(receiver)
    await call_proxy(tracing, url, {})
    tracing.shutdown()
    handle = receiver.span("proxy.handle_request")
    assert handle.parent_span_id == ""
    assert traceparent_ids(recorder.seen[0]["traceparent"])[0] == handle.trace_id


async def test_upstream_5xx_marks_both_spans_as_errors(receiver: OTLPReceiver, upstream: tuple[Upstream, str]) -> None:
    recorder, url = upstream
    recorder.status = 503
    tracing = enabled(receiver)
    assert await call_proxy(tracing, url, {}) == 503
    tracing.shutdown()
    for name in ("proxy.handle_request", "proxy.upstream"):
        span = receiver.span(name)
        assert (span.status_code, span.attributes["http.response.status_code"]) == (ERROR, 503)
        assert span.attributes["error.type"] == "503"


async def test_upstream_4xx_is_an_error_only_on_the_client_span(
    receiver: OTLPReceiver, upstream: tuple[Upstream, str],
) -> None:
    recorder, url = upstream
    recorder.status = 400
    tracing = enabled(receiver)
    assert await call_proxy(tracing, url, {}) == 400
    tracing.shutdown()
    assert receiver.span("proxy.upstream").status_code == ERROR
    assert receiver.span("proxy.handle_request").status_code == UNSET


async def test_cold_start_timeout_sets_outcome_and_request_status(
    receiver: OTLPReceiver, upstream: tuple[Upstream, str],
) -> None:
    recorder, url = upstream
    tracing = enabled(receiver)
    status = await call_proxy(tracing, url, {"traceparent": TRACEPARENT}, ColdStartTimeoutError("not Ready in 60s"))
    tracing.shutdown()
    assert status == 504 and recorder.seen == []
    wait, handle = receiver.span("proxy.cold_start"), receiver.span("proxy.handle_request")
    assert wait.attributes["flexinfer.outcome"] == "timeout" and wait.status_code == ERROR
    assert [name for name, _ in wait.events] == ["exception"]
    assert handle.attributes["http.response.status_code"] == 504 and handle.status_code == ERROR
    assert "proxy.upstream" not in [span.name for span in receiver.spans()]


def test_failure_after_headers_sent_is_still_an_error(receiver: OTLPReceiver) -> None:
    tracing = enabled(receiver)
    with pytest.raises(ConnectionResetError), request_span(tracing, "POST", ROUTE, ROUTE, {}) as span:
        span.set_status_code(200)
        raise ConnectionResetError("upstream closed the stream")
    tracing.shutdown()
    handle = receiver.span("proxy.handle_request")
    assert handle.status_code == ERROR and handle.attributes["error.type"] == "ConnectionResetError"
    assert handle.attributes["http.response.status_code"] == 200


def test_client_error_from_the_proxy_is_not_a_server_span_error(receiver: OTLPReceiver) -> None:
    tracing = enabled(receiver)
    with pytest.raises(ModelNotFoundError), request_span(tracing, "POST", ROUTE, ROUTE, {}):
        raise ModelNotFoundError("x")
    tracing.shutdown()
    handle = receiver.span("proxy.handle_request")
    assert handle.status_code == UNSET and handle.attributes["http.response.status_code"] == 404
    assert handle.events == []
