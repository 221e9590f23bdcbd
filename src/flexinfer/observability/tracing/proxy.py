"""Spans of one proxied request: ``proxy.handle_request`` and its children ``proxy.cold_start``/``proxy.upstream``;
and ``proxy.list_models`` for ``GET /v1/models`` (``ProxyTracer.start_list_models``).

Called by the proxy (``flexinfer.proxy``) through ``ProxyTracer``, which ``flexinfer.assembly`` builds as
``ProxyTracer(tracing)``; it matches the proxy's ``flexinfer.proxy.hooks.ProxyTracer`` port::

    span = tracer.start_request(request.method, route, request.headers)   # current span of this task
    span.set_attribute("url.path", request.path)   # raw path; ``route`` is the template (``/v1/{tail}``)
    wait = span.cold_start(model)            # child; may be opened from another task (not made current)
    wait.set_attribute("flexinfer.outcome", "timeout"); wait.end(error="timeout")
    call = span.upstream("POST", url, headers)   # child client span; its context is injected into headers
    call.end(response.status)
    span.end(status_code, error_code)

The same objects are context managers (``with``/``async with``; ``request_span(tracing, ...)`` builds an
unstarted request span): an escaping exception is recorded, a ``RequestError`` gives the status code.

The request span continues the incoming ``traceparent`` unless ``FLEXINFER_OTEL_TRUST_INCOMING`` is off, in
which case it starts a new trace and the client's trace headers are also dropped from the upstream request.
The request span is current while open, so a ``contextvars`` copy taken inside the request (the dispatcher's
activation triggers) carries it; ``span.link`` gives its span context directly.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, MutableMapping
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanContext, SpanKind, Status, StatusCode

from flexinfer.core.errors import ColdStartTimeoutError, QueueFullError, RequestError
from flexinfer.observability.tracing.provider import PROPAGATION_HEADERS, SpanScope, Tracing, record_failure

TRACER = "flexinfer/proxy"


class _StatusScope(SpanScope):
    """A span that carries an HTTP status code; codes ≥ ``error_from`` are errors."""

    error_from = 500
    status_code: int | None = None

    def set_status_code(self, status: int) -> None:
        """Set ``http.response.status_code``; codes ≥ ``error_from`` also set status ERROR."""
        self.status_code = status
        self.span.set_attribute("http.response.status_code", status)
        if status >= self.error_from:
            self.span.set_attribute("error.type", str(status))
            self.span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))

    def end(self, status_code: int | None = None, error: str | None = None) -> None:
        """Explicit close: the final status code (if known) and an error description (if it failed)."""
        if status_code is not None:
            self.set_status_code(status_code)
        if error:
            self._fail_with(error)
        self.close()

    def _fail_with(self, error: str) -> None:
        self.span.set_status(Status(StatusCode.ERROR, error))

    def _finish(self, error: BaseException | None) -> None:
        """A ``RequestError`` gives the status code (if none was set) and is a failure only from ``error_from``;
        any other exception is a failure, even after a 2xx status (a stream that broke half-way)."""
        if isinstance(error, RequestError):
            if self.status_code is None:
                self.set_status_code(error.status)
            if error.status >= self.error_from:
                record_failure(self.span, error)
        elif isinstance(error, Exception):
            record_failure(self.span, error)


class RequestSpan(_StatusScope):
    """``proxy.handle_request``: the server span of one request (queueing, activation wait, upstream call)."""

    name = "proxy.handle_request"

    def __init__(
        self, tracing: Tracing, method: str, route: str, path: str | None, headers: Mapping[str, str],
    ) -> None:
        self._tracing = tracing
        self._attributes = {"http.request.method": method, "http.route": route}
        if path is not None:
            self._attributes["url.path"] = path
        self._headers = headers

    def _start(self) -> Span:
        parent = self._tracing.extract(self._headers) or Context()
        return self._tracing.tracer(TRACER).start_span(
            self.name, context=parent, kind=SpanKind.SERVER, attributes=self._attributes,
        )

    def _fail_with(self, error: str) -> None:
        """``error`` is the proxy's error code; with a 4xx status it is the client's failure, not ours."""
        self.span.set_attribute("flexinfer.error", error)
        if self.status_code is None or self.status_code >= self.error_from:
            super()._fail_with(error)

    @property
    def link(self) -> SpanContext:
        """This span's context, for linking an activation trace to it (invalid when tracing is off)."""
        return self.span.get_span_context()

    def set_model(self, model: str) -> None:
        """Set ``flexinfer.model`` (call again after alias resolution; the last value wins)."""
        self.span.set_attribute("flexinfer.model", model)

    def cold_start(self, model: str) -> ColdStartSpan:
        """Open child span ``proxy.cold_start`` for the wait until ``model`` is Ready."""
        return ColdStartSpan(self._tracing, self.span, model).start()

    def upstream(self, method: str, url: str, headers: MutableMapping[str, str]) -> UpstreamSpan:
        """Open child client span ``proxy.upstream`` and inject its context into ``headers``."""
        return UpstreamSpan(self._tracing, self.span, method, url, headers).start()


