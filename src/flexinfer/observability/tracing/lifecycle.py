"""Activation traces: a finished cold start or swap recorded after the fact as one trace.

Called by the dispatcher (``flexinfer.runtime``) through its ``LifecycleObserver`` port: ``flexinfer.assembly``
passes ``TracingObserver(tracing)`` (alone or in an ``ObserverGroup`` with the metrics), whose ``activation``
receives the ``ActivationRecord``. ``record_activation`` is the same thing with plain values.

The trace is a root span ``model.activation`` (``flexinfer.model``, ``flexinfer.namespace``,
``flexinfer.activation.kind``, ``flexinfer.group``, ``flexinfer.outcome``, ``flexinfer.preempted``) with one
child span ``activation.<stage>`` per stage, all carrying the measured times, and a span link to each request
that triggered or joined the activation (at most ``MAX_LINKS``; ``flexinfer.activation.requests`` counts all).
Times are ``time.monotonic()`` readings; they are mapped to wall-clock time when the trace is recorded.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Sequence
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanContext, Status, StatusCode

from flexinfer.observability.tracing.provider import Tracing
from flexinfer.runtime.observer import ActivationRecord, NullObserver

TRACER = "flexinfer/lifecycle"
MAX_LINKS = 32

StageTimes = tuple[str, float, float]
"""``(stage, start, end)``: ``drain``, ``staging``, ``server_start``, ``health`` (or ``queue``)."""


@dataclass(frozen=True)
class _Clock:
    """Maps monotonic seconds to wall-clock nanoseconds, with the offset taken once per trace."""

    offset: float

    @classmethod
    def now(cls) -> _Clock:
        return cls(time.time() - time.monotonic())

    def ns(self, monotonic: float) -> int:
        return int((monotonic + self.offset) * 1e9)


def record_activation(
    tracing: Tracing, *, model: str, namespace: str, kind: str, start: float, end: float,
    stages: Sequence[StageTimes] = (), triggers: Sequence[object] = (), group: str | None = None,
    outcome: str = "ready", error: str | None = None, preempted: str | None = None,
) -> None:
    """Emit the activation trace (``kind`` is ``cold_start`` or ``swap``); a no-op when tracing is off.

    ``triggers`` are span contexts, spans, or ``contextvars`` copies taken while a request span was current;
    anything else is ignored. ``preempted`` names the model a swap displaced (``namespace/name``). ``error``
    (a message) marks the root span and the last stage with status ERROR.
    """
    if not tracing.enabled:
        return
    clock = _Clock.now()
    links = _links(triggers)
    root = tracing.tracer(TRACER).start_span(
        "model.activation", context=Context(), start_time=clock.ns(start), links=links[:MAX_LINKS],
        attributes=_root_attributes(
            model=model, namespace=namespace, kind=kind, group=group, outcome=outcome, requests=len(links),
        ),
    )
    if preempted:
        root.set_attribute("flexinfer.preempted", preempted)
    if error is not None:
        root.set_status(Status(StatusCode.ERROR, error))
    _record_stages(tracing, root, clock, stages, error)
    root.end(end_time=clock.ns(end))


def _root_attributes(
    *, model: str, namespace: str, kind: str, group: str | None, outcome: str, requests: int,
) -> dict[str, str | int]:
    attributes: dict[str, str | int] = {
        "flexinfer.model": model, "flexinfer.namespace": namespace, "flexinfer.activation.kind": kind,
        "flexinfer.outcome": outcome, "flexinfer.activation.requests": requests,
    }
    if group:
        attributes["flexinfer.group"] = group
    return attributes


def _record_stages(
    tracing: Tracing, root: trace.Span, clock: _Clock, stages: Sequence[StageTimes], error: str | None,
) -> None:
    parent = trace.set_span_in_context(root)
    for index, (stage, started, ended) in enumerate(stages):
        span = tracing.tracer(TRACER).start_span(
            f"activation.{stage}", context=parent, start_time=clock.ns(started), attributes={"flexinfer.stage": stage},
        )
        if error is not None and index == len(stages) - 1:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=clock.ns(ended))


def _links(triggers: Sequence[object]) -> list[Link]:
    """One link per distinct valid span context, in the given order."""
    seen: set[tuple[int, int]] = set()
    links: list[Link] = []
    for trigger in triggers:
        context = _span_context(trigger)
        if context is not None and context.is_valid and (context.trace_id, context.span_id) not in seen:
            seen.add((context.trace_id, context.span_id))
            links.append(Link(context))
    return links


def _span_context(trigger: object) -> SpanContext | None:
    """A trigger is a span context, a span, or a ``contextvars`` copy taken while the request span was current."""
    if isinstance(trigger, contextvars.Context):
        trigger = trigger.run(trace.get_current_span)
    if isinstance(trigger, trace.Span):
        trigger = trigger.get_span_context()
    return trigger if isinstance(trigger, SpanContext) else None


class TracingObserver(NullObserver):
    """The dispatcher's ``LifecycleObserver`` for traces: each finished activation becomes a trace."""

    def __init__(self, tracing: Tracing) -> None:
        self._tracing = tracing

    def activation(self, record: ActivationRecord) -> None:
        failed = record.result != "success"
        record_activation(
            self._tracing, model=record.model.name, namespace=record.model.namespace, kind=record.kind,
            start=record.start, end=record.end, stages=record.stages, triggers=record.triggers,
            group=record.model.group, outcome="failed" if failed else "ready",
            error=f"{record.kind} of {record.model.key} failed" if failed else None,
            preempted=record.preempted.key if record.preempted is not None else None,
        )
