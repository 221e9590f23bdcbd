"""The adapters over the other layers' ports: ``ProxyTracer`` (the proxy's explicit start/end calls, a
cold-start span opened from the dispatcher's task) and ``TracingObserver`` (the dispatcher's activation
record, whose triggers are ``contextvars`` copies taken inside the request)."""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Iterator

import pytest
from opentelemetry import trace

from flexinfer.api.model import Model
from flexinfer.observability.tracing.config import tracing_settings
from flexinfer.observability.tracing.lifecycle import TracingObserver
from flexinfer.observability.tracing.provider import Tracing, init_tracing
from flexinfer.observability.tracing.proxy import ProxyTracer
from flexinfer.proxy import hooks
from flexinfer.runtime.observer import ActivationRecord, LifecycleObserver
from support.otlp_receiver import OTLPReceiver

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{CLIENT_TRACE}-b7ad6b7169203331-01"
ROUTE = "/v1/chat/completions"
ERROR, UNSET = 2, 0


def model(name: str, group: str | None = "gpu0") -> Model:
    spec: dict[str, object] = {"backend": "llamacpp", "source": "file:///m.gguf"}
    if group:
        spec["gpu"] = {"shared": group}
    return Model.model_validate({"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model",
                                 "metadata": {"name": name, "namespace": "team-a"}, "spec": spec})


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    with OTLPReceiver() as running:
        yield running


def enabled(receiver: OTLPReceiver) -> Tracing:
    env = {"FLEXINFER_OTEL_ENABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
    return init_tracing("flexinfer-proxy", tracing_settings(env))


async def test_proxy_port_calls_and_activation_trace_linked_to_the_request(receiver: OTLPReceiver) -> None:
    tracing = enabled(receiver)
    tracer: hooks.ProxyTracer = ProxyTracer(tracing)
    observer: LifecycleObserver = TracingObserver(tracing)
    request = tracer.start_request("POST", ROUTE, {"traceparent": TRACEPARENT})
    captured = contextvars.copy_context()  # what the dispatcher keeps when the request calls acquire

    async def on_wait_from_the_dispatcher_task() -> hooks.Span:
        return request.cold_start("tiny")

    wait = await asyncio.create_task(on_wait_from_the_dispatcher_task())
    wait.set_attribute("flexinfer.activation", "swap")
    wait.set_attribute("flexinfer.outcome", "granted")
    wait.end()
    headers: dict[str, str] = {}
    call = request.upstream("POST", "http://127.0.0.1:8081/v1/chat/completions", headers)
    call.end(200)
    request.set_attribute("flexinfer.model", "tiny")
    request.end(200)
    assert trace.get_current_span() is trace.INVALID_SPAN  # the request span no longer current
    now = time.monotonic()
    observer.activation(ActivationRecord(
        model=model("tiny"), kind="swap", start=now - 3, end=now, stages=(("drain", now - 3, now - 2),
                                                                           ("health", now - 2, now)),
        triggers=(captured, contextvars.Context()), preempted=model("big")))
    tracing.shutdown()
    handle, cold, up = (receiver.span(n) for n in ("proxy.handle_request", "proxy.cold_start", "proxy.upstream"))
    assert handle.trace_id == CLIENT_TRACE and cold.parent_span_id == up.parent_span_id == handle.span_id
    assert cold.attributes == {"flexinfer.model": "tiny", "flexinfer.activation": "swap",
                               "flexinfer.outcome": "granted"}
    assert cold.status_code == UNSET and handle.status_code == UNSET
    assert headers["traceparent"].split("-")[1:3] == [CLIENT_TRACE, up.span_id]
    root = receiver.span("model.activation")
    assert root.links == [(CLIENT_TRACE, handle.span_id)]
    assert root.attributes["flexinfer.preempted"] == "team-a/big"
    assert root.attributes["flexinfer.group"] == "gpu0" and root.attributes["flexinfer.namespace"] == "team-a"
    assert root.attributes["flexinfer.activation.kind"] == "swap" and root.status_code == UNSET
    assert {receiver.span(n).parent_span_id for n in ("activation.drain", "activation.health")} == {root.span_id}


def test_proxy_port_failures(receiver: OTLPReceiver) -> None:
    tracing = enabled(receiver)
    tracer: hooks.ProxyTracer = ProxyTracer(tracing)
    missing = tracer.start_request("POST", ROUTE, {})
    missing.end(404, "model_not_found")
    timed_out = tracer.start_request("POST", ROUTE, {})
    wait = timed_out.cold_start("tiny")
    wait.set_attribute("flexinfer.outcome", "timeout")
    wait.end(error="timeout")
    timed_out.end(504, "timeout")
    broken = tracer.start_request("POST", ROUTE, {})
    call = broken.upstream("POST", "http://127.0.0.1:8081/v1/chat/completions", {})
    call.end(200, "upstream body failed or client went away")
    broken.end(200)
    tracing.shutdown()
    handles = sorted((s for s in receiver.spans() if s.name == "proxy.handle_request"),
                     key=lambda s: s.attributes["http.response.status_code"])
    assert [(s.attributes["http.response.status_code"], s.status_code) for s in handles] == [
        (200, UNSET), (404, UNSET), (504, ERROR)]
    assert handles[1].attributes["flexinfer.error"] == "model_not_found"
    cold = receiver.span("proxy.cold_start")
    assert (cold.status_code, cold.status_message, cold.attributes["flexinfer.outcome"]) == (ERROR, "timeout",
                                                                                            "timeout")
    upstream = receiver.span("proxy.upstream")
    assert upstream.status_code == ERROR and upstream.status_message.startswith("upstream body failed")


def test_failed_activation_from_the_observer(receiver: OTLPReceiver) -> None:
    tracing = enabled(receiver)
    now = time.monotonic()
    TracingObserver(tracing).activation(ActivationRecord(
        model=model("solo", group=None), kind="cold_start", start=now - 1, end=now,
        stages=(("server_start", now - 1, now),), triggers=(), result="failure"))
    tracing.shutdown()
    root = receiver.span("model.activation")
    assert root.status_code == ERROR and root.attributes["flexinfer.outcome"] == "failed"
    assert "flexinfer.group" not in root.attributes and root.links == []
    assert receiver.span("activation.server_start").status_code == ERROR


def test_null_tracing_observer_and_proxy_tracer_are_noops() -> None:
    tracing = init_tracing("p", tracing_settings({}))
    request = ProxyTracer(tracing).start_request("GET", "/v1/models", {"traceparent": TRACEPARENT})
    headers: dict[str, str] = {}
    request.upstream("GET", "http://x/v1/models", headers).end(200)
    request.end(200)
    assert headers == {}
    now = time.monotonic()
    TracingObserver(tracing).activation(ActivationRecord(
        model=model("m"), kind="cold_start", start=now, end=now, stages=(), triggers=(contextvars.copy_context(),)))
