"""The reconcile span: one ``<controller>.reconcile`` span per reconcile, plus the reconcile metrics.

Called by the Kubernetes engine's handlers (``flexinfer.manager``) through a factory that ``flexinfer.assembly``
binds, e.g. ``functools.partial(reconcile_span, tracing, metrics=metrics)``::

    async with reconcile(controller="model", namespace=ns, name=name) as scope:
        ...                      # an escaping exception is recorded, counted and re-raised
        scope.record_error(err)  # an error that is handled here but should still count

Duration is observed and errors are counted whether or not tracing is enabled. Only ``Exception`` counts as
an error: cancellation (``asyncio.CancelledError``) ends the span without one.
"""

from __future__ import annotations

import time
from typing import Protocol

from opentelemetry.trace import Span

from flexinfer.observability.tracing.provider import SpanScope, Tracing, record_failure

TRACER = "flexinfer/controller"


class ReconcileMetrics(Protocol):
    """What the reconcile span needs from the metrics module (``flexinfer_reconcile_*``)."""

    def reconcile_duration(self, controller: str, seconds: float) -> None:
        """Observe ``flexinfer_reconcile_duration_seconds{controller}``."""

    def reconcile_error(self, controller: str) -> None:
        """Increment ``flexinfer_reconcile_errors_total{controller}``."""


class ReconcileSpan(SpanScope):
    """A context manager (sync or async) around one reconcile of ``namespace/name`` by ``controller``."""

    def __init__(self, tracing: Tracing, controller: str, namespace: str, name: str, metrics: ReconcileMetrics) -> None:
        self._tracing = tracing
        self.controller = controller
        self._namespace = namespace
        self._name = name
        self._metrics = metrics
        self._started = 0.0
        self._errored = False

    def _start(self) -> Span:
        self._started = time.monotonic()
        return self._tracing.tracer(TRACER).start_span(
            f"{self.controller}.reconcile",
            attributes={"k8s.namespace": self._namespace, "k8s.name": self._name, "controller": self.controller},
        )

    def record_error(self, error: BaseException) -> None:
        """Record an error on the span and count it; counted once per reconcile however often it is called."""
        record_failure(self.span, error)
        if not self._errored:
            self._errored = True
            self._metrics.reconcile_error(self.controller)

    def _finish(self, error: BaseException | None) -> None:
        try:
            if isinstance(error, Exception):
                self.record_error(error)
        finally:
            self._metrics.reconcile_duration(self.controller, time.monotonic() - self._started)


def reconcile_span(
    tracing: Tracing, controller: str, namespace: str, name: str, metrics: ReconcileMetrics,
) -> ReconcileSpan:
    """Start-on-enter scope for one reconcile: span ``<controller>.reconcile`` + reconcile metrics."""
    return ReconcileSpan(tracing, controller, namespace, name, metrics)
