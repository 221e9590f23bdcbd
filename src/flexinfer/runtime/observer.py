"""The ``LifecycleObserver`` port: how lifecycle facts reach metrics, traces and the activity log.

One port for both reporters: the dispatcher (``flexinfer.runtime.dispatcher``, local and in-cluster proxy)
calls one observer synchronously from its task, and the manager's lifecycle tracker
(``flexinfer.manager.lifecycle``) calls it on the transitions it reads from stored status.
``flexinfer.assembly`` passes ``LifecycleMetrics`` (``flexinfer.observability.metrics``), a tracing
adapter, the activity log, or several through ``ObserverGroup``. Subclass ``NullObserver`` to implement only
some methods. The dispatcher's times are readings of its clock (``time.monotonic()`` in production). ``declared`` comes
before any other call for a model (and again when its spec changes), ``forgotten`` after the last one.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from flexinfer.api.model import Model

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ActivationRecord:
    """One finished activation (``kind`` ``cold_start``/``swap``; ``result`` ``success``/``failure``).

    ``stages`` are ``(stage, start, end)``; ``triggers`` are the ``contextvars`` contexts captured when
    each request that triggered or joined the activation called ``acquire`` (the current OTel span lives
    there: ``ctx.run(opentelemetry.trace.get_current_span)``).
    """

    model: Model
    kind: str
    start: float
    end: float
    stages: tuple[tuple[str, float, float], ...]
    triggers: tuple[contextvars.Context, ...]
    result: str = "success"
    preempted: Model | None = None


@dataclass(frozen=True)
class PhaseCause:
    """Why a phase changed, for people: a stop's cause (``idle timeout``, ``unloaded``, ``shutdown``, ``preempted
    by ns/name``, …) or a failure's error, and a failure's backoff before the next start (seconds)."""

    detail: str = ""
    retry_in: float | None = None


NO_CAUSE = PhaseCause()


class LifecycleObserver(Protocol):
    """Receives lifecycle facts from the dispatcher. Must not block; exceptions are logged and ignored."""

    def phase_changed(self, model: Model, old: str | None, new: str, cause: PhaseCause = NO_CAUSE) -> None: ...

    def cold_start(self, model: Model, seconds: float) -> None: ...

    def swap(self, model: Model, seconds: float) -> None: ...

    def stage(self, model: Model, stage: str, seconds: float) -> None: ...

    def preempted(self, loser: Model, by: str) -> None:
        """``loser`` lost its group's GPU to ``by`` (the winner's name, or ``gpu-lease/<owner>``)."""

    def group_state(self, model: Model, state: str) -> None:
        """A shared-group member's state (``Active``, ``Preempted``, ``Queued``) as the manager stored it."""

    def activation(self, record: ActivationRecord) -> None: ...

    def declared(self, model: Model) -> None: ...

    def forgotten(self, model: Model) -> None: ...


class NullObserver:
    """A ``LifecycleObserver`` that ignores everything (base class for partial observers)."""

    def phase_changed(self, model: Model, old: str | None, new: str, cause: PhaseCause = NO_CAUSE) -> None:
        return None

    def cold_start(self, model: Model, seconds: float) -> None:
        return None

    def swap(self, model: Model, seconds: float) -> None:
        return None

    def stage(self, model: Model, stage: str, seconds: float) -> None:
        return None

    def preempted(self, loser: Model, by: str) -> None:
        return None

    def group_state(self, model: Model, state: str) -> None:
        return None

    def activation(self, record: ActivationRecord) -> None:
        return None

    def declared(self, model: Model) -> None:
        return None

    def forgotten(self, model: Model) -> None:
        return None


class ObserverGroup:
    """Fans every call out to several observers; one failing observer does not stop the others."""

    def __init__(self, observers: Sequence[LifecycleObserver]) -> None:
        self._observers = tuple(observers)

    def _each(self, method: str, *args: object) -> None:
        for observer in self._observers:
            try:
                getattr(observer, method)(*args)
            except Exception:
                log.exception("lifecycle observer %r failed in %s", observer, method)

    def phase_changed(self, model: Model, old: str | None, new: str, cause: PhaseCause = NO_CAUSE) -> None:
        self._each("phase_changed", model, old, new, cause)

    def cold_start(self, model: Model, seconds: float) -> None:
        self._each("cold_start", model, seconds)

    def swap(self, model: Model, seconds: float) -> None:
        self._each("swap", model, seconds)

    def stage(self, model: Model, stage: str, seconds: float) -> None:
        self._each("stage", model, stage, seconds)

    def preempted(self, loser: Model, by: str) -> None:
        self._each("preempted", loser, by)

    def group_state(self, model: Model, state: str) -> None:
        self._each("group_state", model, state)

    def activation(self, record: ActivationRecord) -> None:
        self._each("activation", record)

    def declared(self, model: Model) -> None:
        self._each("declared", model)

    def forgotten(self, model: Model) -> None:
        self._each("forgotten", model)
