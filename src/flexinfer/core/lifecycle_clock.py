"""The lifecycle clock: turns the moments of one activation into latency observations.

An ``Activation`` starts at the activation decision (the arbiter or election chose to start the model;
for a swap, the moment the incumbent lost the GPU to it) and ends when the model is Ready (or the start
fails). From its marks it yields:

- cold start = decision → Ready (every activation);
- swap = swap decision → Ready (only when an incumbent was preempted for this model);
- per-stage durations for the bounded stage labels of ``STAGE_NAMES``: ``queue`` (first waiting demand →
  decision, only when the model had to wait for its group), ``drain`` (swap decision → the engine is
  asked to start this model, i.e. the incumbent drained and stopped), and the engine-reported
  ``staging``/``server_start``/``health`` (each until the next stage or Ready; an engine that reports
  nothing gets one ``server_start`` span).

Idle time is never included: the clock starts at the decision, not at the last Ready→NotReady flip (the
Go implementation measures from there, spec §3.7). Used by ``flexinfer.core.arbiter``; the Kubernetes
engine builds the same object from its reconcile decisions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

ActivationKind = Literal["cold_start", "swap"]
STAGE_NAMES: Final[tuple[str, ...]] = ("queue", "drain", "staging", "server_start", "health")
ENGINE_STAGES: Final[frozenset[str]] = frozenset({"staging", "server_start", "health"})


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
    tickets: list[int] = field(default_factory=list)
    _marks: list[tuple[str, float]] = field(default_factory=list)

    started_at: float | None = None
    """When the engine was asked to start the model (the drain, if any, ends here)."""

    def start(self, now: float) -> None:
        self.started_at = now

    def mark(self, stage: str, now: float) -> None:
        """An engine stage begins at ``now`` and ends the open one. Unknown names are ignored (labels stay
        bounded); a repeat of the open stage continues it."""
        if stage not in ENGINE_STAGES or (self._marks and self._marks[-1][0] == stage):
            return
        self._marks.append((stage, now))

    def spans(self, end: float) -> tuple[StageSpan, ...]:
        """The stage spans so far, the open one ending at ``end``. Time between the start request and the
        first engine stage counts to that stage; with no engine stages it is ``server_start``."""
        out: list[StageSpan] = []
        if self.demand_since is not None and self.demand_since < self.decided_at:
            out.append(StageSpan("queue", self.demand_since, self.decided_at))
        marks = list(self._marks)
        if self.started_at is not None:
            marks = [(marks[0][0], self.started_at), *marks[1:]] if marks else [("server_start", self.started_at)]
        if self.kind == "swap":
            out.append(StageSpan("drain", self.decided_at, marks[0][1] if marks else end))
        ends = [t for _, t in marks[1:]] + ([end] if marks else [])
        out.extend(StageSpan(s, start, stop) for (s, start), stop in zip(marks, ends, strict=True))
        return tuple(out)

    def finish(self, ready_at: float) -> Observations:
        """Observations for an activation that reached Ready at ``ready_at``."""
        took = max(ready_at - self.decided_at, 0.0)
        return Observations(cold_start=took, swap=took if self.kind == "swap" else None,
                            stages=self.spans(ready_at))

    def fail(self, failed_at: float) -> Observations:
        """A failed start yields stage spans only (no latency sample)."""
        return Observations(cold_start=None, swap=None, stages=self.spans(failed_at))
