"""Recent lifecycle activity kept in memory for the status page: the last activations (with their stage
breakdown), a ring of cold-start/swap durations for the latency chart, and recent errors.

``ActivityLog`` is a ``LifecycleObserver`` (``flexinfer.assembly`` adds it to the dispatcher's observer
group in both engines); ``ErrorLogHandler`` is a ``logging.Handler`` that copies WARNING-and-above records
of the ``flexinfer`` loggers into the same log. ``flexinfer.proxy.status_page`` reads ``snapshot()``.
Times are converted from the dispatcher's monotonic clock to wall-clock seconds (Unix time) when recorded.

Each activation's stage offsets count from its row origin: the earliest of the decision and its stages. A
model that had to wait for its group has a ``queue`` stage that began (with the first waiting request)
before the decision, so its origin is that first wait and ``decision`` says how far into the row the
decision lies; every offset is then ``>= 0`` and the timeline never draws a bar left of its plot area.
``seconds`` stays decision → Ready (cold start / swap latency never include the queue).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass

from flexinfer.api.model import Model
from flexinfer.runtime.observer import NO_CAUSE, ActivationRecord, NullObserver, PhaseCause

MAX_ACTIVATIONS = 20
MAX_DURATIONS = 500
MAX_ERRORS = 50


@dataclass(frozen=True)
class StageSpan:
    """One startup stage of an activation: offsets in seconds from the activation's row origin (never
    negative)."""

    stage: str
    start: float
    end: float


@dataclass(frozen=True)
class Activation:
    """One finished activation as the status page shows it.

    ``started_at`` is the decision (wall clock) and ``seconds`` runs from it to Ready (or the failure);
    ``decision`` is the decision's offset from the row origin (``0.0`` unless requests queued before it)."""

    model: str
    group: str | None
    kind: str
    result: str
    started_at: float
    seconds: float
    stages: tuple[StageSpan, ...]
    preempted: str | None
    decision: float = 0.0


@dataclass(frozen=True)
class ErrorEntry:
    """One recent error: where it came from (a model key or a logger name) and what happened."""

    at: float
    source: str
    message: str


class ActivityLog(NullObserver):
    """Bounded in-memory history of activations, durations and errors (see the module docstring)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 max_activations: int = MAX_ACTIVATIONS, max_durations: int = MAX_DURATIONS,
                 max_errors: int = MAX_ERRORS) -> None:
        self._clock, self._wall = clock, wall
        self._activations: deque[Activation] = deque(maxlen=max_activations)
        self._durations: deque[tuple[str, float]] = deque(maxlen=max_durations)
        self._errors: deque[ErrorEntry] = deque(maxlen=max_errors)

    def _to_wall(self, moment: float) -> float:
        return self._wall() - (self._clock() - moment)

    def activation(self, record: ActivationRecord) -> None:
        origin = row_origin(record)
        stages = tuple(StageSpan(name, _offset(begin, origin), _offset(end, origin))
                       for name, begin, end in record.stages)
        seconds = record.end - record.start
        self._activations.append(Activation(
            model=record.model.key, group=record.model.group, kind=record.kind, result=record.result,
            started_at=self._to_wall(record.start), seconds=seconds, stages=stages,
            preempted=record.preempted.key if record.preempted is not None else None,
            decision=_offset(record.start, origin)))
        if record.result == "success":
            self._durations.append((record.kind, seconds))
        else:
            self.error(record.model.key, f"{record.kind.replace('_', ' ')} failed after {seconds:.1f}s")

    def phase_changed(self, model: Model, old: str | None, new: str, cause: PhaseCause = NO_CAUSE) -> None:
        if new == "Failed" and old != "Failed":
            error = cause.detail.strip().splitlines()[0] if cause.detail.strip() else ""
            self.error(model.key, f"phase {old or 'Idle'} -> Failed" + (f": {error}" if error else ""))

    def error(self, source: str, message: str, at: float | None = None) -> None:
        """Record an error now (or at wall-clock time ``at``)."""
        self._errors.append(ErrorEntry(self._wall() if at is None else at, source, message))

    def snapshot(self) -> dict[str, list[dict[str, object]]]:
        """``activations`` (newest first), ``durations`` (``{kind, seconds}``, oldest first) and ``errors``
        (newest first), as JSON-ready values."""
        return {
            "activations": [{**asdict(a), "stages": [asdict(s) for s in a.stages]}
                            for a in reversed(self._activations)],
            "durations": [{"kind": kind, "seconds": seconds} for kind, seconds in self._durations],
            "errors": [asdict(e) for e in reversed(self._errors)],
        }


def row_origin(record: ActivationRecord) -> float:
    """The instant an activation's timeline row starts: its decision, or the start of a stage that began
    before it (the ``queue`` stage starts with the first request that waited for the group)."""
    return min((record.start, *(begin for _, begin, _ in record.stages)))


def _offset(moment: float, origin: float) -> float:
    """Seconds from ``origin`` (the row origin, never after ``moment``) to ``moment``, to the microsecond."""
    return round(moment - origin, 6)


class ErrorLogHandler(logging.Handler):
    """Copies log records (WARNING and above by default) into an ``ActivityLog``'s errors."""

    def __init__(self, activity: ActivityLog, level: int = logging.WARNING) -> None:
        super().__init__(level)
        self._activity = activity

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                message = f"{message}: {record.exc_info[1]!r}"
            self._activity.error(record.name, message, at=record.created)
        except Exception:
            self.handleError(record)
