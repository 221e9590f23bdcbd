"""Lifecycle log lines of the dispatcher (``flexinfer serve``, and the in-cluster proxy's dispatcher): one
INFO line per event, with its durations, on the ``flexinfer.lifecycle`` logger.

Events: activation requested (→ Pending/Loading), swap decided (who preempts whom in which group, and the
priorities that decided it), ready (cold start or swap, total and stage breakdown), stopped (idle timeout or
unload, shutdown, removal, preemption, eviction from a group that packs by memory with what it made room for
and the memory figures … with the time it was Ready), failed (a crash or a failed start: the
error and the backoff before the next start, at WARNING). Causes, errors and backoffs come with the phase change
(``PhaseCause``). Every line also passes its fields as ``extra`` (``event``, ``model``, ``seconds``, ``stages``,
``reason`` …) so JSON lines are machine-readable. ``flexinfer.assembly`` adds this to the observers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from flexinfer.api.key import ModelKey
from flexinfer.api.model import Model
from flexinfer.runtime.observer import NO_CAUSE, ActivationRecord, NullObserver, PhaseCause

log = logging.getLogger("flexinfer.lifecycle")
ACTIVE = frozenset({"Pending", "Loading", "Ready"})


class LifecycleLog(NullObserver):
    """A ``LifecycleObserver`` that writes the lifecycle lines."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._ready_at: dict[ModelKey, float] = {}
        self._preempted_by: dict[ModelKey, str] = {}

    def phase_changed(self, model: Model, old: str | None, new: str, cause: PhaseCause = NO_CAUSE) -> None:
        key = model.key
        if new in ("Pending", "Loading") and old not in ACTIVE:
            where = f" (waiting for GPU group {model.group})" if new == "Pending" and model.group else ""
            _info("activation_requested", key, f"model {key}: activation requested{where}")
        elif new == "Ready":
            self._ready_at[key] = self._clock()
        elif old == "Ready" and new in ("Idle", "Preempted"):
            self._stopped(key, new, cause.detail)
        elif new == "Failed":
            self._failed(key, old, cause)

    def preempted(self, loser: Model, by: str) -> None:
        """``by`` names the winner in the loser's namespace (a shared group never spans namespaces), or is a
        GPULease holder (``gpu-lease/<owner>``), logged as it is."""
        winner = by if "/" in by else ModelKey(loser.namespace, by)
        self._preempted_by[loser.key] = winner
        _info("swap_decided", winner,
              f"swap decided: {winner} preempts {loser.key} (priority {loser.priority}) on GPU group {loser.group}; "
              f"{loser.key} drains, then stops", loser=loser.key, group=loser.group)

    def activation(self, record: ActivationRecord) -> None:
        key = record.model.key
        stages = {stage: round(end - start, 3) for stage, start, end in record.stages}
        breakdown = ", ".join(f"{stage} {seconds:.3f}s" for stage, seconds in stages.items()) or "no stages"
        seconds = record.end - record.start
        kind = "swap" if record.kind == "swap" else "cold start"
        if record.result == "success":
            _info("ready", key, f"model {key}: ready after {seconds:.3f}s ({kind}: {breakdown})",
                  seconds=round(seconds, 3), kind=record.kind, stages=stages)
        else:
            _info("activation_failed", key, f"model {key}: {kind} failed after {seconds:.3f}s ({breakdown})",
                  seconds=round(seconds, 3), kind=record.kind, stages=stages)

    def _stopped(self, key: ModelKey, new: str, detail: str) -> None:
        started = self._ready_at.pop(key, None)
        held = None if started is None else round(self._clock() - started, 3)
        shown = "" if held is None else f" after {held:.3f}s ready"
        winner = self._preempted_by.pop(key, None)
        why = f"preempted by {winner}" if new == "Preempted" and winner else detail or "stopped"
        if detail.startswith("evicted"):  # a group that packs by memory: what it was evicted for, and why
            why = detail
        _info("stopped", key, f"model {key}: server stopped{shown} ({why})", seconds=held, reason=why)

    def _failed(self, key: ModelKey, old: str | None, cause: PhaseCause) -> None:
        self._ready_at.pop(key, None)
        error = cause.detail.strip()
        first = error.splitlines()[0] if error else "unknown error"
        backoff = cause.retry_in
        what = "crashed" if old == "Ready" else "failed to start"
        retry = "" if backoff is None else f"; next start allowed in {backoff:.1f}s (backoff)"
        log.warning("model %s: server %s: %s%s", key, what, first, retry,
                    extra={"event": "crash" if old == "Ready" else "start_failed", "model": key,
                           "error": first, "backoff_s": None if backoff is None else round(backoff, 3)})


def _info(event: str, key: str, message: str, **fields: object) -> None:
    log.info("%s", message, extra={"event": event, "model": key, **fields})
