"""The lifecycle clock: turns the moments of one activation into latency observations.

An ``Activation`` starts at the activation decision (the arbiter or election chose to start the model;
for a swap, the moment the incumbent lost the GPU to it) and ends when the model is Ready (or the start
fails). From its marks it yields:

- cold start = decision → Ready (every activation);
- swap = swap decision → Ready (only when an incumbent was preempted for this model);
- per-stage durations for the bounded stage labels of ``STAGE_NAMES``: ``queue`` (first waiting demand →
  decision, only when the model had to wait for its group), ``drain`` (swap decision → the engine is
  asked to start this model, i.e. the incumbent drained and stopped; only when that moment was seen),
  and the engine-reported ``staging``/``server_start``/``health`` from the start (each until the next
  stage or Ready; an engine that reports nothing gets one ``server_start`` span). A stage whose start
  was not witnessed (a clock rebuilt after a restart: ``resume``) yields no sample rather than a wrong
  one; the cold-start and swap totals come from persisted decision times and need no witness.
- the Ready instant (``ready_time``): where the engine only learns of Ready later (the Kubernetes manager
  was down or lagging), from the Ready condition's timestamp instead of the moment it was noticed.

Idle time is never included: the clock starts at the decision, not at the last Ready→NotReady flip (the
Go implementation measures from there, spec §3.7). Used by ``flexinfer.core.arbiter.machine``; the Kubernetes
engine builds the same object from its reconcile decisions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

ActivationKind = Literal["cold_start", "swap"]
STAGE_NAMES: Final[tuple[str, ...]] = ("queue", "drain", "staging", "server_start", "health")
ENGINE_STAGES: Final[frozenset[str]] = frozenset({"staging", "server_start", "health"})
CONDITION_RESOLUTION: Final = 1.0
"""Seconds: Kubernetes condition timestamps (``lastTransitionTime``) are stored in whole seconds."""


@dataclass(frozen=True)
class StageSpan:
    stage: str
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return max(self.end - self.start, 0.0)


@dataclass(frozen=True)
class Observations:
    """What one finished activation contributes to the latency histograms."""

    cold_start: float | None
    swap: float | None
    stages: tuple[StageSpan, ...]


@dataclass
class Activation:
    """One activation of one model, from decision to Ready/failure."""

    model: str
    decided_at: float
    kind: ActivationKind = "cold_start"
    preempted: str | None = None
    demand_since: float | None = None
    _marks: list[tuple[str, float]] = field(default_factory=list)

    started_at: float | None = None
    """When the engine was asked to start the model (the drain, if any, ends here)."""
    gap_stage: str | None = None
    """What the time between the start and the first stage reported after it counts as: ``None`` = that
    first stage (the local engine reports its first stage as it starts); ``server_start`` where stages are
    observed later (the Kubernetes manager sees the pod's state only at its next reconcile)."""
    resumed_at: float | None = None
    """Set when the clock was rebuilt after a restart mid-activation: stage boundaries before this instant
    were not witnessed, so engine stages that began before it yield no sample (``resume``)."""

    def start(self, now: float) -> None:
        self.started_at = now

    def resume(self, now: float, stage: str | None) -> None:
        """The clock was rebuilt at ``now`` with ``stage`` (or none) already in progress."""
        self.resumed_at = now
        if stage is not None:
            self.mark(stage, now)

    def mark(self, stage: str, now: float) -> None:
        """An engine stage begins at ``now`` and ends the open one. Unknown names are ignored (labels stay
        bounded); a repeat of the open stage continues it."""
        if stage not in ENGINE_STAGES or (self._marks and self._marks[-1][0] == stage):
            return
        self._marks.append((stage, now))

    def spans(self, end: float) -> tuple[StageSpan, ...]:
        """The stage spans so far, the open one ending at ``end``.

        ``queue`` and ``drain`` come from the decision and the start; a swap whose start was not seen has no
        drain span (never decision → ``end``). Engine stages run from the start: the stage already entered
        by then (or else the first one entered after it, or ``server_start``) counts from the start. Without
        a start, the first engine stage is dropped (it may have begun inside the drain); after ``resume``,
        every engine stage that began before the clock was rebuilt is dropped."""
        out: list[StageSpan] = []
        if self.demand_since is not None and self.demand_since < self.decided_at:
            out.append(StageSpan("queue", self.demand_since, self.decided_at))
        if self.kind == "swap" and self.started_at is not None:
            out.append(StageSpan("drain", self.decided_at, self.started_at))
        bounds = self._bounds()
        ends = [t for _, t in bounds[1:]] + ([end] if bounds else [])
        for (stage, start), stop in zip(bounds, ends, strict=True):
            if self.resumed_at is None or start > self.resumed_at:
                out.append(StageSpan(stage, start, stop))
        return tuple(out)

    def _bounds(self) -> list[tuple[str, float]]:
        """(stage, begins at) for every witnessed engine stage, in time order, repeats merged."""
        marks = sorted(self._marks, key=lambda mark: mark[1])
        if self.started_at is None:
            return _merged(marks[1:])
        before = [stage for stage, t in marks if t <= self.started_at]
        after = [(stage, t) for stage, t in marks if t > self.started_at]
        if before:
            return _merged([(before[-1], self.started_at), *after])
        if after and self.gap_stage is None:
            return _merged([(after[0][0], self.started_at), *after[1:]])
        return _merged([(self.gap_stage or "server_start", self.started_at), *after])

    def ready_time(self, seen: float, condition: float | None) -> float:
        """When the model became Ready, from the moment it was ``seen`` Ready and the ``condition``'s
        ``lastTransitionTime`` (Pod ``Ready``, else Deployment ``Available``; ``None`` when unknown).

        The API stores condition times in whole seconds, so Ready happened in ``[condition, condition + 1)``
        and not after ``seen``: when seen within that second, ``seen`` (exact but for watch latency); when
        seen later (the observer was down or lagging), the middle of that second (error ≤ 0.5 s). A condition
        older than the decision (an earlier pod) or newer than ``seen`` is ignored. Never before a stage
        boundary already witnessed (the model was still loading then)."""
        ready = seen
        if condition is not None and self.decided_at - CONDITION_RESOLUTION <= condition <= seen \
                and seen - condition >= CONDITION_RESOLUTION:
            ready = condition + CONDITION_RESOLUTION / 2
        witnessed = [self.decided_at, *(t for _, t in self._marks)]
        if self.started_at is not None:
            witnessed.append(self.started_at)
        return max(ready, *witnessed)

    def finish(self, ready_at: float) -> Observations:
        """Observations for an activation that reached Ready at ``ready_at``."""
        took = max(ready_at - self.decided_at, 0.0)
        return Observations(cold_start=took, swap=took if self.kind == "swap" else None,
                            stages=self.spans(ready_at))

    def fail(self, failed_at: float) -> Observations:
        """A failed start yields stage spans only (no latency sample)."""
        return Observations(cold_start=None, swap=None, stages=self.spans(failed_at))


def _merged(bounds: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """Consecutive boundaries of the same stage are one stage."""
    out: list[tuple[str, float]] = []
    for stage, t in bounds:
        if not out or out[-1][0] != stage:
            out.append((stage, t))
    return out


def stage_totals(spans: tuple[StageSpan, ...]) -> dict[str, float]:
    """Seconds per stage name (a stage entered twice, e.g. ``server_start`` around weight loading, is one
    sample of its total time), in first-entered order."""
    totals: dict[str, float] = {}
    for span in spans:
        totals[span.stage] = totals.get(span.stage, 0.0) + span.seconds
    return totals
