"""A scripted driver for the pure arbiter: owns the time, simulates an engine, records every outcome.

Used by tests/unit/core/test_arbiter*.py and test_lifecycle_clock.py. ``advance`` delivers the arbiter's
wake-ups and the simulated engine's completions in time order, so deadlines fire exactly when scheduled.

With a ``timer`` (``Timer``), wake-ups come as a real event loop's timer gives them: early (uvloop's
``call_later`` fires up to ~1 ms early), late, or twice; a fired timer is gone (only a new ``ScheduleWake``
arms another), and ``advance`` adds no closing ``Tick`` of its own, so a wake-up the arbiter fails to re-arm
stays lost, as it would in ``flexinfer serve``.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from flexinfer.api.model import Model
from flexinfer.core.arbiter import events as ev
from flexinfer.core.arbiter.events import Effect, Event
from flexinfer.core.arbiter.machine import Arbiter
from flexinfer.core.arbiter.policy import ArbiterPolicy
from support.recording_engine import key


@dataclass
class Timer:
    """How wake-ups are delivered: each fires at its time plus an offset drawn from ``offsets`` (seconds;
    negative = early), and again at once with probability ``duplicate`` (``rng`` draws it)."""

    offsets: Callable[[], float]
    duplicate: float = 0.0
    rng: random.Random = field(default_factory=lambda: random.Random(0))


@dataclass
class Harness:
    models: Iterable[Model]
    policy: ArbiterPolicy | None = None
    now: float = 0.0
    start_delay: dict[str, float] | None = None
    """When set, the harness answers StartModel by itself after this delay (per model key)."""
    stop_delay: float | None = None
    log: list[tuple[float, Effect]] = field(default_factory=list)
    outcome: dict[int, tuple[str, float]] = field(default_factory=dict)
    arrived: dict[int, float] = field(default_factory=dict)
    cancelled: set[int] = field(default_factory=set)
    finished: set[int] = field(default_factory=set)
    failing: dict[str, int] = field(default_factory=dict)
    timer: Timer | None = None
    _queue: list[tuple[float, int, Event]] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        self.models = list(self.models)
        self.arbiter = Arbiter(self.models, self.policy)
        self.wake: float | None = None
        self._fired: tuple[float, float] | None = None
        """The armed wake-up's time and when its timer fires (drawn once per arming)."""
        self.send(ev.Tick(self.now))

    def send(self, event: Event) -> list[Effect]:
        effects = self.arbiter.handle(event, self.now)
        for effect in effects:
            self._record(effect)
        return effects

    def _record(self, effect: Effect) -> None:
        self.log.append((self.now, effect))
        match effect:
            case ev.GrantTicket() | ev.RejectTicket():
                assert effect.ticket not in self.outcome, f"ticket {effect.ticket} answered twice"
                kind = "granted" if isinstance(effect, ev.GrantTicket) else effect.error.code
                self.outcome[effect.ticket] = (kind, self.now)
            case ev.ScheduleWake():
                self.wake = effect.at
            case ev.StartModel() if self.start_delay is not None:
                failing = self.failing.get(effect.model, 0) > 0
                if failing:
                    self.failing[effect.model] -= 1
                reply: Event = (ev.ModelStartFailed(effect.model, "boom") if failing
                                else ev.ModelReady(effect.model, f"ep:{effect.model}"))
                self._later(self.start_delay.get(effect.model, 1.0), reply)
            case ev.StopModel() if self.stop_delay is not None:
                self._later(self.stop_delay, ev.ModelStopped(effect.model))
            case _:
                pass

    def _later(self, delay: float, event: Event) -> None:
        heapq.heappush(self._queue, (self.now + delay, next(self._ids), event))

    def request(self, model: str, deadline: float | None = None) -> int:
        """A request for ``model`` (a key, or shorthand for ``default/<model>``: the arbiter only takes keys)."""
        ticket = next(self._ids)
        self.arrived[ticket] = self.now
        self.send(ev.RequestArrived(ticket, key(model), deadline))
        return ticket

    def finish(self, ticket: int) -> None:
        self.finished.add(ticket)
        self.send(ev.RequestFinished(ticket))

    def cancel(self, ticket: int) -> None:
        self.cancelled.add(ticket)
        self.send(ev.RequestCancelled(ticket))

    def advance(self, seconds: float) -> None:
        """Move time forward, delivering wake-ups and engine replies at their times (wake-ups as ``timer``
        says, when set; without one, exactly, and a closing ``Tick`` at the target time)."""
        target = self.now + seconds
        while True:
            fire = self._fire_time()
            due = [t for t in (fire, self._queue[0][0] if self._queue else None) if t is not None]
            nxt = min(due, default=None)
            if nxt is None or nxt > target:
                break
            self.now = max(self.now, nxt)
            if self._queue and self._queue[0][0] <= self.now:
                self.send(heapq.heappop(self._queue)[2])
            else:
                self._fired = None
                self.wake = None
                self.send(ev.Tick(self.now))
                if self.timer is not None and self.timer.rng.random() < self.timer.duplicate:
                    self.send(ev.Tick(self.now))
        self.now = target
        if self.timer is None:
            self.send(ev.Tick(self.now))

    def _fire_time(self) -> float | None:
        """When the armed wake-up timer fires: at its time, or (with a ``timer``) off by one drawn offset,
        never before the present."""
        if self.wake is None:
            return None
        if self.timer is None:
            return self.wake
        if self._fired is None or self._fired[0] != self.wake:
            fire = self.wake + self.timer.offsets()
            # an early timer armed for a moment from now may fire at once; then it is on time (time moves on)
            self._fired = (self.wake, fire if fire > self.now else max(self.wake, self.now))
        return self._fired[1]

    def effects(self, kind: type) -> list[Effect]:
        return [e for _, e in self.log if isinstance(e, kind)]

    def in_flight(self) -> set[int]:
        granted = {t for t, (k, _) in self.outcome.items() if k == "granted"}
        return granted - self.finished - self.cancelled

    def play(self, op: str, arg: object) -> bool:
        """One step of a property test's script that every script knows: ``request`` a model; ``finish`` or
        ``cancel`` the open ticket chosen by ``arg`` (finish only one in flight); ``advance`` time. ``False``
        for any other step (the caller's own)."""
        if op == "request":
            self.request(str(arg))
        elif op in ("finish", "cancel"):
            tickets = sorted(set(self.arrived) - self.finished - self.cancelled)
            if tickets:
                ticket = tickets[int(arg) % len(tickets)]  # type: ignore[call-overload]
                if op == "cancel" or ticket in self.in_flight():
                    (self.cancel if op == "cancel" else self.finish)(ticket)
        elif op == "advance":
            self.advance(float(arg))  # type: ignore[arg-type]
        else:
            return False
        return True


