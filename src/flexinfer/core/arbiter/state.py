"""The arbiter's per-model and per-ticket state (``Slot``, ``Ticket``) and the winner-selection rules.

Owned and mutated only by ``flexinfer.core.arbiter.machine.Arbiter``; the selection functions here are pure
reads over slots (the rules are written out in docs/design/swapping.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from flexinfer.api.key import ModelKey
from flexinfer.api.model import Model
from flexinfer.core.arbiter import events as ev
from flexinfer.core.arbiter.events import Effect
from flexinfer.core.arbiter.policy import ArbiterPolicy
from flexinfer.core.errors import ColdStartTimeoutError, ModelFailedError
from flexinfer.core.lifecycle_clock import Activation, stage_totals
from flexinfer.core.phases import FAILED, IDLE, READY
from flexinfer.core.profiles import declared_parallel, effective_limit
from flexinfer.core.replicas import cold_start_timeout_seconds, idle_timeout_seconds
from flexinfer.core.swap_knobs import holds_against_starving


@dataclass(slots=True)
class Ticket:
    """One request waiting for, or holding, a grant."""

    id: int
    model: ModelKey
    arrived: float
    deadline: float
    granted: bool = False


class TicketQueue(Mapping[int, Ticket]):
    """One model's waiting tickets in arrival order, with the earliest deadline and arrival kept at hand: the
    arbiter reads both on every event, and a cold model can have thousands of tickets waiting. Each minimum is
    recomputed only after the ticket holding it leaves."""

    __slots__ = ("_arrived", "_deadline", "_tickets")

    def __init__(self) -> None:
        self._tickets: dict[int, Ticket] = {}
        self._deadline: float | None = None
        self._arrived: float | None = None
        """``None`` with tickets waiting: not known (recomputed on the next read)."""

    def __getitem__(self, ticket_id: int) -> Ticket:
        return self._tickets[ticket_id]

    def __iter__(self) -> Iterator[int]:
        return iter(self._tickets)

    def __len__(self) -> int:
        return len(self._tickets)

    def __setitem__(self, ticket_id: int, ticket: Ticket) -> None:
        known = bool(self._tickets)
        self._tickets[ticket_id] = ticket
        if not known:
            self._deadline, self._arrived = ticket.deadline, ticket.arrived
            return
        if self._deadline is not None:
            self._deadline = min(self._deadline, ticket.deadline)
        if self._arrived is not None:
            self._arrived = min(self._arrived, ticket.arrived)

    def pop(self, ticket_id: int, default: Ticket | None = None) -> Ticket | None:
        ticket = self._tickets.pop(ticket_id, None)
        if ticket is None:
            return default
        if self._deadline is not None and ticket.deadline <= self._deadline:
            self._deadline = None
        if self._arrived is not None and ticket.arrived <= self._arrived:
            self._arrived = None
        return ticket

    def clear(self) -> None:
        self._tickets.clear()
        self._deadline = self._arrived = None

    def due(self, now: float) -> list[Ticket]:
        """The tickets whose deadline is ``now`` or earlier (no scan unless one is)."""
        earliest = self.earliest_deadline()
        if earliest is None or earliest > now:
            return []
        return [t for t in self._tickets.values() if t.deadline <= now]

    def earliest_deadline(self) -> float | None:
        if self._deadline is None and self._tickets:
            self._deadline = min(t.deadline for t in self._tickets.values())
        return self._deadline

    def oldest_arrival(self) -> float | None:
        if self._arrived is None and self._tickets:
            self._arrived = min(t.arrived for t in self._tickets.values())
        return self._arrived


@dataclass
class Slot:
    """Everything the arbiter knows about one declared model."""

    model: Model
    phase: str = IDLE
    endpoint: object | None = None
    queue: TicketQueue = field(default_factory=TicketQueue)
    in_flight: set[int] = field(default_factory=set)
    last_active: float | None = None
    ready_since: float | None = None
    activation: Activation | None = None
    running: bool = False
    """StartModel issued and ModelStopped not yet seen: this model holds (or is loading onto) its GPU."""
    drain_until: float | None = None
    """Set while draining: no new grants; stopped when in-flight reaches 0 or at this time."""
    stopping: bool = False
    stop_cause: str = ""
    """Why the arbiter is taking the model off its GPU (set with ``stopping``/draining; cleared once stopped)."""
    preempted_by: ModelKey | None = None
    wanted: bool = False
    held_off: bool = False
    failures: int = 0
    retry_at: float | None = None
    last_error: str | None = None
    """Why the last start failed (for the backoff rejection's message)."""
    last_swap: float | None = None
    removed: bool = False
    capacity: int = 0
    """Grants at once (the model's parallel capacity and the proxy-wide cap, ``capacity``); 0 =
    unlimited. Tickets beyond it wait in ``queue``."""
    oom_retried: bool = False
    """This activation's start already ran out of memory once (a group that packs by memory retries once)."""

    @property
    def key(self) -> ModelKey:
        return self.model.key

    @property
    def group(self) -> str | None:
        """The shared group's identity (``namespace/group``), ``None`` for a model with its own GPU."""
        group = self.model.group
        return f"{self.model.namespace}/{group}" if group else None

    @property
    def servable(self) -> bool:
        """Ready and accepting new grants (not draining or stopping)."""
        return self.running and self.phase == READY and self.drain_until is None and not self.stopping

    @property
    def has_room(self) -> bool:
        """Another ticket may be granted now: servable, below its capacity, and nobody queued before it."""
        return self.servable and not self.queue and (not self.capacity or len(self.in_flight) < self.capacity)

    @property
    def loading(self) -> bool:
        return self.running and self.phase != READY

    @property
    def oldest_wait(self) -> float | None:
        return self.queue.oldest_arrival()

    def pinned(self, policy: ArbiterPolicy) -> bool:
        """Kept running without demand: an explicit preload, or ``minReplicas >= 1`` (unless unloaded) where
        this arbiter owns scaling."""
        floor = policy.owns_scaling and self.model.min_replicas >= 1 and not self.held_off
        return self.wanted or floor

    def backing_off(self, now: float) -> bool:
        return self.phase == FAILED and self.retry_at is not None and now < self.retry_at

    def wants_gpu(self, now: float, policy: ArbiterPolicy) -> bool:
        return not self.removed and not self.backing_off(now) and (bool(self.queue) or self.pinned(policy))

    def idle_deadline(self, policy: ArbiterPolicy) -> float | None:
        """When a Ready, unpinned, unused model is stopped by the idle timeout (never where this arbiter does
        not own scaling)."""
        if not policy.owns_scaling or not self.servable or self.queue or self.in_flight or self.pinned(policy):
            return None
        base = max(t for t in (self.last_active, self.ready_since) if t is not None)
        return base + idle_timeout_seconds(self.model)

    def idle_deadline_after_last(self, now: float, policy: ArbiterPolicy) -> float | None:
        """``idle_deadline`` once the last in-flight request ends at ``now`` (the express lane's look-ahead)."""
        if not policy.owns_scaling or not self.servable or self.queue or self.pinned(policy):
            return None
        return max(now, self.ready_since or now) + idle_timeout_seconds(self.model)

    def cold_start_budget(self, policy: ArbiterPolicy) -> float:
        return cold_start_timeout_seconds(self.model, policy.cold_start_timeout)


def capacity(model: Model, policy: ArbiterPolicy) -> int:
    """How many tickets ``model`` may hold at once (0 = unlimited)."""
    return effective_limit(policy.max_concurrency, declared_parallel(model))


def group_members(slots: Iterable[Slot]) -> dict[str, list[Slot]]:
    """Slots by shared group (``namespace/group``); a model with its own GPU is a group of one."""
    groups: dict[str, list[Slot]] = {}
    for slot in slots:
        groups.setdefault(slot.group or f"\0{slot.key}", []).append(slot)
    return groups


def waiting_reason(slots: Mapping[ModelKey, Slot], key: ModelKey) -> str:
    """Why a request for ``key`` waits: ``queue`` (Ready, no free place), the activation's kind, else ``swap``
    when another member of its group runs, else ``cold_start``."""
    slot = slots.get(key)
    if slot is None:
        return "cold_start"
    if slot.servable:
        return "queue"
    if slot.activation is not None:
        return slot.activation.kind
    peers = [s for s in slots.values() if s.group is not None and s.group == slot.group and s is not slot]
    return "swap" if any(p.running for p in peers) else "cold_start"


def express_keys(slots: Iterable[Slot]) -> frozenset[ModelKey]:
    """The models whose requests ``Arbiter.admit``/``finish`` may answer without a full decision: Ready and
    servable (not draining, stopping or preempted), with no waiting ticket in their group. Until the next event
    that is not a request for them, nothing but time can change a decision about them, and the arbiter's
    wake-up covers time."""
    slots = list(slots)
    contested = {s.group for s in slots if s.queue and s.group is not None}
    return frozenset(s.key for s in slots if s.servable and not s.queue and s.group not in contested)


def _by_priority(slot: Slot) -> tuple[int, float, str]:
    oldest = slot.oldest_wait
    return (-slot.model.priority, oldest if oldest is not None else float("inf"), slot.key)


def starving(slots: Iterable[Slot], now: float, policy: ArbiterPolicy) -> Slot | None:
    """The waiting model whose oldest ticket has waited longest, if that is at least ``max_wait``."""
    waits = [(s.oldest_wait, s.key, s) for s in slots if not s.backing_off(now)]
    hungry = [(oldest, key, s) for oldest, key, s in waits if oldest is not None and now - oldest >= policy.max_wait]
    return min(hungry, key=lambda item: (item[0], item[1]), default=(0.0, "", None))[2]


def first_choice(slots: Sequence[Slot], now: float, policy: ArbiterPolicy) -> Slot | None:
    """Who gets a free GPU: a starving model; else the best with waiting tickets (priority, oldest wait,
    name); else the best pinned/preloaded model."""
    candidates = [s for s in slots if s.wants_gpu(now, policy)]
    hungry = starving(candidates, now, policy)
    if hungry is not None:
        return hungry
    waiting = [s for s in candidates if s.queue]
    return min(waiting or candidates, key=_by_priority, default=None)


def challenger(holder: Slot, slots: Sequence[Slot], now: float, policy: ArbiterPolicy) -> Slot | None:
    """Who should take the GPU from a Ready ``holder`` now, if anyone.

    1. A starving model (oldest ticket waited ``max_wait``) wins, whatever the priorities and the hold, unless
       the holder's own oldest waiting ticket is older still (oldest first: no two starving models take the GPU
       from each other before either serves) or was waiting when the holder became Ready (it serves the backlog
       it was started for): ``holds_against_starving``.
    2. Within ``min_hold`` after the holder became Ready, nobody else.
    3. The best waiting model wins if the holder is idle (no queued or in-flight requests), or if it has
       strictly higher priority than the busy holder. Pinned models without tickets never preempt.
    """
    others = [s for s in slots if s is not holder and s.queue and s.wants_gpu(now, policy)]
    hungry = starving(others, now, policy)
    if hungry is not None and not holds_against_starving(holder.oldest_wait, holder.ready_since,
                                                         hungry.oldest_wait or now):
        return hungry
    if holder.ready_since is not None and now < holder.ready_since + policy.min_hold:
        return None
    best = min(others, key=_by_priority, default=None)
    if best is None:
        return None
    busy = bool(holder.queue or holder.in_flight)
    return best if not busy or best.model.priority > holder.model.priority else None


def decision_times(holder: Slot, slots: Sequence[Slot], policy: ArbiterPolicy) -> list[float]:
    """Every time at which ``challenger`` could change its answer without a new event: the hold's end and each
    waiting model's starvation threshold. All of them, past ones too: the caller takes the first one still
    ahead (the earliest alone may be past — the hold ended — while a starvation threshold is still to come)."""
    others = [s for s in slots if s is not holder and s.queue]
    if not others:
        return []
    times = [oldest + policy.max_wait for s in others if (oldest := s.oldest_wait) is not None]
    if holder.ready_since is not None:
        times.append(holder.ready_since + policy.min_hold)
    return times


def stale_restart(slot: Slot, policy: ArbiterPolicy) -> bool:
    """``slot`` holds a restart activation (its Ready server crashed) that no longer stands for a way back: the
    model is no longer kept running (unloaded, removed, no longer pinned) and has not been started again."""
    activation = slot.activation
    return activation is not None and activation.restart and not slot.running and not slot.pinned(policy)


def wait_timeout_error(slot: Slot, waited: float) -> ColdStartTimeoutError:
    """The error for a ticket whose deadline passed: its model did not become Ready in time, or (Ready) had no
    free place among its ``capacity`` concurrent requests."""
    name = slot.model.name
    if slot.servable and slot.capacity:
        plural = "s" if slot.capacity != 1 else ""
        return ColdStartTimeoutError(f"Timeout waiting for a free slot on model '{name}' (limit {slot.capacity} "
                                     f"concurrent request{plural}; waited {waited:.1f}s)")
    return ColdStartTimeoutError(f"Timeout waiting for model '{name}' to become ready (waited {waited:.1f}s)")


def failed_error(slot: Slot, error: str, retry_after: float) -> ModelFailedError:
    """The error for tickets of a model that failed to start (``retry_after`` = the backoff left)."""
    err = ModelFailedError(f"Failed to activate model '{slot.model.name}': {error}")
    err.retry_after = max(retry_after, 1.0)
    return err


def backoff_error(slot: Slot, now: float) -> ModelFailedError:
    """The error for a request that arrives while a failed model waits out its restart backoff: when the next
    start may be tried, after how many failures, and why the last one failed."""
    left = max((slot.retry_at or now) - now, 0.0)
    failures = f"{slot.failures} failed start{'s' if slot.failures != 1 else ''}"
    why = (slot.last_error or "").strip().splitlines()[0].rstrip(":") if slot.last_error else "unknown error"
    return failed_error(slot, f"restart backoff after {failures}, next start in {math.ceil(left)}s "
                              f"(last failure: {why})", left)


def activation_success_effects(slot: Slot, activation: Activation, now: float) -> list[Effect]:
    """The observations of an activation that reached Ready: cold start, swap (shared groups), one sample per
    stage (its total), and the ``ActivationDone`` record (every span) naming the tickets that waited for it."""
    obs = activation.finish(now)
    effects: list[Effect] = []
    if obs.cold_start is not None:
        effects.append(ev.ObserveColdStart(slot.key, obs.cold_start))
    if obs.swap is not None and slot.group is not None:
        effects.append(ev.ObserveSwap(slot.key, slot.group, obs.swap))
    # one sample per stage, its total: a restart's server_start may come back after the engine's staging
    effects += [ev.ObserveStage(slot.key, stage, seconds) for stage, seconds in stage_totals(obs.stages).items()]
    stages = tuple((s.stage, s.start, s.end) for s in obs.stages)
    effects.append(ev.ActivationDone(slot.key, activation.kind, activation.decided_at, now, stages,
                                     tuple(slot.queue), "success", _displaced(activation)))
    return effects


def activation_failure_effect(slot: Slot, activation: Activation, now: float) -> Effect:
    """The ``ActivationDone`` record of an activation whose start failed."""
    stages = tuple((s.stage, s.start, s.end) for s in activation.fail(now).stages)
    return ev.ActivationDone(slot.key, activation.kind, activation.decided_at, now, stages, tuple(slot.queue),
                             "failure", _displaced(activation))


def _displaced(activation: Activation) -> ModelKey | None:
    """The key of the model a swap took the GPU from (the arbiter's clocks record keys)."""
    return ModelKey.parse(activation.preempted) if activation.preempted else None
