"""A real OTLP/HTTP trace receiver for tests: decodes ``ExportTraceServiceRequest`` protobuf (plain, gzip or
deflate) on a free loopback port and keeps every span with its resource and scope.

Used by the tracing tests (``tests/unit/observability/test_tracing*.py``) and by any test that needs to see
what an exporter really sent::

    with OTLPReceiver() as receiver:
        env = {"FLEXINFER_OTEL_ENABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
        ...
        spans = receiver.wait_for_spans(3)          # deadline-bounded, no sleeps
"""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

TRACES_PATH = "/v1/traces"


@dataclass(frozen=True)
class ReceivedSpan:
    """One decoded span. Ids are lowercase hex (``parent_span_id`` is ``""`` for a root span)."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    """``opentelemetry.proto.trace.v1.Span.SpanKind``: 1 internal, 2 server, 3 client."""
    start_ns: int
    end_ns: int
    status_code: int
    """0 unset, 1 ok, 2 error."""
    status_message: str
    attributes: dict[str, Any]
    resource: dict[str, Any]
    scope: str
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)
    """``(trace_id, span_id)`` of each span link."""


def any_value(value: AnyValue) -> Any:
    """An OTLP ``AnyValue`` as a Python value."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [any_value(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return attributes(value.kvlist_value.values)
    return getattr(value, kind) if kind else None


def attributes(pairs: Any) -> dict[str, Any]:
    """Repeated ``KeyValue`` as a dict."""
    return {pair.key: any_value(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


def decode(request: ExportTraceServiceRequest) -> list[ReceivedSpan]:
    """Flatten resource → scope → spans into ``ReceivedSpan`` values."""
    spans: list[ReceivedSpan] = []
    for resource_spans in request.resource_spans:
        resource = attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            spans.extend(_span(span, resource, scope_spans.scope.name) for span in scope_spans.spans)
    return spans


def _span(span: Any, resource: dict[str, Any], scope: str) -> ReceivedSpan:
    return ReceivedSpan(
        name=span.name, trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
        parent_span_id=span.parent_span_id.hex(), kind=span.kind,
        start_ns=span.start_time_unix_nano, end_ns=span.end_time_unix_nano,
        status_code=span.status.code, status_message=span.status.message,
        attributes=attributes(span.attributes), resource=resource, scope=scope,
        events=[(event.name, attributes(event.attributes)) for event in span.events],
        links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
    )


class OTLPReceiver:
    """A threaded HTTP server answering ``POST /v1/traces`` like an OpenTelemetry collector."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._spans: list[ReceivedSpan] = []
        self.encodings: list[str] = []
        """The ``Content-Encoding`` of each export request (``""`` when uncompressed)."""
        self.headers: list[dict[str, str]] = []
        self._changed = threading.Condition()
        self._server = ThreadingHTTPServer((host, 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="otlp-receiver", daemon=True,
        )

    @property
    def endpoint(self) -> str:
        """Base URL for ``OTEL_EXPORTER_OTLP_ENDPOINT`` (the exporter appends ``/v1/traces``)."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def traces_url(self) -> str:
        return self.endpoint + TRACES_PATH

    def spans(self) -> list[ReceivedSpan]:
        with self._changed:
            return list(self._spans)

    def span(self, name: str) -> ReceivedSpan:
        """The only received span called ``name`` (fails if there are none or several)."""
        found = [span for span in self.spans() if span.name == name]
        assert len(found) == 1, f"expected one span {name!r}, got {[s.name for s in self.spans()]}"
        return found[0]

    def wait_for_spans(self, count: int, timeout: float = 10.0) -> list[ReceivedSpan]:
        """Block until at least ``count`` spans arrived; ``TimeoutError`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self._spans) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    names = [span.name for span in self._spans]
                    raise TimeoutError(f"{len(self._spans)}/{count} spans within {timeout}s: {names}")
                self._changed.wait(left)
            return list(self._spans)

    def _accept(self, body: bytes, encoding: str, headers: dict[str, str]) -> None:
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        spans = decode(ExportTraceServiceRequest.FromString(body))
        with self._changed:
            self.encodings.append(encoding)
            self.headers.append(headers)
            self._spans.extend(spans)
            self._changed.notify_all()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.path != TRACES_PATH:
                    self.send_error(404)
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                encoding = self.headers.get("Content-Encoding", "")
                receiver._accept(body, encoding, {key.lower(): value for key, value in self.headers.items()})
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: tests read what was received, not the access log."""

        return Handler

    def start(self) -> OTLPReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> OTLPReceiver:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
