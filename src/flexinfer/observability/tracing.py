"""Opt-in OpenTelemetry tracing: the one import for the composition roots (``flexinfer.assembly``).

Off unless ``FLEXINFER_OTEL_ENABLED`` is a truthy word. Off means no exporter, no provider, no global state
and no-op spans; on means OTLP/HTTP protobuf export configured by the standard ``OTEL_EXPORTER_OTLP_*``
variables (read from the settings snapshot, never from the process environment), W3C trace context + baggage.

Wiring (adapters never import this package; assembly hands them objects that fit their ports)::

    tracing = init_tracing("flexinfer-proxy", tracing_settings(env))    # env: the settings snapshot
    create_app(..., tracer=proxy_tracer(tracing))                         # proxy port
    Manager(..., partial(reconcile_span, tracing, metrics=lifecycle_metrics))  # the manager's ReconcileScope
    Dispatcher(..., observer=ObserverGroup([lifecycle_metrics, TracingObserver(tracing)]))  # runtime; the
    ...                                                                   # tracing observer only when enabled
    tracing.shutdown()                                                    # flushes

Modules: ``tracing_config`` (settings), ``tracing_provider`` (handle, ``init_tracing``), ``tracing_reconcile``,
``tracing_proxy``, ``tracing_lifecycle`` (span helpers). See docs/tracing.md for the spans and attributes.
"""

from __future__ import annotations

from flexinfer.observability.tracing_config import (
    BatchSettings,
    ExporterSettings,
    TracingSettings,
    tracing_settings,
)
from flexinfer.observability.tracing_lifecycle import StageTimes, TracingObserver, record_activation
from flexinfer.observability.tracing_provider import PROPAGATION_HEADERS, Tracing, init_tracing
from flexinfer.observability.tracing_proxy import (
    ColdStartSpan,
    ProxyTracer,
    RequestSpan,
    UpstreamSpan,
    proxy_tracer,
    request_span,
)
from flexinfer.observability.tracing_reconcile import ReconcileMetrics, ReconcileSpan, reconcile_span

__all__ = [
    "PROPAGATION_HEADERS", "BatchSettings", "ColdStartSpan", "ExporterSettings", "ProxyTracer", "ReconcileMetrics",
    "ReconcileSpan", "RequestSpan", "StageTimes", "Tracing", "TracingObserver", "TracingSettings", "UpstreamSpan",
    "init_tracing", "proxy_tracer", "reconcile_span", "record_activation", "request_span", "tracing_settings",
]
