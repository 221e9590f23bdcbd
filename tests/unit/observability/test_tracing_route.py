"""``http.route`` on the real proxy application's request spans is the route template, never the raw path.

The proxy (``flexinfer.proxy.app.create_app``) runs on a real socket with ``ProxyTracer`` over enabled
tracing, an activator that grants at once and the fake OpenAI server upstream; the spans are read back from
the real OTLP receiver. Well-known OpenAI paths keep their own route; any other path (however many distinct
ones clients send) collapses to ``/v1/{tail}`` or ``/model/{name}/{tail}``, while ``url.path`` stays raw.
Also: when the composition roots install a tracer at all (``proxy_tracer``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from flexinfer.observability.tracing.config import tracing_settings
from flexinfer.observability.tracing.provider import init_tracing
from flexinfer.observability.tracing.proxy import ProxyTracer, proxy_tracer
from flexinfer.proxy.app import ProxyServer, create_app
from flexinfer.proxy.config import ProxyConfig
from flexinfer.runtime.ports import Endpoint, Grant, ModelView
from support.fake_openai import FakeOpenAI
from support.otlp_receiver import OTLPReceiver

ALPHA = ModelView(name="alpha", namespace="default", backend="llamacpp", served_model_name="alpha", phase="Ready")


class Catalog:
    def resolve(self, name: str) -> ModelView | None:
        return ALPHA if name == "alpha" else None

    def models(self) -> list[ModelView]:
        return [ALPHA]


class Activator:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    async def acquire(self, model: str, timeout: float | None = None,
                      on_wait: Callable[[str], None] | None = None) -> Grant:
        return Grant(model, Endpoint(self.base_url), lambda: None)


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    with OTLPReceiver() as running:
        yield running


@pytest.fixture
async def upstream() -> AsyncIterator[str]:
    async with TestServer(FakeOpenAI().app()) as server:
        yield str(server.make_url("")).rstrip("/")


async def test_http_route_is_the_template_and_url_path_the_raw_path(receiver: OTLPReceiver, upstream: str) -> None:
    tracing = init_tracing("flexinfer-proxy", tracing_settings(
        {"FLEXINFER_OTEL_ENABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}))
    config = ProxyConfig(shutdown_drain_delay=0.0)
    server = ProxyServer(create_app(config, Activator(upstream), Catalog(), tracer=ProxyTracer(tracing)), config)
    port = await server.start("127.0.0.1", 0)
    paths = ["/v1/chat/completions", "/v1/embeddings", "/v1/fine_tuning/jobs/ftjob-123",
             "/v1/fine_tuning/jobs/ftjob-456", "/model/alpha/v1/completions", "/model/alpha/custom/7"]
    try:
        async with aiohttp.ClientSession() as session:
            for path in paths:
                async with session.post(f"http://127.0.0.1:{port}{path}", json={"model": "alpha"}) as response:
                    assert response.status == 200, await response.text()
    finally:
        await server.shutdown()
        tracing.shutdown()
    spans = [s for s in receiver.spans() if s.name == "proxy.handle_request"]
    assert sorted((s.attributes["url.path"], s.attributes["http.route"]) for s in spans) == sorted([
        ("/v1/chat/completions", "/v1/chat/completions"),
        ("/v1/embeddings", "/v1/embeddings"),
        ("/v1/fine_tuning/jobs/ftjob-123", "/v1/{tail}"),
        ("/v1/fine_tuning/jobs/ftjob-456", "/v1/{tail}"),
        ("/model/alpha/v1/completions", "/model/{name}/{tail}"),
        ("/model/alpha/custom/7", "/model/{name}/{tail}"),
    ])


@pytest.mark.parametrize(("env", "installed"), [
    ({}, False),
    ({"FLEXINFER_OTEL_TRUST_INCOMING": "false"}, True),  # it strips the client's trace headers upstream
    ({"FLEXINFER_OTEL_ENABLED": "true"}, True),
])
def test_proxy_tracer_is_installed_when_tracing_is_on_or_incoming_context_is_untrusted(
    env: dict[str, str], installed: bool,
) -> None:
    tracing = init_tracing("flexinfer-proxy", tracing_settings(env))
    try:
        assert (proxy_tracer(tracing) is not None) is installed
    finally:
        tracing.shutdown()


async def test_v1_models_has_its_own_server_span(receiver: OTLPReceiver, upstream: str) -> None:
    tracing = init_tracing("flexinfer-proxy", tracing_settings(
        {"FLEXINFER_OTEL_ENABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}))
    config = ProxyConfig(shutdown_drain_delay=0.0)
    server = ProxyServer(create_app(config, Activator(upstream), Catalog(), tracer=ProxyTracer(tracing)), config)
    port = await server.start("127.0.0.1", 0)
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/v1/models", headers={"traceparent": parent}) as response:
                assert response.status == 200
            async with session.post(f"http://127.0.0.1:{port}/v1/models") as response:
                assert response.status == 405
    finally:
        await server.shutdown()
        tracing.shutdown()
    spans = sorted((s for s in receiver.spans() if s.name == "proxy.list_models"),
                   key=lambda s: s.attributes["http.response.status_code"])
    assert [(s.attributes["http.request.method"], s.attributes["http.route"], s.attributes["http.response.status_code"])
            for s in spans] == [("GET", "/v1/models", 200), ("POST", "/v1/models", 405)]
    assert spans[0].attributes["flexinfer.models"] == 1
    assert spans[0].trace_id == "0af7651916cd43dd8448eb211c80319c"  # continues the caller's trace
