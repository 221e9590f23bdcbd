"""Lifecycle metrics of the Kubernetes engine, observed on status transitions.

``LifecycleTracker.declared`` is called by the reconciler for every valid Model of the unit it reconciles:
the sink creates the model's series at zero, so ``increase()`` counts its first event (``forget`` removes
them when the Model is deleted). ``LifecycleTracker.observe`` is called after each member's status is written
(a member preempted in a pass is only ``preempted`` there, and observed in the follow-up pass):
the phase gauge/transition counter when the phase changes (or on first sight after a start-up), the
shared-group state gauge, the startup-stage marks of an open activation (from the loading substage),
and — when a model with an open ``status.activation`` turns Ready — the cold-start and swap samples
(activation decision → Ready; never idle time) and one sample per stage (its total time: ``Compiling``
counts to ``server_start`` like the pod's start before the weights load).
The same transitions are logged at INFO on ``flexinfer.lifecycle`` (activation requested, ready with the stage
breakdown, scaled to zero, failed with its message); preemption decisions are logged by the reconciler.

- A swap's ``drain`` ends, and its ``server_start`` begins, when the reconciler scales the preempted
  incumbent to zero (``PassFacts.stopped_at``, seen in the same or a later pass: losers are reconciled first).
- Ready is when the manager's watch delivered the event that showed the pod's ``Ready`` condition turn True
  (``PassFacts.ready_seen_at``), when it saw that live; otherwise when the condition says
  (``PassFacts.ready_condition_at``; the rule: ``flexinfer.core.lifecycle_clock.observed_ready``), not when the
  manager noticed: a manager that was down when the model turned Ready does not add its downtime.
- A Ready model that stops being Ready with its replicas kept (a crash, a replaced pod) gets a restart
  activation in status (``flexinfer.core.model_status.plan.restarting``), observed like any cold start.
- The clock of an activation is rebuilt from status after a restart
  (``flexinfer.core.model_status.plan.activation_clock``), so the totals survive restarts; a stage that
  was under way (or a drain that ended) while the manager was down yields no sample instead of a wrong one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from flexinfer.api.model import Model, ModelStatus
from flexinfer.core.lifecycle_clock import Activation, stage_totals
from flexinfer.core.model_status.plan import STAGE_OF_SUBSTAGE, activation_clock
from flexinfer.core.phases import READY
from flexinfer.runtime.observer import LifecycleObserver

log = logging.getLogger("flexinfer.lifecycle")


@dataclass(frozen=True)
class PassFacts:
    """What one reconcile pass knows about a member besides its status (the reconciler fills it in)."""

    stopped_at: datetime | None = None
    """When its Deployment, which had replicas, was scaled to zero in this pass (for a preempted incumbent:
    the end of the drain)."""
    ready_condition_at: datetime | None = None
    """``lastTransitionTime`` of its newest pod's ``Ready`` (else its Deployment's ``Available``) condition."""
    ready_seen_at: datetime | None = None
    """When the manager's watch delivered the event that showed that condition turn True (``None``: not seen
    live — the manager started, or re-listed, after the transition)."""


class LifecycleTracker:
    """See the module docstring."""

    def __init__(self, sink: LifecycleObserver) -> None:
        self._sink = sink
        self._seen: dict[str, str | None] = {}
        self._clocks: dict[str, Activation] = {}
        self._stopped_at: dict[str, float] = {}

    def declared(self, model: Model) -> None:
        """The reconciler knows ``model`` (its per-model series exist from now on, at zero)."""
        self._sink.declared(model)

    def preempted(self, model: Model, to: str) -> None:
        self._sink.preempted(model, to)

    def observe(self, before: Model, after: ModelStatus, now: datetime, facts: PassFacts | None = None) -> None:
        """Record what changed between ``before.status`` and ``after``."""
        facts = facts or PassFacts()
        old, new = before.status.phase, after.phase
        key = before.key
        if new is not None and (key not in self._seen or self._seen[key] != new or old != new):
            self._sink.phase_changed(before, old if old != new else None, new)
            if old != new:
                _log_phase(before, old, after)
            self._seen[key] = new
        if before.group and after.shared_group is not None and after.shared_group.state:
            self._sink.group_state(before, after.shared_group.state)
        if facts.stopped_at is not None:
            self._stopped_at[key] = facts.stopped_at.timestamp()
        self._activation(before, after, now, facts)

    def _activation(self, before: Model, after: ModelStatus, now: datetime, facts: PassFacts) -> None:
        key, at = before.key, now.timestamp()
        if after.activation is not None:
            clock = self._clocks.get(key)
            if clock is None or clock.decided_at != _ts(after.activation.decided_at):
                clock = self._open(before, after, at)
                if clock is None:
                    return
            self._drained(before, clock)
            if after.phase == "Loading" and after.loading_substage in STAGE_OF_SUBSTAGE:
                clock.mark(STAGE_OF_SUBSTAGE[after.loading_substage], at)
            return
        clock = self._clocks.pop(key, None)
        if clock is None:
            clock = activation_clock(before)
            if clock is not None:
                clock.gap_stage = "server_start"
                clock.resume(at, None)
        if clock is None or after.phase != READY or before.status.activation is None:
            return
        self._drained(before, clock)
        done = clock.finish(clock.ready_time(at, _ts(facts.ready_condition_at), _ts(facts.ready_seen_at)))
        _log_ready(before, done.cold_start if done.cold_start is not None else done.swap,
                   "swap" if done.swap is not None else "cold_start", stage_totals(done.stages))
        if done.cold_start is not None:
            self._sink.cold_start(before, done.cold_start)
        if done.swap is not None:
            self._sink.swap(before, done.swap)
        for stage, seconds in stage_totals(done.stages).items():
            self._sink.stage(before, stage, seconds)

    def _open(self, before: Model, after: ModelStatus, at: float) -> Activation | None:
        """The clock of the activation in ``after``: opened in this pass, or rebuilt (a restart, a new
        leader) from status — then the stages already under way were not witnessed (``resume``)."""
        clock = activation_clock(before.model_copy(update={"status": after}))
        if clock is None:
            return None
        clock.gap_stage = "server_start"  # a substage is seen at the next reconcile, not when it begins
        if clock.kind == "cold_start":
            clock.start(clock.decided_at)  # the manager scales a cold start up in the pass that decides it
        previous = before.status.activation
        if previous is not None and _ts(previous.decided_at) == clock.decided_at:
            substage = after.loading_substage if after.phase == "Loading" else None
            clock.resume(at, STAGE_OF_SUBSTAGE.get(substage or ""))
        self._clocks[before.key] = clock
        return clock

    def _drained(self, before: Model, clock: Activation) -> None:
        """A swap starts when the manager scaled the preempted incumbent to zero (the drain ended)."""
        if clock.kind != "swap" or clock.started_at is not None or clock.preempted is None:
            return
        stopped = self._stopped_at.get(f"{before.namespace}/{clock.preempted}")
        if stopped is not None and stopped >= clock.decided_at:
            clock.start(stopped)

    def failed(self, namespace: str, name: str) -> None:
        self._clocks.pop(f"{namespace}/{name}", None)

    def forget(self, model: Model | None, namespace: str, name: str) -> None:
        key = f"{namespace}/{name}"
        self._clocks.pop(key, None)
        self._seen.pop(key, None)
        self._stopped_at.pop(key, None)
        if model is not None:
            self._sink.forgotten(model)


def _ts(moment: datetime | None) -> float | None:
    return moment.timestamp() if moment is not None else None


def _log_phase(model: Model, old: str | None, after: ModelStatus) -> None:
    """One line for the transitions an operator acts on (others are visible in ``kubectl get models``)."""
    new, key = after.phase, model.key
    if new in ("Pending", "Loading") and old not in ("Pending", "Loading", "Ready"):
        log.info("model %s: activation requested (%s)", key, new, extra={"event": "activation_requested",
                                                                          "model": key})
    elif old == "Ready" and new in ("Pending", "Loading"):
        log.info("model %s: not ready any more (%s) with its replicas kept: its server restarts",
                 key, after.message or new, extra={"event": "crash", "model": key})
    elif old == "Ready" and new in ("Idle", "Preempted"):
        log.info("model %s: scaled to zero (%s)", key, new, extra={"event": "stopped", "model": key,
                                                                    "reason": new})
    elif new == "Failed":
        log.warning("model %s: failed: %s", key, after.message or "no message",
                    extra={"event": "failed", "model": key, "error": after.message})


def _log_ready(model: Model, seconds: float | None, kind: str, stages: dict[str, float]) -> None:
    breakdown = ", ".join(f"{stage} {value:.3f}s" for stage, value in stages.items()) or "no stages"
    shown = "" if seconds is None else f" after {seconds:.3f}s"
    log.info("model %s: ready%s (%s: %s)", model.key, shown, kind.replace("_", " "), breakdown,
             extra={"event": "ready", "model": model.key, "kind": kind,
                    "seconds": None if seconds is None else round(seconds, 3),
                    "stages": {stage: round(value, 3) for stage, value in stages.items()}})
