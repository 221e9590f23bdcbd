"""The tracing handle (``Tracing``), its constructor ``init_tracing`` and the span-scope base of the helpers.

``flexinfer.assembly`` calls ``init_tracing`` once per process (manager, proxy, ``serve``) and hands the
handle to whatever emits spans; it calls ``Tracing.shutdown()`` on exit, which flushes queued spans.

OpenTelemetry's process globals (tracer provider, propagator) are never set, enabled or not: the handle
carries its own provider and W3C trace-context + baggage propagator. That keeps two handles in one process
(tests, ``serve`` running proxy and engine together) apart and makes "disabled touches nothing" trivially
true. The only shared state used is OpenTelemetry's context variable, while a span scope is entered.

Only the OpenTelemetry API (no-op tracers, context, W3C propagators) is imported with this module; the SDK and
the OTLP exporter are imported by ``init_tracing`` when tracing is enabled, so a process with tracing off
(every ``flexinfer serve`` cold start by default) never loads them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, MutableMapping
from contextvars import Token
from types import TracebackType
from typing import TYPE_CHECKING, Self
from urllib.parse import urlsplit

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from flexinfer.core.errors import ConfigError
from flexinfer.observability.tracing.config import TracingSettings

if TYPE_CHECKING:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace import sampling as otel_sampling

PROPAGATOR = CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])
PROPAGATION_HEADERS = frozenset(PROPAGATOR.fields)
"""``traceparent``, ``tracestate``, ``baggage``: the headers that carry trace context."""


class Tracing:
    """A process's tracing: a tracer source plus W3C propagation. Disabled → everything is a no-op."""

    def __init__(self, settings: TracingSettings, provider: TracerProvider | None = None) -> None:
        self.settings = settings
        self._provider = provider
        self._tracers: dict[str, trace.Tracer] = {}

    @property
    def enabled(self) -> bool:
        return self._provider is not None

    def tracer(self, name: str) -> trace.Tracer:
        """A tracer named after the emitting component (``flexinfer/proxy``); a no-op tracer when disabled.
        Made once per name (the SDK makes a new tracer, with a deprecation check, on every ``get_tracer``)."""
        tracer = self._tracers.get(name)
        if tracer is None:
            tracer = self._tracers[name] = self._provider.get_tracer(name) if self._provider else trace.NoOpTracer()
        return tracer

    def extract(self, headers: Mapping[str, str]) -> Context | None:
        """The trace context carried by incoming ``headers``; ``None`` when disabled or not trusted."""
        if not (self.enabled and self.settings.trust_incoming):
            return None
        return PROPAGATOR.extract({key.lower(): value for key, value in headers.items()}, context=Context())

    def inject(self, headers: MutableMapping[str, str], context: Context | None = None) -> None:
        """Write ``context`` (default: the current one) into outgoing ``headers``; no-op when disabled."""
        if self.enabled:
            PROPAGATOR.inject(headers, context=context)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export every finished span now; ``True`` when all were exported (always ``True`` when disabled)."""
        return self._provider.force_flush(timeout_millis) if self._provider else True

    def shutdown(self) -> None:
        """Flush queued spans and stop the exporter. Idempotent; a no-op when disabled."""
        provider, self._provider = self._provider, None
        if provider is not None:
            provider.shutdown()


def init_tracing(service_name: str, settings: TracingSettings) -> Tracing:
    """Build the process's tracing. Disabled → a no-op handle; nothing is created or touched.

    Enabled → a tracer provider with the resource, sampler and a batch processor over OTLP/HTTP protobuf.
    Raises ``ConfigError`` (enabled only) for an unusable endpoint, protocol or sampler.
    """
    if not settings.enabled:
        return Tracing(settings)
    from opentelemetry.sdk.trace import TracerProvider  # the SDK: only when enabled (see the module docstring)
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(
        sampler=sampler(settings.sampler, settings.sampler_arg),
        resource=resource(service_name, settings),
        shutdown_on_exit=False,
    )
    batch = settings.batch
    provider.add_span_processor(BatchSpanProcessor(
        exporter(settings),
        max_queue_size=batch.max_queue_size,
        schedule_delay_millis=batch.schedule_delay_millis,
        max_export_batch_size=min(batch.max_export_batch_size, batch.max_queue_size),
        export_timeout_millis=batch.export_timeout_millis,
    ))
    return Tracing(settings, provider)


def exporter(settings: TracingSettings) -> OTLPSpanExporter:
    """The OTLP/HTTP protobuf exporter, every option passed explicitly from the settings."""
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    options = settings.exporter
    if options.protocol != "http/protobuf":
        raise ConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL={options.protocol!r}: only 'http/protobuf' is supported")
    url = urlsplit(options.endpoint)
    if url.scheme not in {"http", "https"} or not url.hostname:
        raise ConfigError(f"OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT: {options.endpoint!r} is not an http(s) URL")
    for name, path in (("CERTIFICATE", options.certificate), ("CLIENT_KEY", options.client_key),
                       ("CLIENT_CERTIFICATE", options.client_certificate)):
        if path is not None and not os.path.isfile(path):  # TLS fails closed: no export without the file
            raise ConfigError(f"OTEL_EXPORTER_OTLP_[TRACES_]{name}: {path!r} is not a readable file")
    return OTLPSpanExporter(
        endpoint=options.endpoint,
        certificate_file=options.certificate,
        client_key_file=options.client_key,
        client_certificate_file=options.client_certificate,
        headers=dict(options.headers),
        timeout=options.timeout_seconds,
        compression=Compression(options.compression),
    )


def resource(service_name: str, settings: TracingSettings) -> Resource:
    """``OTEL_RESOURCE_ATTRIBUTES``, then ``service.name`` (``OTEL_SERVICE_NAME`` over the process's name) and
    ``service.namespace`` (``FLEXINFER_OTEL_SERVICE_NAMESPACE``, when set), over the SDK's own attributes."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.version import __version__ as sdk_version

    attributes: dict[str, str] = {
        "telemetry.sdk.language": "python", "telemetry.sdk.name": "opentelemetry", "telemetry.sdk.version": sdk_version,
    }
    attributes.update(settings.resource_attributes)
    attributes["service.name"] = settings.service_name or service_name
    if settings.service_namespace:
        attributes["service.namespace"] = settings.service_namespace
    return Resource(attributes)


def sampler(name: str, arg: str) -> otel_sampling.Sampler:
    """The standard ``OTEL_TRACES_SAMPLER`` names; the ratio (``_ARG``) defaults to 1.0. A ratio that is not a
    number from 0 to 1 is a ``ConfigError`` (never clamped: a typo must not silently sample everything)."""
    from opentelemetry.sdk.trace import sampling as otel_sampling

    ratio = sampler_ratio(arg)
    samplers: dict[str, otel_sampling.Sampler] = {
        "always_on": otel_sampling.ALWAYS_ON,
        "always_off": otel_sampling.ALWAYS_OFF,
        "traceidratio": otel_sampling.TraceIdRatioBased(ratio),
        "parentbased_always_on": otel_sampling.ParentBased(otel_sampling.ALWAYS_ON),
        "parentbased_always_off": otel_sampling.ParentBased(otel_sampling.ALWAYS_OFF),
        "parentbased_traceidratio": otel_sampling.ParentBased(otel_sampling.TraceIdRatioBased(ratio)),
    }
    if name not in samplers:
        raise ConfigError(f"OTEL_TRACES_SAMPLER={name!r}: expected one of {', '.join(sorted(samplers))}")
    return samplers[name]


def sampler_ratio(arg: str) -> float:
    """``OTEL_TRACES_SAMPLER_ARG`` as a ratio in [0, 1]; empty → 1.0; anything else → ``ConfigError``."""
    if not arg:
        return 1.0
    try:
        ratio = float(arg)
    except ValueError:
        ratio = math.nan
    if not 0.0 <= ratio <= 1.0:  # also rejects NaN
        raise ConfigError(f"OTEL_TRACES_SAMPLER_ARG={arg!r} is not a number from 0 to 1")
    return ratio


class SpanScope:
    """Base of the helpers' spans: a context manager (``with`` / ``async with``) or explicit ``start``/``close``.

    ``start`` opens the span and, when ``current`` is true, makes it the current span of the calling task
    until ``close`` (so open and close it in one task). ``close`` calls ``_finish`` with the exception (if
    any), then ends the span. Both are idempotent; exceptions are never swallowed.
    """

    span: Span = trace.INVALID_SPAN
    current = True
    _token: Token[Context] | None = None
    _state = "new"

    def _start(self) -> Span:
        raise NotImplementedError

    def _finish(self, error: BaseException | None) -> None:
        if isinstance(error, Exception):
            record_failure(self.span, error)

    def set_attribute(self, key: str, value: str | bool | int | float) -> None:
        self.span.set_attribute(key, value)

    def start(self) -> Self:
        """Open the span (once)."""
        if self._state == "new":
            self._state = "open"
            self.span = self._start()
            if self.current:
                self._token = otel_context.attach(trace.set_span_in_context(self.span))
        return self

    def close(self, error: BaseException | None = None) -> None:
        """Finish and end the span (once); ``error`` is the exception that ended the work, if any."""
        if self._state != "open":
            return
        self._state = "closed"
        try:
            self._finish(error)
        finally:
            if self._token is not None:
                otel_context.detach(self._token)
                self._token = None
            self.span.end()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close(error)

    async def __aenter__(self) -> Self:
        return self.start()

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None,
    ) -> None:
        self.close(error)


def record_failure(span: Span, error: BaseException, description: str | None = None) -> None:
    """Record ``error`` on ``span``: an exception event, ``error.type`` and status ERROR."""
    span.record_exception(error)
    span.set_attribute("error.type", type(error).__qualname__)
    span.set_status(Status(StatusCode.ERROR, description or str(error) or type(error).__qualname__))