def comparable_effects(effects: list[Effect]) -> list[object]:
    """The effects but wake-ups, rejections by their error's type, text and fields (errors compare by identity):
    what two arbiters fed the same events must agree on."""
    return [(e.ticket, e.model, type(e.error), str(e.error), vars(e.error)) if isinstance(e, ev.RejectTicket) else e
            for e in effects if not isinstance(e, ev.ScheduleWake)]


def arbiter_state(arbiter: Arbiter) -> tuple[Any, ...]:
    """Everything an arbiter holds, as comparable values (slots with their queues, tickets, who is next, memory
    evictions, shutting down)."""
    slots = {k: dict(vars(s), queue=dict(s.queue), in_flight=set(s.in_flight)) for k, s in arbiter.slots.items()}
    return (slots, dict(arbiter.tickets), dict(arbiter.next_up), dict(arbiter.memory.evictions),
            arbiter.shutting_down)


def express_effects(arbiter: Arbiter, event: Event, now: float) -> tuple[list[Effect], bool]:
    """``event`` applied to ``arbiter`` as the dispatcher does: a request's arrival or end answered by the express
    lane (``admit``/``finish``) when it is open, else a full ``handle``; second, whether the express lane took it."""
    fast: list[Effect] | None = None
    if isinstance(event, ev.RequestArrived):
        grant = arbiter.admit(event.ticket, event.model, now)
        fast = None if grant is None else [grant]
    elif isinstance(event, ev.RequestFinished):
        fast = arbiter.finish(event.ticket, now)
    return (arbiter.handle(event, now), False) if fast is None else (fast, True)
