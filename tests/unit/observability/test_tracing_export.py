"""Tracing on: spans reach a real OTLP/HTTP endpoint with the right resource, names, attributes and links."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from opentelemetry import propagate, trace

from flexinfer.core.errors import ConfigError
from flexinfer.observability.tracing.config import tracing_settings
from flexinfer.observability.tracing.lifecycle import record_activation
from flexinfer.observability.tracing.provider import Tracing, init_tracing
from flexinfer.observability.tracing.reconcile import reconcile_span
from support.otlp_receiver import OTLPReceiver
from support.reconcile_metrics import RecordingMetrics

ERROR, UNSET = 2, 0
SERVER, CLIENT, INTERNAL = 2, 3, 1




@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    with OTLPReceiver() as running:
        yield running


def start(receiver: OTLPReceiver, service: str = "flexinfer-manager", **extra: str) -> Tracing:
    env = {"FLEXINFER_OTEL_ENABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
           "OTEL_BSP_SCHEDULE_DELAY": "60000", **extra}
    return init_tracing(service, tracing_settings(env))


def test_enabled_does_not_touch_otel_globals(receiver: OTLPReceiver) -> None:
    provider_before, propagator_before = trace._TRACER_PROVIDER, propagate.get_global_textmap()
    tracing = start(receiver)
    assert tracing.enabled
    tracing.shutdown()
    assert trace._TRACER_PROVIDER is provider_before
    assert propagate.get_global_textmap() is propagator_before


def test_shutdown_flushes_and_resource_has_service_name_namespace_and_env_attributes(receiver: OTLPReceiver) -> None:
    tracing = start(receiver, FLEXINFER_OTEL_SERVICE_NAMESPACE="flexinfer-system",
                    OTEL_RESOURCE_ATTRIBUTES="deployment.environment=lab,service.namespace=ignored,service.name=x")
    with tracing.tracer("t").start_as_current_span("only-on-shutdown"):
        pass
    assert receiver.spans() == []  # a 60 s batch delay: only shutdown can have sent it
    tracing.shutdown()
    span = receiver.span("only-on-shutdown")
    assert span.resource["service.name"] == "flexinfer-manager"
    assert span.resource["service.namespace"] == "flexinfer-system"
    assert span.resource["deployment.environment"] == "lab"
    assert span.resource["telemetry.sdk.language"] == "python"
    assert span.scope == "t"


def test_a_tracer_is_made_once_per_name_and_its_spans_keep_their_scope(receiver: OTLPReceiver) -> None:
    tracing = start(receiver)
    proxy, again, other = tracing.tracer("flexinfer/proxy"), tracing.tracer("flexinfer/proxy"), tracing.tracer("x")
    assert proxy is again and other is not proxy
    with proxy.start_as_current_span("from-proxy"), other.start_as_current_span("from-x"):
        pass
    tracing.shutdown()
    assert (receiver.span("from-proxy").scope, receiver.span("from-x").scope) == ("flexinfer/proxy", "x")


def test_otel_service_name_overrides_and_no_namespace_when_unset(receiver: OTLPReceiver) -> None:
    tracing = start(receiver, OTEL_SERVICE_NAME="edge-proxy")
    tracing.tracer("t").start_span("s").end()
    tracing.shutdown()
    assert receiver.span("s").resource["service.name"] == "edge-proxy"
    assert "service.namespace" not in receiver.span("s").resource


def test_gzip_compression_and_headers_reach_the_endpoint(receiver: OTLPReceiver) -> None:
    tracing = start(receiver, OTEL_EXPORTER_OTLP_COMPRESSION="gzip",
                    OTEL_EXPORTER_OTLP_HEADERS="x-scope-orgid=team%20a")
    tracing.tracer("t").start_span("zipped").end()
    tracing.shutdown()
    assert receiver.span("zipped").name == "zipped"
    assert receiver.encodings == ["gzip"]
    assert receiver.headers[0]["x-scope-orgid"] == "team a"


def test_traces_endpoint_variable_is_used_as_given(receiver: OTLPReceiver) -> None:
    tracing = start(receiver, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",
                    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=receiver.traces_url)
    tracing.tracer("t").start_span("direct").end()
    tracing.force_flush()
    assert receiver.wait_for_spans(1)[0].name == "direct"
    tracing.shutdown()


def test_always_off_sampler_exports_nothing(receiver: OTLPReceiver) -> None:
    tracing = start(receiver, OTEL_TRACES_SAMPLER="always_off")
    tracing.tracer("t").start_span("dropped").end()
    tracing.shutdown()
    assert receiver.spans() == []


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "::not a url::"}, "ENDPOINT"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "collector:4318"}, "ENDPOINT"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
        ({"OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "half"}, "OTEL_TRACES_SAMPLER_ARG"),
        # Out-of-range ratios are errors, as docs/tracing.md says (they used to be clamped to 0 or 1).
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, "OTEL_TRACES_SAMPLER_ARG"),
        ({"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "-0.1"},
         "OTEL_TRACES_SAMPLER_ARG"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "nan"}, "OTEL_TRACES_SAMPLER_ARG"),
        ({"OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent/ca.pem"}, "OTEL_EXPORTER_OTLP_.*CERTIFICATE"),
    ],
)
def test_enabled_with_unusable_settings_is_a_config_error(env: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError, match=variable):
        init_tracing("p", tracing_settings({"FLEXINFER_OTEL_ENABLED": "on", **env}))


def test_reconcile_span_attributes_error_status_and_metrics(receiver: OTLPReceiver) -> None:
    tracing, metrics = start(receiver), RecordingMetrics()
    with reconcile_span(tracing, "model", "team-a", "tiny", metrics):
        pass
    with pytest.raises(RuntimeError, match="apiserver down"), \
            reconcile_span(tracing, "modelcache", "team-a", "cache", metrics) as scope:
        scope.record_error(ValueError("handled first"))
        raise RuntimeError("apiserver down")
    tracing.shutdown()
    ok, failed = receiver.span("model.reconcile"), receiver.span("modelcache.reconcile")
    assert ok.attributes == {"k8s.namespace": "team-a", "k8s.name": "tiny", "controller": "model"}
    assert ok.status_code == UNSET and ok.parent_span_id == ""
    assert failed.status_code == ERROR and failed.status_message == "apiserver down"
    assert failed.attributes["error.type"] == "RuntimeError"
    assert [attributes["exception.type"] for name, attributes in failed.events] == ["ValueError", "RuntimeError"]
    assert metrics.errors == ["modelcache"]  # counted once per reconcile
    assert [controller for controller, _ in metrics.durations] == ["model", "modelcache"]


async def test_async_reconcile_span_parents_nested_spans(receiver: OTLPReceiver) -> None:
    tracing, metrics = start(receiver), RecordingMetrics()
    async with reconcile_span(tracing, "model", "ns", "m", metrics):
        tracing.tracer("flexinfer/kube").start_span("patch-status").end()
    tracing.shutdown()
    assert receiver.span("patch-status").parent_span_id == receiver.span("model.reconcile").span_id
    assert receiver.span("patch-status").trace_id == receiver.span("model.reconcile").trace_id


def test_activation_trace_has_stages_with_given_times_and_links_to_requests(receiver: OTLPReceiver) -> None:
    tracing = start(receiver, "flexinfer-proxy")
    requests = [tracing.tracer("t").start_span(f"request-{n}") for n in range(2)]
    for span in requests:
        span.end()
    t0 = time.monotonic() - 10.0
    stages = [("drain", t0, t0 + 1), ("staging", t0 + 1, t0 + 4), ("server_start", t0 + 4, t0 + 7),
              ("health", t0 + 7, t0 + 8)]
    triggers: list[object] = [span.get_span_context() for span in requests]
    triggers += [requests[0].get_span_context(), "not a span", trace.INVALID_SPAN_CONTEXT]
    record_activation(tracing, model="tiny", namespace="default", kind="swap", group="gpu0", start=t0,
                      end=t0 + 8, stages=stages, triggers=triggers)
    tracing.shutdown()
    root = receiver.span("model.activation")
    assert root.parent_span_id == "" and root.scope == "flexinfer/lifecycle"
    assert root.attributes == {"flexinfer.model": "tiny", "flexinfer.namespace": "default", "flexinfer.group": "gpu0",
                               "flexinfer.activation.kind": "swap", "flexinfer.outcome": "ready",
                               "flexinfer.activation.requests": 2}
    assert root.links == [(receiver.span(f"request-{n}").trace_id, receiver.span(f"request-{n}").span_id)
                          for n in range(2)]
    assert root.trace_id not in {receiver.span("request-0").trace_id, receiver.span("request-1").trace_id}
    assert abs((root.end_ns - root.start_ns) / 1e9 - 8.0) < 1e-3
    assert abs(root.end_ns / 1e9 - (time.time() - 2.0)) < 5.0  # mapped to wall-clock time
    for name, started, ended in stages:
        child = receiver.span(f"activation.{name}")
        assert child.parent_span_id == root.span_id and child.trace_id == root.trace_id
        assert child.attributes == {"flexinfer.stage": name}
        assert abs((child.start_ns - root.start_ns) / 1e9 - (started - t0)) < 1e-3
        assert abs((child.end_ns - child.start_ns) / 1e9 - (ended - started)) < 1e-3


def test_failed_activation_marks_root_and_last_stage(receiver: OTLPReceiver) -> None:
    tracing = start(receiver)
    t0 = time.monotonic()
    record_activation(tracing, model="big", namespace="ns", kind="cold_start", start=t0, end=t0 + 3,
                      stages=[("staging", t0, t0 + 1), ("server_start", t0 + 1, t0 + 3)], outcome="failed",
                      error="server exited with code 1")
    tracing.shutdown()
    root = receiver.span("model.activation")
    assert (root.status_code, root.status_message) == (ERROR, "server exited with code 1")
    assert root.attributes["flexinfer.outcome"] == "failed" and "flexinfer.group" not in root.attributes
    assert receiver.span("activation.server_start").status_code == ERROR
    assert receiver.span("activation.staging").status_code == UNSET