class ListModelsSpan(RequestSpan):
    """``proxy.list_models``: the server span of one ``/v1/models`` request (``flexinfer.models`` = entries)."""

    name = "proxy.list_models"


class ColdStartSpan(_StatusScope):
    """``proxy.cold_start`` with ``flexinfer.model`` and ``flexinfer.outcome``.

    The outcome is ``granted`` on success; used as a context manager, an escaping exception sets the
    proxy's wait outcomes (``timeout``, ``rejected``, ``failed``, ``cancelled``) with status ERROR.
    """

    current = False

    def __init__(self, tracing: Tracing, parent: Span, model: str) -> None:
        self._tracing = tracing
        self._parent = parent
        self._model = model
        self.outcome: str | None = None

    def _start(self) -> Span:
        return self._tracing.tracer(TRACER).start_span(
            "proxy.cold_start", context=trace.set_span_in_context(self._parent),
            attributes={"flexinfer.model": self._model},
        )

    def set_outcome(self, outcome: str) -> None:
        self.set_attribute("flexinfer.outcome", outcome)

    def set_attribute(self, key: str, value: str | bool | int | float) -> None:
        if key == "flexinfer.outcome":
            self.outcome = str(value)
        super().set_attribute(key, value)

    def _fail_with(self, error: str) -> None:
        self.outcome = self.outcome or error
        super()._fail_with(error)

    def _finish(self, error: BaseException | None) -> None:
        self.outcome = self.outcome or wait_outcome(error)
        self.span.set_attribute("flexinfer.outcome", self.outcome)
        if isinstance(error, Exception):
            record_failure(self.span, error)


def wait_outcome(error: BaseException | None) -> str:
    """The wait outcome for an exception (the proxy's bounded labels)."""
    if error is None:
        return "granted"
    if isinstance(error, ColdStartTimeoutError):
        return "timeout"
    if isinstance(error, QueueFullError):
        return "rejected"
    if isinstance(error, asyncio.CancelledError):
        return "cancelled"
    return "failed"


class UpstreamSpan(_StatusScope):
    """``proxy.upstream``: the client call to the model server. Codes ≥ 400 are errors (client-span rule)."""

    error_from = 400
    current = False

    def __init__(
        self, tracing: Tracing, parent: Span, method: str, url: str, headers: MutableMapping[str, str],
    ) -> None:
        self._tracing = tracing
        self._parent = parent
        self._method = method
        self._url = url
        self._headers = headers

    def _start(self) -> Span:
        span = self._tracing.tracer(TRACER).start_span(
            "proxy.upstream", context=trace.set_span_in_context(self._parent), kind=SpanKind.CLIENT,
            attributes=_client_attributes(self._method, self._url),
        )
        if not self._tracing.settings.trust_incoming:
            _drop_trace_headers(self._headers)
        self._tracing.inject(self._headers, trace.set_span_in_context(span))
        return span


def _client_attributes(method: str, url: str) -> dict[str, str | int]:
    attributes: dict[str, str | int] = {"http.request.method": method, "url.full": url}
    parts = urlsplit(url)
    if parts.hostname:
        attributes["server.address"] = parts.hostname
    with contextlib.suppress(ValueError):  # a port out of range
        if parts.port:
            attributes["server.port"] = parts.port
    return attributes


def _drop_trace_headers(headers: MutableMapping[str, str]) -> None:
    """Remove client-supplied ``traceparent``/``tracestate``/``baggage`` (any letter case)."""
    for key in {key for key in headers if key.lower() in PROPAGATION_HEADERS}:
        headers.pop(key, None)


def request_span(tracing: Tracing, method: str, route: str, path: str, headers: Mapping[str, str]) -> RequestSpan:
    """An unstarted ``proxy.handle_request`` span for ``with``/``async with`` (``route``: the route template)."""
    return RequestSpan(tracing, method, route, path, headers)


class ProxyTracer:
    """The proxy's tracer port (``flexinfer.proxy.hooks.ProxyTracer``) over a ``Tracing`` handle."""

    def __init__(self, tracing: Tracing) -> None:
        self._tracing = tracing

    def start_request(self, method: str, route: str, headers: Mapping[str, str]) -> RequestSpan:
        """Open ``proxy.handle_request`` (current span of the calling task until ``end``).

        ``route`` is the route template (bounded ``http.route``); the caller sets ``url.path`` (the raw path)
        with ``set_attribute``.
        """
        return RequestSpan(self._tracing, method, route, None, headers).start()

    def start_list_models(self, method: str, headers: Mapping[str, str]) -> ListModelsSpan:
        """Open ``proxy.list_models`` (``http.route`` ``/v1/models``); the caller ends it with the status code."""
        return ListModelsSpan(self._tracing, method, "/v1/models", "/v1/models", headers).start()


def proxy_tracer(tracing: Tracing) -> ProxyTracer | None:
    """The proxy's tracer for ``create_app``: ``None`` (the proxy's null tracer) when tracing is off and incoming
    context is trusted. With ``FLEXINFER_OTEL_TRUST_INCOMING=false`` a tracer is returned even while tracing is
    off, because it is what removes the client's trace headers from the upstream request."""
    if tracing.enabled or not tracing.settings.trust_incoming:
        return ProxyTracer(tracing)
    return None
