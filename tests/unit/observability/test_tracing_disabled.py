"""Tracing off (the default): nothing is created or touched, every helper is a no-op, metrics still flow."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry import propagate, trace
from opentelemetry.exporter.otlp.proto.http import trace_exporter
from opentelemetry.sdk import trace as sdk_trace
from opentelemetry.sdk.trace import export as sdk_export

from flexinfer.observability.tracing.config import tracing_settings
from flexinfer.observability.tracing.lifecycle import record_activation
from flexinfer.observability.tracing.provider import init_tracing
from flexinfer.observability.tracing.proxy import request_span
from flexinfer.observability.tracing.reconcile import reconcile_span
from support.reconcile_metrics import RecordingMetrics

GARBAGE_ENV = {
    "OTEL_EXPORTER_OTLP_ENDPOINT": "::not a url::",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "ftp://",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon",
    "OTEL_TRACES_SAMPLER": "sometimes",
    "OTEL_TRACES_SAMPLER_ARG": "lots",
}
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"




@pytest.fixture
def no_exporter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to build an exporter or provider fails the test."""
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("tracing is off: nothing may be created")
    monkeypatch.setattr(trace_exporter, "OTLPSpanExporter", forbidden)  # where init_tracing imports them from
    monkeypatch.setattr(sdk_trace, "TracerProvider", forbidden)
    monkeypatch.setattr(sdk_export, "BatchSpanProcessor", forbidden)


@pytest.mark.usefixtures("no_exporter")
@pytest.mark.parametrize("enabled", [None, "false", "0", "maybe", ""])
def test_disabled_with_garbage_endpoint_starts_and_creates_nothing(enabled: str | None) -> None:
    env = dict(GARBAGE_ENV) | ({} if enabled is None else {"FLEXINFER_OTEL_ENABLED": enabled})
    provider_before, propagator_before = trace._TRACER_PROVIDER, propagate.get_global_textmap()
    tracing = init_tracing("flexinfer-proxy", tracing_settings(env))
    assert not tracing.enabled
    assert isinstance(tracing.tracer("x"), trace.NoOpTracer)
    assert trace._TRACER_PROVIDER is provider_before
    assert propagate.get_global_textmap() is propagator_before
    assert tracing.force_flush() is True
    tracing.shutdown()
    tracing.shutdown()


@pytest.mark.usefixtures("no_exporter")
def test_disabled_extract_is_none_and_inject_writes_nothing() -> None:
    tracing = init_tracing("p", tracing_settings({}))
    assert tracing.extract({"traceparent": TRACEPARENT}) is None
    headers: dict[str, str] = {}
    tracing.inject(headers)
    assert headers == {}


@pytest.mark.usefixtures("no_exporter")
async def test_disabled_request_spans_are_noops_and_leave_upstream_headers_alone() -> None:
    tracing = init_tracing("p", tracing_settings({}))
    upstream_headers = {"traceparent": TRACEPARENT, "content-type": "application/json"}
    async with request_span(tracing, "POST", "/v1/chat/completions", "/v1/chat/completions",
                            {"traceparent": TRACEPARENT}) as span:
        assert not span.span.is_recording()
        assert not span.link.is_valid
        span.set_model("tiny")
        async with span.cold_start("tiny") as wait:
            wait.set_outcome("ready")
        async with span.upstream("POST", "http://127.0.0.1:1/v1/chat/completions", upstream_headers) as call:
            call.set_status_code(200)
        span.set_status_code(200)
    assert upstream_headers == {"traceparent": TRACEPARENT, "content-type": "application/json"}


@pytest.mark.usefixtures("no_exporter")
def test_disabled_untrusted_proxy_still_drops_client_trace_headers() -> None:
    tracing = init_tracing("p", tracing_settings({"FLEXINFER_OTEL_TRUST_INCOMING": "false"}))
    headers = {"Traceparent": TRACEPARENT, "baggage": "user=x", "accept": "*/*"}
    with request_span(tracing, "GET", "/v1/models", "/v1/models", headers) as span, \
            span.upstream("GET", "http://127.0.0.1:1/v1/models", headers):
        pass
    assert headers == {"accept": "*/*"}


@pytest.mark.usefixtures("no_exporter")
def test_disabled_reconcile_still_observes_duration_and_counts_errors() -> None:
    tracing = init_tracing("flexinfer-manager", tracing_settings({}))
    metrics = RecordingMetrics()
    with reconcile_span(tracing, "model", "default", "tiny", metrics):
        pass
    with pytest.raises(KeyError), reconcile_span(tracing, "modelcache", "default", "c", metrics):
        raise KeyError("boom")
    assert [controller for controller, _ in metrics.durations] == ["model", "modelcache"]
    assert all(seconds >= 0 for _, seconds in metrics.durations)
    assert metrics.errors == ["modelcache"]


@pytest.mark.usefixtures("no_exporter")
async def test_disabled_async_reconcile_cancellation_is_not_an_error() -> None:
    tracing = init_tracing("flexinfer-manager", tracing_settings({}))
    metrics = RecordingMetrics()
    entered = asyncio.Event()

    async def handler() -> None:
        async with reconcile_span(tracing, "model", "ns", "m", metrics):
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(handler())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert metrics.errors == []
    assert [controller for controller, _ in metrics.durations] == ["model"]


@pytest.mark.usefixtures("no_exporter")
def test_disabled_record_activation_is_a_noop() -> None:
    tracing = init_tracing("p", tracing_settings({}))
    record_activation(tracing, model="m", namespace="ns", kind="cold_start", start=1.0, end=2.0,
                      stages=[("health", 1.0, 2.0)], triggers=[object()])
    assert not tracing.enabled
