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

Modules: ``config`` (settings), ``provider`` (handle, ``init_tracing``), ``reconcile``, ``proxy``, ``lifecycle``
(span helpers). See docs/tracing.md for the spans and attributes.
"""
