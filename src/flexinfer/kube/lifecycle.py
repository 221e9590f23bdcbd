"""Lifecycle metrics of the Kubernetes engine, observed on status transitions.

``LifecycleTracker.declared`` is called by the reconciler for every valid Model of the unit it reconciles:
the sink creates the model's series at zero, so ``increase()`` counts its first event (``forget`` removes
them when the Model is deleted). ``LifecycleTracker.observe`` is called after each member's status is decided:
the phase gauge/transition counter when the phase changes (or on first sight after a start-up), the
shared-group state gauge, the startup-stage marks of an open activation (from the loading substage),
and — when a model with an open ``status.activation`` turns Ready — the cold-start and swap samples
(activation decision → Ready; never idle time). The clock of an activation is rebuilt from status after
a restart (``flexinfer.core.model_status_plan.activation_clock``), so the samples survive restarts;
only stage marks taken before the restart are lost.
"""

from __future__ import annotations

from datetime import datetime

from flexinfer.api.model import Model, ModelStatus
from flexinfer.core.lifecycle_clock import Activation
from flexinfer.core.model_status_plan import STAGE_OF_SUBSTAGE, activation_clock
from flexinfer.kube.ports import LifecycleSink


class LifecycleTracker:
    """See the module docstring."""

    def __init__(self, sink: LifecycleSink) -> None:
        self._sink = sink
        self._seen: dict[str, str | None] = {}
        self._clocks: dict[str, Activation] = {}

    def declared(self, model: Model) -> None:
        """The reconciler knows ``model`` (its per-model series exist from now on, at zero)."""
        self._sink.declared(model)

    def preempted(self, model: Model, to: str) -> None:
        self._sink.preemption(model, to)

    def observe(self, before: Model, after: ModelStatus, now: datetime) -> None:
        """Record what changed between ``before.status`` and ``after``."""
        old, new = before.status.phase, after.phase
        key = before.key
        if new is not None and (key not in self._seen or self._seen[key] != new or old != new):
            self._sink.phase_changed(before, old if old != new else None, new)
            self._seen[key] = new
        if before.group and after.shared_group is not None and after.shared_group.state:
            self._sink.group_state(before, after.shared_group.state)
        self._activation(before, after, now)

    def _activation(self, before: Model, after: ModelStatus, now: datetime) -> None:
        key = before.key
        if after.activation is not None:
            clock = self._clocks.get(key)
            if clock is None or clock.decided_at != _ts(after.activation.decided_at):
                clock = activation_clock(before.model_copy(update={"status": after}))
                if clock is None:
                    return
                if clock.kind == "cold_start":
                    clock.start(now.timestamp())
                self._clocks[key] = clock
            if after.phase == "Loading" and after.loading_substage in STAGE_OF_SUBSTAGE:
                clock.mark(STAGE_OF_SUBSTAGE[after.loading_substage], now.timestamp())
            return
        clock = self._clocks.pop(key, None) or activation_clock(before)
        if clock is None or after.phase != "Ready" or before.status.activation is None:
            return
        done = clock.finish(now.timestamp())
        if done.cold_start is not None:
            self._sink.cold_start(before, done.cold_start)
        if done.swap is not None:
            self._sink.swap(before, done.swap)
        for span in done.stages:
            self._sink.stage(before, span.stage, span.seconds)

    def failed(self, namespace: str, name: str) -> None:
        self._clocks.pop(f"{namespace}/{name}", None)

    def forget(self, model: Model | None, namespace: str, name: str) -> None:
        key = f"{namespace}/{name}"
        self._clocks.pop(key, None)
        self._seen.pop(key, None)
        if model is not None:
            self._sink.forgotten(model)


def _ts(moment: datetime | None) -> float | None:
    return moment.timestamp() if moment is not None else None
