"""Executes the arbiter's effects for the dispatcher: resolves waiting ``acquire`` calls, hands engine
work to ``EngineTasks``, keeps the single wake-up timer, and reports to the ``LifecycleObserver``.

Used only by ``flexinfer.runtime.dispatcher.Dispatcher`` (inside its task).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable
from dataclasses import dataclass

from flexinfer.api.key import ModelKey
from flexinfer.api.model import Model
from flexinfer.core.arbiter import events as ev
from flexinfer.core.arbiter.events import Effect, Event
from flexinfer.core.arbiter.machine import Arbiter
from flexinfer.runtime.engine_tasks import EngineTasks
from flexinfer.runtime.observer import ActivationRecord, LifecycleObserver, PhaseCause
from flexinfer.runtime.ports import Endpoint, Grant

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Waiter:
    """One pending ``acquire``: its future, the ``on_wait`` callback, the caller's context."""

    future: asyncio.Future[Grant]
    on_wait: Callable[[str], None] | None
    context: contextvars.Context
    since: float


class EffectRunner:
    """Turns effects into actions; never awaits (slow work goes to child tasks)."""

    def __init__(self, arbiter: Arbiter, tasks: EngineTasks, waiters: dict[int, Waiter], *,
                 observer: LifecycleObserver, post: Callable[[Event], None],
                 release: Callable[[int], None]) -> None:
        self._arbiter, self._tasks, self._waiters = arbiter, tasks, waiters
        self._observer, self._post, self._release = observer, post, release
        self._wake: asyncio.TimerHandle | None = None
        self._known: dict[ModelKey, Model] = {}

    def run(self, effect: Effect) -> None:
        try:
            self._run(effect)
        except Exception:
            log.exception("executing %r failed", effect)

    def _run(self, effect: Effect) -> None:
        match effect:
            case ev.GrantTicket():
                self._grant(effect)
            case ev.RejectTicket():
                waiter = self._waiters.pop(effect.ticket, None)
                if waiter is not None and not waiter.future.done():
                    waiter.future.set_exception(effect.error)
            case ev.StartModel():
                self._tasks.start(self._model(effect.model))
            case ev.StopModel():
                self._tasks.stop(self._model(effect.model))
            case _:
                self._observe(effect)

    def _grant(self, effect: ev.GrantTicket) -> None:
        waiter = self._waiters.pop(effect.ticket, None)
        if waiter is None or waiter.future.done():
            self._post(ev.RequestCancelled(effect.ticket))
            return
        waiter.future.set_result(self.grant(effect))

    def grant(self, effect: ev.GrantTicket) -> Grant:
        """The caller's ``Grant`` for a granted ticket; its ``release`` ends the ticket once, however often it
        is called."""
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._release(effect.ticket)

        endpoint = effect.endpoint if isinstance(effect.endpoint, Endpoint) else Endpoint(str(effect.endpoint))
        return Grant(effect.model, endpoint, release, effect.waited, effect.activation)

    def _observe(self, effect: Effect) -> None:
        obs = self._observer
        match effect:
            case ev.PhaseChanged():
                obs.phase_changed(self._model(effect.model), effect.old, effect.new,
                                  PhaseCause(effect.detail, effect.retry_in))
            case ev.ObserveColdStart():
                obs.cold_start(self._model(effect.model), effect.seconds)
            case ev.ObserveSwap():
                obs.swap(self._model(effect.model), effect.seconds)
            case ev.ObserveStage():
                obs.stage(self._model(effect.model), effect.stage, effect.seconds)
            case ev.Preempted():
                obs.preempted(self._model(effect.loser), self._model(effect.winner).name)
            case ev.ActivationDone():
                obs.activation(self._record(effect))
            case ev.ModelDeclared():
                obs.declared(effect.model)
            case ev.ModelForgotten():
                self._known.pop(effect.model.key, None)
                obs.forgotten(effect.model)

    def _record(self, done: ev.ActivationDone) -> ActivationRecord:
        contexts = tuple(w.context for t in done.tickets if (w := self._waiters.get(t)) is not None)
        loser = self._arbiter.slots.get(done.preempted) if done.preempted else None
        return ActivationRecord(
            model=self._model(done.model), kind=done.kind, start=done.started_at, end=done.ended_at,
            stages=done.stages, triggers=contexts, result=done.result,
            preempted=loser.model if loser is not None else None)

    def notify_waiting(self, ticket: int, arbiter: Arbiter) -> None:
        """Call ``on_wait`` for a request that did not get an immediate answer."""
        waiter = self._waiters.get(ticket)
        if waiter is None or waiter.future.done() or waiter.on_wait is None:
            return
        model = arbiter.tickets.get(ticket)
        reason = arbiter.waiting_reason(model.model) if model is not None else "cold_start"
        try:
            waiter.on_wait(reason)
        except Exception:
            log.exception("on_wait callback failed")

    def schedule_wake(self, at: float | None, clock: Callable[[], float], auto: bool) -> None:
        """Arm the one wake-up timer for ``at`` (replacing the previous one). A timer that fires before ``at``
        on ``clock`` (uvloop's ``call_later`` may fire up to ~1 ms early) arms itself again for the rest, so
        the ``Tick`` it posts always reads a time at or past ``at``."""
        self.cancel_wake()
        if at is None or not auto:
            return
        self._wake = asyncio.get_running_loop().call_later(max(at - clock(), 0.0), self._fire, at, clock)

    def _fire(self, at: float, clock: Callable[[], float]) -> None:
        """The wake-up timer (a method, not a closure: a closure that re-arms itself is a reference cycle, left
        for the cyclic collector at every swap)."""
        left = at - clock()
        if left > 0:
            self._wake = asyncio.get_running_loop().call_later(left, self._fire, at, clock)
            return
        self._wake = None
        self._post(ev.Tick(clock()))

    def cancel_wake(self) -> None:
        if self._wake is not None:
            self._wake.cancel()
            self._wake = None

    def _model(self, key: ModelKey) -> Model:
        """The model for a key; remembered so effects emitted just before a removal still resolve."""
        slot = self._arbiter.slots.get(key)
        if slot is not None:
            self._known[key] = slot.model
            return slot.model
        return self._known[key]
