"""The lifecycle clock: turns the moments of one activation into latency observations.

An ``Activation`` starts at the activation decision (the arbiter or election chose to start the model;
for a swap, the moment the incumbent lost the GPU to it) and ends when the model is Ready (or the start
fails). From its marks it yields:

- cold start = decision → Ready (every activation);
- swap = swap decision → Ready (only when an incumbent was preempted for this model);
- per-stage durations for the bounded stage labels of ``STAGE_NAMES``: ``queue`` (first waiting demand →
  decision, only when the model had to wait for its group), ``drain`` (swap decision → the engine is
  asked to start this model, i.e. the incumbent drained and stopped; only when that moment was seen),
  and the engine-reported ``staging``/``server_start``/``health``/``restore`` (a llama-server's prompt
  cache loaded back) from the start (each until the next stage or Ready; an engine that reports nothing
  gets one ``server_start`` span). A stage whose start was not witnessed (a clock rebuilt after a restart:
  ``resume``) yields no sample rather than a wrong one; the cold-start and swap totals come from persisted
  decision times and need no witness.
- the Ready instant (``ready_time``, the rule in ``observed_ready``): the moment the Kubernetes manager's watch
  delivered the event that showed the transition, when it saw it live; else (it was down or lagging, or re-listed)
  from the Ready condition's timestamp instead of the moment it was noticed.

A **restart** (``Activation.for_restart``) is the activation of a model whose server went away while Ready
and comes back with its replica kept (a crash, an OOM kill, a replaced pod): it is decided and started at
the moment the engine detected the loss, so the sample covers the whole way back (a restart backoff, the
kubelet's restart) as a cold start, and the time before the first stage the engine reports counts as
``server_start``.

Idle time is never included: the clock starts at the decision, not at the last Ready→NotReady flip (the
Go implementation measures from there, spec §3.7, so a model scaled to zero for an hour reports the hour). A
restart does start at a Ready→NotReady flip, but one of a server that was meant to keep running: nothing idle
lies between the loss and the way back. Used by ``flexinfer.core.arbiter.machine``; the Kubernetes
engine builds the same object from its reconcile decisions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

ActivationKind = Literal["cold_start", "swap"]
STAGE_NAMES: Final[tuple[str, ...]] = ("queue", "drain", "staging", "server_start", "health", "restore")
ENGINE_STAGES: Final[frozenset[str]] = frozenset({"staging", "server_start", "health", "restore"})
CONDITION_RESOLUTION: Final = 1.0
"""Seconds: Kubernetes condition timestamps (``lastTransitionTime``) are stored in whole seconds."""
WATCH_LAG_LIMIT: Final = 0.25
"""Seconds past the end of the condition's second after which a watch event no longer counts as seen live: a
watch that delivers a transition that late was replaying (a reconnect) or stalled, and the condition is the
better witness."""


def observed_ready(seen: float, condition: float | None, watched: float | None) -> float:
    """The Ready instant from what an observer has: the moment ``seen`` it noticed the model Ready, the Ready
    condition's ``lastTransitionTime`` (``None``: unknown) and ``watched``, the moment its watch delivered the
    event that showed the condition turn True (``None``: the transition was not seen live — a restart, a
    re-list, an object first seen already Ready).

    1. Seen live: ``watched`` (within milliseconds of the truth), unless it came more than ``WATCH_LAG_LIMIT``
       after the condition's second ended (a replaying or stalled watch).
    2. Otherwise the condition, stored in whole seconds, says Ready happened in ``[condition, condition + 1)``:
       seen within that second, ``seen``; seen later, the middle of that second (error ≤ 0.5 s); a condition
       newer than ``seen`` is ignored (``seen``)."""
    if watched is not None and (condition is None or watched < condition + CONDITION_RESOLUTION + WATCH_LAG_LIMIT):
        return min(watched, seen)
    if condition is not None and condition <= seen and seen - condition >= CONDITION_RESOLUTION:
        return condition + CONDITION_RESOLUTION / 2
    return seen


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
    restart: bool = False
    """Opened by the loss of a Ready model's server (``for_restart``), not by a decision to start it."""

    @classmethod
    def for_restart(cls, model: str, detected_at: float) -> Activation:
        """The activation of a model whose server went away while Ready and is brought back with its replica
        kept: decided and started at ``detected_at``; until the engine reports a stage, ``server_start``."""
        activation = cls(model, detected_at, gap_stage="server_start", restart=True)
        activation.start(detected_at)
        return activation

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

    def ready_time(self, seen: float, condition: float | None, watched: float | None = None) -> float:
        """When the model became Ready (``observed_ready`` over the moment it was ``seen`` Ready, the Ready
        condition's ``lastTransitionTime`` — Pod ``Ready``, else Deployment ``Available`` — and the moment the
        watch delivered that transition, ``watched``). A condition older than the decision (an earlier pod)
        counts as unknown. Never before the decision or a stage boundary already witnessed (the model was still
        loading then)."""
        if condition is not None and condition < self.decided_at - CONDITION_RESOLUTION:
            condition = watched = None
        ready = observed_ready(seen, condition, watched)
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
