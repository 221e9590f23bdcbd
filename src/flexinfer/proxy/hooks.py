"""The proxy's observability ports: the metric calls and trace spans it makes, as small Protocols.

The proxy imports no other adapter; ``flexinfer.assembly`` injects objects satisfying these Protocols
(adapters over ``flexinfer.observability.metrics`` and ``flexinfer.observability.tracing``). The null
implementations here are the defaults (tests, benchmarks, tracing off).

Metric calls (all labels bounded: ``model`` is the model key ``namespace/name`` the catalog resolved, labelled
as ``model`` and ``namespace``, or ``None`` for an unknown, ambiguous or missing model):

- ``request_finished(model, status, seconds)`` → ``flexinfer_proxy_requests_total{model,namespace,status}`` and
  ``flexinfer_proxy_request_duration_seconds{model,namespace}``; ``status`` ∈ success, error, cancelled (the
  client went away), rate_limited, parked, background_not_ready.
- ``connection_opened(model)`` / ``connection_closed(model)`` → ``flexinfer_proxy_active_connections``.
- ``wait_started(model)`` → ``flexinfer_proxy_queued_requests_total`` +1, ``flexinfer_proxy_queue_depth`` +1:
  the request waits for its model, at either gate (a per-model concurrency slot or an activation); once per
  request however many gates hold it.
- ``wait_finished(model, seconds, outcome)`` → queue_depth -1, ``flexinfer_proxy_queue_wait_duration_seconds``
  (from the first wait to the grant), and ``flexinfer_proxy_queue_rejected_total`` when outcome is
  ``rejected``. Outcomes: granted, timeout, rejected, failed, cancelled.
- ``activation_finished(model, seconds, outcome)`` → ``flexinfer_proxy_activation_duration_seconds{result}``
  (success/failure; nothing when cancelled) for a request that waited for a cold start or swap.
- ``rate_limited(model, scope)`` → ``flexinfer_proxy_rate_limited_total{model,scope}`` (scope model/global).
- ``shutdown(result, seconds)`` → ``flexinfer_proxy_shutdowns_total{result}`` (+ duration when completed).

Trace spans: ``ProxyTracer.start_request`` opens ``proxy.handle_request`` (parented on incoming headers);
``RequestTrace.cold_start(model)`` opens the ``proxy.cold_start`` child; ``RequestTrace.upstream(method,
url, headers)`` opens the upstream client span and injects the trace context into ``headers``.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Protocol


class ProxyMetrics(Protocol):
    """The metric calls the proxy makes (see the module docstring for the metric each feeds)."""

    def request_finished(self, model: str | None, status: str, seconds: float) -> None: ...

    def connection_opened(self, model: str) -> None: ...

    def connection_closed(self, model: str) -> None: ...

    def wait_started(self, model: str) -> None: ...

    def wait_finished(self, model: str, seconds: float, outcome: str) -> None: ...

    def activation_finished(self, model: str, seconds: float, outcome: str) -> None: ...

    def rate_limited(self, model: str | None, scope: str) -> None: ...

    def shutdown(self, result: str, seconds: float) -> None: ...


class Span(Protocol):
    """An open span; ``end`` is called exactly once."""

    def set_attribute(self, key: str, value: str | int | float | bool) -> None: ...

    def end(self, status_code: int | None = None, error: str | None = None) -> None: ...


class RequestTrace(Span, Protocol):
    """The ``proxy.handle_request`` span, able to open its children."""

    def cold_start(self, model: str) -> Span: ...

    def upstream(self, method: str, url: str, headers: MutableMapping[str, str]) -> Span: ...


class ProxyTracer(Protocol):
    """Opens one ``RequestTrace`` per proxied request."""

    def start_request(self, method: str, route: str, headers: Mapping[str, str]) -> RequestTrace: ...

    def start_list_models(self, method: str, headers: Mapping[str, str]) -> Span:
        """Open the ``proxy.list_models`` span of one ``/v1/models`` request."""


class NullMetrics:
    """Records nothing."""

    def request_finished(self, model: str | None, status: str, seconds: float) -> None:
        return None

    def connection_opened(self, model: str) -> None:
        return None

    def connection_closed(self, model: str) -> None:
        return None

    def wait_started(self, model: str) -> None:
        return None

    def wait_finished(self, model: str, seconds: float, outcome: str) -> None:
        return None

    def activation_finished(self, model: str, seconds: float, outcome: str) -> None:
        return None

    def rate_limited(self, model: str | None, scope: str) -> None:
        return None

    def shutdown(self, result: str, seconds: float) -> None:
        return None


class NullSpan:
    """A span that records nothing (also serves as the null ``RequestTrace``)."""

    def set_attribute(self, key: str, value: str | int | float | bool) -> None:
        return None

    def end(self, status_code: int | None = None, error: str | None = None) -> None:
        return None

    def cold_start(self, model: str) -> Span:
        return self

    def upstream(self, method: str, url: str, headers: MutableMapping[str, str]) -> Span:
        return self


class NullTracer:
    """Tracing off."""

    _span = NullSpan()

    def start_request(self, method: str, route: str, headers: Mapping[str, str]) -> RequestTrace:
        return self._span

    def start_list_models(self, method: str, headers: Mapping[str, str]) -> Span:
        return self._span
