"""Shared-group election over Model statuses (spec §3.3) and the GPU-lease park-and-hold read side (§3.4).

``elect(members, now, policy, lease)`` returns an ``Election``: the leader (or none while a lease parks
the card), the reason (which rule decided), and each member's state, queue position and ``preemptedBy``.
Called by the manager's reconcile plan (``flexinfer.core.unit_plan``) once per reconcile of a shared group. The
rules that take the GPU from a Ready holder are the in-process arbiter's (``flexinfer.core.arbiter.state``
``challenger``), with the same knobs (``flexinfer.core.swap_knobs``): the starvation bound ``max_wait`` wins
whatever the priorities and the hold; within ``min_hold`` after Ready nobody else; then the best waiting member
if the holder is idle (nothing in flight, nothing waiting), or a member of strictly higher priority if it is
busy and the member was asked for after the holder became Ready (a request waits, or Go's 2-minute demand window
from a request since).
Here they read persisted status and the proxies' reports instead of live tickets (docs/design/swapping.md lists
the differences from the Go rules). A group whose GPU profile has ``multiModel`` keeps several members
Active at once: ``flexinfer.core.active_set`` builds that set around this election's leader.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal

from flexinfer.api.conventions import WAITING_SINCE_ANNOTATION
from flexinfer.api.gpulease import GPULease
from flexinfer.api.model import Model, OutOfMemoryStatus
from flexinfer.api.units import parse_duration
from flexinfer.core.memory_need import MemoryNeed
from flexinfer.core.phases import COND_READY, FAILED, READY, find_condition
from flexinfer.core.replicas import cold_start_timeout_seconds, idle_timeout_seconds
from flexinfer.core.swap_knobs import DEFAULT_MAX_WAIT, DEFAULT_MIN_HOLD, holds_against_starving

DEMAND_WINDOW: Final = 120.0
RECENT_WINDOW: Final = 300.0
LEASE_PREFIX: Final = "gpu-lease/"

MemberState = Literal["Active", "Queued", "Preempted"]


def parse_waiting_since(text: str) -> datetime:
    """An RFC 3339 instant with a UTC offset (``Z`` allowed); ``ValueError`` for anything else."""
    moment = datetime.fromisoformat(text.strip())
    if moment.tzinfo is None:
        raise ValueError(f"no UTC offset in {text!r}")
    return moment


def waiting_since_of(model: Model) -> datetime | None:
    """The model's wait marker (``WAITING_SINCE_ANNOTATION``); ``None`` when absent or unparsable."""
    text = model.metadata.annotations.get(WAITING_SINCE_ANNOTATION)
    if text is None:
        return None
    try:
        return parse_waiting_since(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class ElectionPolicy:
    """Election windows and the swap knobs the arbiter uses too (``flexinfer.core.swap_knobs``): ``min_hold``
    (a Ready holder keeps the GPU this long after Ready; ``gpu.swapCooldown`` can lengthen it for a group) and
    ``max_wait`` (the starvation bound; ``None`` = off, the Go behaviour)."""

    min_hold: float = DEFAULT_MIN_HOLD
    max_wait: float | None = DEFAULT_MAX_WAIT
    demand_window: float = DEMAND_WINDOW
    recent_window: float = RECENT_WINDOW
    default_cold_start_timeout: float = 60.0


@dataclass(frozen=True)
class Member:
    """The facts the election reads about one group member."""

    name: str
    priority: int = 100
    phase: str | None = None
    state: str | None = None
    last_active: datetime | None = None
    preempted_at: datetime | None = None
    waiting_since: datetime | None = None
    """Oldest request waiting for this model (reported by the proxy); feeds the starvation bound."""
    force: bool = False
    warm_primary: bool = False
    min_replicas: int = 0
    can_take_demand: bool = True
    cold_start_timeout: float = 60.0
    swap_cooldown: float | None = None
    """``gpu.swapCooldown``: lengthens the group's hold (``group_hold``)."""
    idle_timeout: float | None = None
    """The member's own idle timeout (serverless members; ``None`` = never idle): see ``_lapsed``."""
    ready_since: datetime | None = None
    """While Ready: when it became Ready (its ``Ready`` condition's ``lastTransitionTime``); starts the hold."""
    busy: bool = False
    """A proxy reports requests in flight to it (``inFlightAt``, fresh)."""
    preempted_by: str = ""
    """Who took the GPU from it last (``status.sharedGroup.preemptedBy``), kept while it stays Preempted."""

    @classmethod
    def from_model(cls, model: Model, waiting_since: datetime | None = None,
                   default_cold_start_timeout: float = 60.0, busy: bool = False) -> Member:
        status, gpu = model.status, model.spec.gpu
        shared = status.shared_group
        cache_ok = status.cache is None or status.cache.ready
        return cls(
            name=model.name, priority=model.priority, phase=status.phase,
            state=shared.state if shared else None, last_active=status.last_active_time,
            preempted_at=shared.preempted_at if shared else None, waiting_since=waiting_since,
            force=bool(gpu and gpu.force_promotion), warm_primary=model.spec.config.get("warmPolicy") == "primary",
            min_replicas=model.min_replicas, can_take_demand=status.phase != FAILED and cache_ok,
            cold_start_timeout=cold_start_timeout_seconds(model, default_cold_start_timeout),
            swap_cooldown=parse_duration(gpu.swap_cooldown) if gpu and gpu.swap_cooldown else None,
            idle_timeout=idle_timeout_seconds(model) if model.serverless else None,
            ready_since=_ready_since(model), busy=busy, preempted_by=shared.preempted_by if shared else "")


def _ready_since(model: Model) -> datetime | None:
    if model.status.phase != READY:
        return None
    ready = find_condition(model.status.conditions, COND_READY)
    return ready.last_transition_time if ready is not None and ready.status == "True" else None


@dataclass(frozen=True)
class MemberDecision:
    state: MemberState
    queue_position: int
    preempted_by: str
    preempt_now: bool
    """The member was Ready and loses the GPU in this decision: stamp ``preemptedAt``, count the metric."""
    cause: str = ""
    """Why it was evicted (groups that pack by memory: for whom, and the figures)."""
    refusal: str = ""
    """It can never run in its group (its need exceeds the group's whole memory budget): the message."""
    need: MemoryNeed | None = None
    """What it takes of its group's memory budget (groups that pack by memory)."""
    budget_mib: float | None = None
    """Its group's memory budget (groups that pack by memory with a limit)."""
    out_of_memory: OutOfMemoryStatus | None = None
    """A start that ran out of memory (``flexinfer.core.oom_retry``): the record its status keeps."""


@dataclass(frozen=True)
class MemoryView:
    """A group that packs by memory, as decided: its budget (``math.inf``: no limit), what its Ready (or leaving)
    members hold, what is reserved for its members starting, and who was evicted for room in this decision."""

    budget_mib: float
    used_mib: float
    reserved_mib: float
    evicted: tuple[str, ...] = ()
    evicted_for_oom: tuple[str, ...] = ()
    """Evicted in this decision because another member's start ran out of memory beside them."""


@dataclass(frozen=True)
class Election:
    leader: str | None
    reason: str
    members: dict[str, MemberDecision]
    memory: MemoryView | None = None
    """Set for a group that packs by memory (``flexinfer.core.active_set``): several members may be Active."""


def _age(now: datetime, then: datetime | None) -> float | None:
    return None if then is None else (now - then).total_seconds()


def _better(a: Member, b: Member) -> int:
    """Negative when ``a`` ranks first: higher priority, then more recent activity, then smaller name."""
    if a.priority != b.priority:
        return -1 if a.priority > b.priority else 1
    if a.last_active is not None and b.last_active is not None and a.last_active != b.last_active:
        return -1 if a.last_active > b.last_active else 1
    return -1 if a.name < b.name else (1 if a.name > b.name else 0)


def best(members: Iterable[Member]) -> Member | None:
    ranked = sorted(members, key=functools.cmp_to_key(_better))
    return ranked[0] if ranked else None


def group_hold(members: Sequence[Member], policy: ElectionPolicy) -> float:
    """How long a Ready holder keeps the GPU after Ready: max(``min_hold``, every member's ``gpu.swapCooldown``)."""
    return max([policy.min_hold, *(m.swap_cooldown for m in members if m.swap_cooldown is not None)])


def within(now: datetime, then: datetime | None, window: float) -> bool:
    age = _age(now, then)
    return age is not None and age < window


_NOBODY_WANTS_IT: Final = frozenset({"runnable", "fallback", "empty"})
"""Reasons that mean no member wants the GPU: a failed holder then keeps it (``failed_holder``)."""


def choose_leader(members: Sequence[Member], now: datetime, policy: ElectionPolicy) -> tuple[Member | None, str]:
    """The leader and the rule that chose it, first match wins (docs/design/swapping.md rule 5, as the arbiter):

    1. ``force_promotion`` (Go);
    2. ``cold_start_in_flight``: an Active member still starting (demand within its cold-start window) is never
       preempted;
    3. ``starvation_bound``: the member waiting longest past ``max_wait`` takes the GPU, whatever the priorities
       and the hold;
    4. ``min_hold``: a Ready holder keeps the GPU within ``group_hold`` after it became Ready;
    5. by category (``_by_category``): a demanded member of strictly higher priority, or any waiting member when
       the Ready holder is idle, takes it; else the holder keeps it; with no holder, the Go categories;
    6. ``failed_holder``: when nobody else wants the GPU, an Active member whose server failed keeps it (its pod
       stays, the kubelet keeps retrying, the failure stays visible) instead of the card going to a member
       nobody asked for.
    """
    forced = best(m for m in members if m.force)
    if forced is not None:
        return forced, "force_promotion"
    loading = best(m for m in members if m.state == "Active" and m.phase in ("Pending", "Loading")
                   and within(now, m.last_active, max(policy.recent_window, m.cold_start_timeout)))
    if loading is not None:
        return loading, "cold_start_in_flight"
    hungry = _starving(members, now, policy)
    if hungry is not None:
        return hungry, "starvation_bound"
    holder = best(m for m in members if m.can_take_demand and m.phase == READY)
    if holder is not None and holder.ready_since is not None and within(now, holder.ready_since,
                                                                         group_hold(members, policy)):
        return holder, "min_hold"
    leader, reason = _by_category(members, now, policy)
    failed = best(m for m in members if m.state == "Active" and m.phase == FAILED)
    if reason in _NOBODY_WANTS_IT and failed is not None:
        return failed, "failed_holder"
    return leader, reason


def starving(m: Member, now: datetime, policy: ElectionPolicy) -> bool:
    """``m``'s oldest waiting request has waited ``max_wait`` (the starvation bound, when it is on)."""
    return (policy.max_wait is not None and m.waiting_since is not None
            and (now - m.waiting_since).total_seconds() >= policy.max_wait)


def _starving(members: Sequence[Member], now: datetime, policy: ElectionPolicy) -> Member | None:
    hungry = [m for m in members if m.can_take_demand and m.state != "Active" and starving(m, now, policy)]
    first = min(hungry, key=lambda m: (m.waiting_since or now, m.name), default=None)
    if first is None or first.waiting_since is None:
        return None
    # Oldest first includes the holder: a holder whose own requests have waited longer (a swap that outlasted
    # the bound) keeps the GPU until they are forwarded, else two starving members take it from each other
    # before either serves a request. And a holder keeps it while it serves the backlog it was started for
    # (requests waiting since before it became Ready): when every member starves (a rotation of swaps longer
    # than the bound), oldest first alone would hand the GPU on after one request per swap.
    if any(m.state == "Active" and holds_against_starving(m.waiting_since, m.ready_since, first.waiting_since)
           for m in members):
        return None
    return first



def _lapsed(m: Member, now: datetime) -> bool:
    """No request waits for the member and its own idle timeout has passed since its last activity: its demand
    is over (the manager scales such a member to zero), however recent the election's windows call it. Such a
    member, once no longer Ready, is neither demand nor recent."""
    return m.waiting_since is None and m.idle_timeout is not None and not within(now, m.last_active, m.idle_timeout)


def demanded(m: Member, now: datetime, policy: ElectionPolicy) -> bool:
    return m.phase != READY and (m.waiting_since is not None
                                 or (within(now, m.last_active, policy.demand_window) and not _lapsed(m, now)))


def _demand_against(m: Member, holder: Member, now: datetime, policy: ElectionPolicy) -> bool:
    """``m`` is demand that may take the GPU from the Ready ``holder``: a request waits for it, or it was asked
    for (Go's 2-minute window) after ``holder`` became Ready. A member whose requests were all answered before the
    holder took over (a manager restarted 30 s after its last request) is no demand against it."""
    if not demanded(m, now, policy):
        return False
    if m.waiting_since is not None or holder.ready_since is None:
        return True
    return m.last_active is not None and m.last_active > holder.ready_since


def _idle(m: Member) -> bool:
    """Nothing in flight and nothing waiting for it: the arbiter's idle holder."""
    return not m.busy and m.waiting_since is None


def _by_category(members: Sequence[Member], now: datetime, policy: ElectionPolicy) -> tuple[Member | None, str]:
    runnable = [m for m in members if m.can_take_demand]
    ready = best(m for m in runnable if m.phase == READY)
    warm = best(m for m in runnable if m.warm_primary)
    if ready is not None:
        wanted = best(m for m in runnable if _demand_against(m, ready, now, policy))
        quiet = _idle(ready) and not within(now, ready.last_active, policy.demand_window)  # Go's "idle (2 m)"
        if wanted is not None and (wanted.priority > ready.priority
                                   or (quiet and wanted.priority >= ready.priority)):
            return wanted, "demand_preemption"
        waiting = best(m for m in runnable if m.phase != READY and m.waiting_since is not None)
        if waiting is not None and _idle(ready):
            return waiting, "idle_holder"
        if warm is not None and not ready.warm_primary and quiet:
            return warm, "warm_primary_reclaim"
        return ready, "ready"
    recent = best(m for m in runnable if m.phase != READY and within(now, m.last_active, policy.recent_window)
                  and not _lapsed(m, now))
    if recent is not None and warm is not None:
        return (recent, "recent") if recent.priority >= warm.priority else (warm, "warm_primary")
    for choice, reason in ((recent, "recent"), (warm, "warm_primary"),
                           (best(m for m in runnable if m.min_replicas >= 1), "warm_pinned"),
                           (best(runnable), "runnable"), (best(members), "fallback")):
        if choice is not None:
            return choice, reason
    return None, "empty"


def active_lease(leases: Iterable[GPULease], group: str, now: datetime) -> GPULease | None:
    """The first lease for ``group`` that is honoured at ``now`` (expired ones are ignored)."""
    return next((lease for lease in leases if lease.spec.group == group and lease.active_at(now)), None)


def lease_frees_card(lease: GPULease | None, members: Sequence[Member]) -> bool:
    """Park-and-hold: no lease → False; no lease priority → True; else True only when every member's
    priority is strictly below the lease's."""
    if lease is None:
        return False
    threshold = lease.spec.priority
    return threshold is None or all(m.priority < threshold for m in members)


def elect(members: Sequence[Member], now: datetime, policy: ElectionPolicy | None = None,
          lease: GPULease | None = None) -> Election:
    """Run the election; a lease that frees the card yields no leader and every member Queued/Preempted."""
    policy = policy or ElectionPolicy()
    if lease_frees_card(lease, members):
        owner = f"{LEASE_PREFIX}{lease.spec.owner or lease.metadata.name}" if lease else LEASE_PREFIX
        return Election(None, "gpu_lease", _decide(members, None, owner))
    leader, reason = choose_leader(members, now, policy)
    return Election(leader.name if leader else None, reason,
                    _decide(members, leader.name if leader else None, leader.name if leader else ""))


def _decide(members: Sequence[Member], leader: str | None, preempted_by: str) -> dict[str, MemberDecision]:
    queued = sorted((m for m in members if m.name != leader), key=lambda m: (-m.priority, m.name))
    out = {leader: MemberDecision("Active", 0, "", False)} if leader else {}
    for position, m in enumerate(queued, start=1):
        preempt = m.phase == READY
        state: MemberState = "Preempted" if preempt or m.phase == "Preempted" else "Queued"
        out[m.name] = MemberDecision(state, position, preempted_by, preempt)
    return out
