"""The swap arbiter: one process's single source of truth about which models run and who may send
requests to them. Events in, effects out (``flexinfer.core.arbiter.events``); no clock, no I/O.

Called only by the dispatcher (``flexinfer.runtime.dispatcher``), which owns one ``Arbiter`` in one task,
and by tests. Rules (docs/design/swapping.md): per-model tickets; a request for a model that is not Ready
joins the activation in progress; one running model per shared group (as many as fit where the group has a
memory budget: ``packing``); a swap drains the incumbent (bounded by ``drain_timeout``) before the winner
starts; priority decides, bounded by ``max_wait``; ``min_hold`` after Ready against thrash; every ticket ends
exactly once.

``admit`` and ``finish`` are the express lane: a request for a model that is Ready and holds its group with
nobody waiting for that group is granted (and ended) in O(1), with the outcome ``handle`` would give; anything
else (a model loading, draining or preempted, a contender waiting, a deadline due) goes through ``handle``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from flexinfer.api.key import ModelKey
from flexinfer.api.model import Model
from flexinfer.core.arbiter import events as ev
from flexinfer.core.arbiter.events import Effect, Event
from flexinfer.core.arbiter.memory import MemoryLedger
from flexinfer.core.arbiter.packing import next_step, out_of_memory_step
from flexinfer.core.arbiter.policy import ArbiterPolicy
from flexinfer.core.arbiter.state import (
    Slot,
    Ticket,
    activation_failure_effect,
    activation_success_effects,
    backoff_error,
    capacity,
    challenger,
    express_keys,
    failed_error,
    first_choice,
    group_members,
    stale_restart,
    wait_timeout_error,
    waiting_reason,
)
from flexinfer.core.arbiter.timing import deadlines
from flexinfer.core.errors import (
    ModelNotFoundError,
    QueueFullError,
    RequestError,
    ShuttingDownError,
)
from flexinfer.core.lifecycle_clock import Activation
from flexinfer.core.phases import FAILED, IDLE, LOADING, PENDING, PREEMPTED, READY, check_transition


class Arbiter:
    """Owns slots (one per declared model) and tickets; ``handle`` is the only mutator."""

    def __init__(self, models: Iterable[Model] = (), policy: ArbiterPolicy | None = None) -> None:
        self.policy = policy or ArbiterPolicy()
        self.slots: dict[ModelKey, Slot] = {}
        self.tickets: dict[int, Ticket] = {}
        self.next_up: dict[str, ModelKey] = {}
        self.shutting_down = False
        self._shutdown_done = False
        self._wake: float | None = None
        self._fx: list[Effect] = []
        self._express: frozenset[ModelKey] = frozenset()
        """Models whose requests may take the express lane until the next ``handle`` (``express_keys``)."""
        self.memory = MemoryLedger(self.policy)
        for model in models:
            self.slots[model.key] = Slot(model, capacity=capacity(model, self.policy))
        # Models declared before the first event: ``handle`` reports them (``ModelDeclared``) first.
        self._announce = [slot.model for slot in self.slots.values()]

    # ------------------------------------------------------------ entry point

    def handle(self, event: Event, now: float) -> list[Effect]:
        """Apply one event at time ``now``; return the effects to execute, in order."""
        self._fx = [ev.ModelDeclared(model) for model in self._announce]
        self._announce = []
        if isinstance(event, ev.Tick):
            # The timer behind the pending wake-up has fired (maybe early: uvloop's call_later can fire up to
            # ~1 ms before its time): forget it, so ``_schedule`` asks for the next one again even when it is
            # the same time. A wake-up that finds nothing due re-arms instead of being lost.
            self._wake = None
        self._apply(event, now)
        self._expire(now)
        self._fill(now)
        self._arbitrate(now)
        self._finish_shutdown()
        self._schedule(now)
        self._express = frozenset() if self.shutting_down else express_keys(self.slots.values())
        fx, self._fx = self._fx, []
        return fx

    # ------------------------------------------------------------ express lane

    def admit(self, ticket: int, key: ModelKey, now: float) -> ev.GrantTicket | None:
        """``RequestArrived(ticket, key)`` in O(1) when that is what ``handle`` would do: the model is in the
        express set and no deadline is due. Returns the grant (the only effect ``handle`` would give besides a
        later wake-up), or ``None``: send the event to ``handle``."""
        if key not in self._express or (self._wake is not None and now >= self._wake):
            return None
        slot = self.slots[key]
        if not slot.has_room:
            return None
        slot.last_active, slot.held_off = now, False
        self.tickets[ticket] = Ticket(ticket, key, now, now, granted=True)
        slot.in_flight.add(ticket)
        return ev.GrantTicket(ticket, key, slot.endpoint, 0.0)

    def finish(self, ticket_id: int, now: float) -> list[Effect] | None:
        """``RequestFinished(ticket_id)`` in O(1) for a ticket granted on an express model, when no deadline is
        due and the model's idle timeout cannot fire at ``now``; returns the effects (at most a wake-up for the
        idle timeout), or ``None``: send the event to ``handle``.

        The pending wake-up is never later than ``handle`` would schedule it; it may be earlier (``admit``
        removes an idle deadline without moving the wake-up), and that wake-up is then a no-op ``Tick``."""
        ticket = self.tickets.get(ticket_id)
        if ticket is None or ticket.model not in self._express or (self._wake is not None and now >= self._wake):
            return None
        slot = self.slots[ticket.model]
        if ticket_id not in slot.in_flight:
            return None
        idle_end = slot.idle_deadline_after_last(now, self.policy) if len(slot.in_flight) == 1 else None
        if idle_end is not None and idle_end <= now:
            return None
        del self.tickets[ticket_id]
        slot.in_flight.discard(ticket_id)
        slot.last_active = now
        if idle_end is None or (self._wake is not None and self._wake <= idle_end):
            return []
        self._wake = idle_end
        return [ev.ScheduleWake(idle_end)]

    def waiting_reason(self, key: ModelKey) -> str:
        """``swap`` when a waiting model needs another model off its GPU first, else ``cold_start``."""
        return waiting_reason(self.slots, key)

    def next_wake(self) -> float | None:
        """The pending wake-up time (the last ``ScheduleWake``)."""
        return self._wake

    def _apply(self, event: Event, now: float) -> None:
        match event:
            case ev.RequestArrived():
                self._arrive(event, now)
            case ev.RequestCancelled() | ev.RequestFinished():
                self._end_ticket(event.ticket, now)
            case ev.ModelReady():
                self._ready(event.model, event.endpoint, now)
            case ev.ModelStartFailed():
                self._start_failed(event.model, event.error, now)
            case ev.ModelStopped():
                self._stopped(event.model)
            case ev.ModelCrashed():
                self._crashed(event.model, event.error, now)
            case ev.StageReached():
                self._stage(event.model, event.stage, now)
            case ev.Preload():
                self._preload(event.model, now)
            case ev.Unload():
                self._unload(event.model, now)
            case ev.Shutdown():
                self._shutdown(now, event.drain_timeout)
            case ev.ModelsReplaced():
                self._replace(event.models, now)
            case ev.MemoryNeedReported():
                self.memory.learn(event, self._declared(event.model))
            case ev.Tick():
                pass

    # ------------------------------------------------------------ tickets

    def _arrive(self, event: ev.RequestArrived, now: float) -> None:
        key = event.model
        if self.shutting_down:
            return self._reject_new(event, ShuttingDownError("FlexInfer is shutting down"))
        slot = self._declared(key)
        if slot is None:
            return self._reject_new(event, ModelNotFoundError(key))
        slot.last_active, slot.held_off = now, False
        if slot.backing_off(now):
            return self._reject_new(event, backoff_error(slot, now))
        if slot.has_room:
            self.tickets[event.ticket] = Ticket(event.ticket, key, now, now, granted=True)
            slot.in_flight.add(event.ticket)
            return self._emit(ev.GrantTicket(event.ticket, key, slot.endpoint, 0.0))
        if len(slot.queue) >= self.policy.queue_limit:
            return self._reject_new(event, QueueFullError(f"queue for model '{slot.model.name}' is full"))
        budget = now + slot.cold_start_budget(self.policy)
        deadline = budget if event.deadline is None else min(budget, event.deadline)
        ticket = Ticket(event.ticket, key, now, deadline)
        self.tickets[event.ticket] = slot.queue[event.ticket] = ticket
        if slot.phase in (IDLE, PREEMPTED, FAILED) and not slot.running:
            self._phase(slot, PENDING, "WaitingForActivation")
        return None

    def _reject_new(self, event: ev.RequestArrived, error: RequestError) -> None:
        self._emit(ev.RejectTicket(event.ticket, event.model, error))

    def _end_ticket(self, ticket_id: int, now: float) -> None:
        ticket = self.tickets.pop(ticket_id, None)
        if ticket is None:
            return
        slot = self.slots.get(ticket.model)
        if slot is None:
            return
        slot.queue.pop(ticket_id, None)
        if ticket_id in slot.in_flight:
            slot.in_flight.discard(ticket_id)
            slot.last_active = now
        if slot.drain_until is not None and not slot.in_flight and not slot.stopping:
            self._stop(slot, forced=False)
        if slot.removed and not slot.running and not slot.in_flight:
            self._forget(slot)

    def _fill(self, now: float) -> None:
        """Grant waiting tickets of Ready models that have room again (a request ended, the cap changed)."""
        for slot in self.slots.values():
            if slot.queue and slot.servable:
                self._grant_queued(slot, now, None)

    def _grant_queued(self, slot: Slot, now: float, kind: str | None) -> None:
        """Grant ``slot``'s waiting tickets in arrival order, as many as its capacity has room for."""
        room = slot.capacity - len(slot.in_flight) if slot.capacity else len(slot.queue)
        for ticket in list(itertools.islice(slot.queue.values(), max(room, 0))):
            slot.queue.pop(ticket.id)
            ticket.granted = True
            slot.in_flight.add(ticket.id)
            self._emit(ev.GrantTicket(ticket.id, slot.key, slot.endpoint, now - ticket.arrived, kind))

    def _reject(self, slot: Slot, ticket: Ticket, error: RequestError) -> None:
        slot.queue.pop(ticket.id, None)
        self.tickets.pop(ticket.id, None)
        self._emit(ev.RejectTicket(ticket.id, slot.key, error))

    # ------------------------------------------------------------ engine reports

    def _ready(self, key: ModelKey, endpoint: object, now: float) -> None:
        slot = self.slots.get(key)
        if slot is None or not slot.running or slot.stopping or slot.phase == READY:
            return
        self._phase(slot, READY, "BackendReady")
        slot.endpoint, slot.ready_since, slot.failures, slot.wanted, slot.oom_retried = endpoint, now, 0, False, False
        activation = slot.activation or Activation(key, now)
        slot.activation = None
        self._observe(slot, activation, now)
        if activation.kind == "swap":
            slot.last_swap = now
        self._grant_queued(slot, now, activation.kind)
        if slot.group is not None and self.next_up.get(slot.group) == key:
            del self.next_up[slot.group]

    def _observe(self, slot: Slot, activation: Activation, now: float) -> None:
        for effect in activation_success_effects(slot, activation, now):
            self._emit(effect)

    def _start_failed(self, key: ModelKey, error: str, now: float) -> None:
        slot = self.slots.get(key)
        if slot is None or not slot.running or slot.stopping:
            return
        if slot.activation is not None:
            self._emit(activation_failure_effect(slot, slot.activation, now))
        oom = out_of_memory_step(slot, error, self.slots.values(), self.memory)
        if oom is not None and oom.evict:  # evict the group's residents, then one retry
            slot.running, slot.activation, slot.oom_retried = False, None, True
            self._phase(slot, PENDING, "WaitingForMemory")
            for victim in oom.evict:
                self._swap(victim, slot, now, oom.cause, "out_of_memory")
            return None
        return self._fail(slot, "StartFailed", oom.refusal if oom is not None else error, now)

    def _fail(self, slot: Slot, reason: str, error: str, now: float) -> None:
        """The model server is gone without being asked to: Failed, backoff, waiting tickets rejected."""
        slot.running, slot.endpoint, slot.drain_until, slot.ready_since = False, None, None, None
        slot.activation, slot.preempted_by, slot.oom_retried = None, None, False
        slot.failures += 1
        backoff = self.policy.backoff(slot.failures)
        slot.retry_at, slot.wanted, slot.last_error, slot.stop_cause = now + backoff, False, error, ""
        self._phase(slot, FAILED, reason, error, backoff)
        for ticket in list(slot.queue.values()):
            self._reject(slot, ticket, failed_error(slot, error, backoff))
        if slot.group is not None and self.next_up.get(slot.group) == slot.key:
            del self.next_up[slot.group]

    def _stopped(self, key: ModelKey) -> None:
        slot = self.slots.get(key)
        if slot is None or not slot.running:
            return
        cause = slot.stop_cause or "stopped outside this process (in a cluster: by the manager)"
        slot.running, slot.stopping, slot.endpoint, slot.stop_cause = False, False, None, ""
        slot.drain_until, slot.ready_since, slot.activation = None, None, None
        if slot.phase != FAILED:
            preempted = slot.preempted_by is not None and slot.phase in (READY, LOADING)
            self._phase(slot, PREEMPTED if preempted else IDLE, "Preempted" if preempted else "WaitingForActivation",
                        cause)
        slot.preempted_by = None
        if slot.removed and not slot.in_flight:
            self._forget(slot)
        elif slot.queue and not self.shutting_down:
            self._phase(slot, PENDING, "WaitingForActivation")

    def _crashed(self, key: ModelKey, error: str, now: float) -> None:
        """A server exited on its own. Loading: a failed start. Ready: Failed with a backoff; a pinned model (it
        is restarted after the backoff without a request) opens its restart activation now, so the sample at
        Ready covers the whole way back (``Activation.for_restart``)."""
        slot = self.slots.get(key)
        if slot is None or not slot.running or slot.stopping:
            return self._stopped(key)
        if slot.loading:
            return self._start_failed(key, error, now)
        self._fail(slot, "ServerExited", error, now)
        if slot.pinned(self.policy):
            slot.activation = Activation.for_restart(key, now)
        return None

    def _stage(self, key: ModelKey, stage: str, now: float) -> None:
        slot = self.slots.get(key)
        if slot is not None and slot.activation is not None and slot.loading:
            slot.activation.mark(stage, now)

    # ------------------------------------------------------------ explicit control

    def _declared(self, key: ModelKey) -> Slot | None:
        slot = self.slots.get(key)
        return None if slot is None or slot.removed else slot

    def _preload(self, key: ModelKey, now: float) -> None:
        slot = self._declared(key)
        if slot is not None and not self.shutting_down:
            slot.wanted, slot.held_off = not slot.servable, False
            if slot.phase in (IDLE, PREEMPTED) and not slot.running:
                self._phase(slot, PENDING, "WaitingForActivation")

    def _unload(self, key: ModelKey, now: float) -> None:
        slot = self._declared(key)
        if slot is None:
            return
        slot.wanted, slot.held_off = False, True
        if slot.running:
            self._retire(slot, now, "unloaded")

    def _shutdown(self, now: float, drain_timeout: float | None) -> None:
        self.shutting_down = True
        self.next_up.clear()
        for slot in self.slots.values():
            for ticket in list(slot.queue.values()):
                self._reject(slot, ticket, ShuttingDownError("FlexInfer is shutting down"))
            slot.wanted = False
            if slot.running:
                self._retire(slot, now, "shutdown", timeout=drain_timeout)

    def _replace(self, models: Iterable[Model], now: float) -> None:
        declared = {m.key: m for m in models}
        for key, model in declared.items():
            slot = self.slots.get(key)
            if slot is None:
                self.slots[key] = Slot(model, capacity=capacity(model, self.policy))
                self._emit(ev.ModelDeclared(model))
                continue
            if slot.removed or slot.model != model:
                self._emit(ev.ModelDeclared(model))
            slot.removed = False  # back before its server stopped: the same slot, so one server per model
            if slot.model != model:
                self._change(slot, model, now)
        for key, slot in list(self.slots.items()):
            if key not in declared and not slot.removed:
                self._remove(slot, now)

    def _change(self, slot: Slot, model: Model, now: float) -> None:
        """A declared model's manifest changed: it forgets its failed starts; with ``restart_changed`` a running
        (or loading) server drains, stops and starts again with the new manifest, else only a move to another
        group drains it off the old one."""
        moved = slot.group != Slot(model).group
        slot.model, slot.failures, slot.retry_at = model, 0, None
        slot.capacity = capacity(model, self.policy)
        if not slot.running or slot.stopping:
            return
        if self.policy.restart_changed:
            slot.wanted = not self.shutting_down
            self._retire(slot, now, "manifest changed")
        elif moved:
            self._retire(slot, now, "moved to another GPU group")

    def _remove(self, slot: Slot, now: float) -> None:
        slot.removed, slot.wanted = True, False
        for ticket in list(slot.queue.values()):
            self._reject(slot, ticket, ModelNotFoundError(slot.model.name))
        if slot.running:
            self._retire(slot, now, "removed from the manifests")
        elif not slot.in_flight:
            self._forget(slot)

    def _forget(self, slot: Slot) -> None:
        self.slots.pop(slot.key, None)
        self._emit(ev.ModelForgotten(slot.model))

    # ------------------------------------------------------------ stopping

    def _retire(self, slot: Slot, now: float, cause: str, winner: Slot | None = None,
                timeout: float | None = None) -> None:
        """Take the model off its GPU: a loading model stops now; a Ready one drains first (bounded). ``cause``
        says why, for the stop's ``PhaseChanged`` (the first cause given wins)."""
        if slot.stopping:
            return
        slot.stop_cause = slot.stop_cause or cause
        if winner is not None:
            slot.preempted_by = winner.key
        if slot.loading or not slot.in_flight:
            self._stop(slot, forced=False)
            return
        until = now + (self.policy.drain_timeout if timeout is None else timeout)
        slot.drain_until = until if slot.drain_until is None else min(slot.drain_until, until)

    def _stop(self, slot: Slot, forced: bool) -> None:
        slot.stopping = True
        self._emit(ev.StopModel(slot.key, forced))

    def _expire(self, now: float) -> None:
        for slot in list(self.slots.values()):
            for ticket in slot.queue.due(now):
                self._reject(slot, ticket, wait_timeout_error(slot, now - ticket.arrived))
            if slot.drain_until is not None and slot.drain_until <= now and not slot.stopping:
                self._stop(slot, forced=True)
            idle_end = slot.idle_deadline(self.policy)
            if idle_end is not None and idle_end <= now:
                self._retire(slot, now, "idle timeout")
            if slot.phase == PENDING and not slot.running and not slot.queue and not slot.pinned(self.policy):
                self._phase(slot, IDLE, "WaitingForActivation")
            if stale_restart(slot, self.policy):
                slot.activation = None

    # ------------------------------------------------------------ arbitration

    def _arbitrate(self, now: float) -> None:
        if self.shutting_down:
            return
        for group, members in group_members(self.slots.values()).items():
            holder = next((s for s in members if s.running), None)
            if holder is None or self.memory.budget(group) > 0:
                self._start_next(group, members, now)
            elif holder.servable and holder.group is not None:
                winner = challenger(holder, members, now, self.policy)
                if winner is not None:
                    self._swap(holder, winner, now)

    def _start_next(self, group: str, members: list[Slot], now: float) -> None:
        """Start the planned model or the best waiting one (a group with a memory budget: ``_pack``)."""
        planned_key = self.next_up.pop(group, None)
        planned = self.slots.get(planned_key) if planned_key is not None else None
        if planned is not None and not planned.wants_gpu(now, self.policy):
            planned.activation, planned = None, None
        if self.memory.budget(group) > 0:
            return self._pack(group, members, planned, now)
        winner = planned or first_choice(members, now, self.policy)
        if winner is not None:
            self._launch(winner, members, now)
        return None

    def _launch(self, winner: Slot, members: list[Slot], now: float) -> None:
        for member in members:
            if member is not winner and member.activation is not None and member.activation.restart:
                member.activation = None  # it lost its group's GPU: its next start is an activation of its own
        if winner.activation is None:
            winner.activation = Activation(winner.key, now, demand_since=winner.oldest_wait)
        if not winner.activation.restart:
            winner.activation.start(now)
        winner.running, winner.stopping, winner.preempted_by = True, False, None
        self._phase(winner, LOADING, "StartingBackend")
        self._emit(ev.StartModel(winner.key))

    def _pack(self, group: str, members: list[Slot], planned: Slot | None, now: float) -> None:
        """Start whoever fits beside the residents; else evict by cost for the next (``packing.next_step``)."""
        while step := next_step(group, members, self.memory, planned.key if planned else None, now):
            if step.refusal:
                return self._fail(step.model, "InsufficientMemory", step.refusal, now)
            if not step.start:
                self.next_up[group] = step.model.key
                for victim in step.evict:
                    self._swap(victim, step.model, now, step.cause, "make_room")
                return None
            self._launch(step.model, [], now)
            planned = None
        return None

    def _swap(self, holder: Slot, winner: Slot, now: float, cause: str = "", evicted_for: str = "") -> None:
        """``holder`` makes way for ``winner``; ``evicted_for``: the reason counted in a group with a budget."""
        group = holder.group or ""
        self.next_up[group] = winner.key
        winner.activation = Activation(winner.key, now, "swap", holder.key, winner.oldest_wait)
        if evicted_for:
            self.memory.evicted(group, evicted_for)
        self._emit(ev.Preempted(group, holder.key, winner.key))
        self._retire(holder, now, cause or f"preempted by {winner.key}", winner)

    def _finish_shutdown(self) -> None:
        if self.shutting_down and not self._shutdown_done and not any(s.running for s in self.slots.values()):
            self._shutdown_done = True
            self._emit(ev.ShutdownComplete())

    def _schedule(self, now: float) -> None:
        times = [t for t in deadlines(self.slots.values(), self.policy, self.memory) if t > now]
        wake = min(times, default=None)
        if wake != self._wake:
            self._wake = wake
            self._emit(ev.ScheduleWake(wake))

    # ------------------------------------------------------------ small pieces

    def _phase(self, slot: Slot, new: str, reason: str, detail: str = "", retry_in: float | None = None) -> None:
        if slot.phase == new:
            return
        check_transition(slot.phase, new)
        old, slot.phase = slot.phase, new
        self._emit(ev.PhaseChanged(slot.key, old, new, reason, detail, retry_in))

    def _emit(self, effect: Effect) -> None:
        self._fx.append(effect)
