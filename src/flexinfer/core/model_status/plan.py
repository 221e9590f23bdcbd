"""One member's part of a reconcile pass, decided purely: shared-group state, replicas (with the swap drain
gate) and the status inputs with the activation record.

``flexinfer.core.unit_plan`` calls, once per member and pass: ``plan_member`` (replicas to apply; whether this
pass preempts the member), then, with the Deployment as stored and the newest pod's loading detail,
``finish_member`` (phase, shared-group status and ``status.activation`` for ``build_status``: opened when the
model is scaled up, or when a Ready model with its replicas kept stops being Ready, ``restarting``).
A member refused by a group that packs by memory (``refusal_failure``) is ``Failed`` with ``VRAMInsufficient``
(``OutOfMemory`` when its retry after an out-of-memory start failed too).
``next_wakeup`` says when a timer must re-reconcile a unit (idle timeout, demand windows, the end of a Ready
holder's hold, drain deadline, lease expiry, a wait marker crossing the starvation bound) so nothing is polled.
``activation_clock`` and ``STAGE_OF_SUBSTAGE`` serve the manager's lifecycle tracker
(``flexinfer.manager.lifecycle``), which turns the activation record into cold-start / swap observations.

Drain (swap): a member that loses the GPU while Ready is marked Preempted at once (proxies stop sending
it requests) but keeps its replica while any proxy reports in-flight requests for it (annotation
``inflight.flexinfer.ai/<proxy>`` = RFC 3339 time of the proxy's last refresh, ignored once older than
``busy_ttl``), at most until ``preemptedAt + drain_timeout``. docs/operations/rbac.md has the contract.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Final

from flexinfer.api.conventions import INFLIGHT_PREFIX
from flexinfer.api.gpulease import GPULease
from flexinfer.api.model import ActivationStatus, Model, Phase, SharedGroupStatus
from flexinfer.core import phases
from flexinfer.core.election import (
    LEASE_PREFIX,
    ElectionPolicy,
    Member,
    MemberDecision,
    group_hold,
    waiting_since_of,
)
from flexinfer.core.gpu_profiles import GPUProfile
from flexinfer.core.group_strategy import Strategies
from flexinfer.core.lifecycle_clock import Activation
from flexinfer.core.measured_memory import kept
from flexinfer.core.model_status.build import DeploymentFacts, LoadingDetail, StatusInputs, derive_phase
from flexinfer.core.model_status.pod_failure import PodFailure
from flexinfer.core.replicas import desired_replicas, idle_timeout_seconds

STAGE_OF_SUBSTAGE: Final[dict[str, str]] = {
    "ImagePulling": "server_start", "Initializing": "server_start", "Compiling": "server_start",
    "LoadingWeights": "staging", "HealthCheckPending": "health",
}
WAKE_MARGIN: Final = timedelta(milliseconds=100)
REASON_VRAM_INSUFFICIENT: Final = "VRAMInsufficient"
"""``Ready`` reason of a member whose memory need exceeds its group's whole budget (Go's reason for a misfit)."""
REASON_OUT_OF_MEMORY: Final = "OutOfMemory"
"""``Ready`` reason of a member whose start ran out of memory again after its one retry (``core.oom_retry``)."""
REFUSALS: Final = frozenset({REASON_VRAM_INSUFFICIENT, REASON_OUT_OF_MEMORY})


@dataclass(frozen=True)
class ManagerPolicy:
    """The manager's timing knobs: election windows, swap drain timeout, staleness of proxy reports."""

    election: ElectionPolicy = field(default_factory=ElectionPolicy)
    drain_timeout: float = 60.0
    busy_ttl: float = 30.0
    log_poll_interval: float = 10.0
    """While a model server runs but is not ready, its log is re-read this often (loading substage)."""
    gpu_profiles: tuple[GPUProfile, ...] = ()
    """``FLEXINFER_GPU_PROFILES``: shared groups on a ``multiModel`` architecture pack by memory."""
    pod_endpoints: bool = True
    """``FLEXINFER_POD_ENDPOINTS``: ask a starting pod's server directly and publish a Ready model's one pod as
    ``status.podEndpoint`` (``flexinfer.core.pod_answer``); off, the kubelet's probes and the Service decide."""
    group_strategies: Strategies = ()
    """``FLEXINFER_GROUP_STRATEGIES``: the shared groups that run in one group pod
    (``flexinfer.core.group_strategy``)."""
    group_pod_env: tuple[tuple[str, str], ...] = ()
    """The manager's own settings a group pod's ``serve`` gets too (swap knobs, tracing: ``GROUP_POD_ENV``)."""


@dataclass(frozen=True)
class MemberInputs:
    """One member's facts for this pass. ``decision``/``leader`` only for shared models."""

    model: Model
    deployment: DeploymentFacts | None
    decision: MemberDecision | None = None
    leader: Model | None = None
    swap: tuple[str, datetime] | None = None
    """(incumbent, decision time) when this model takes the GPU from a preempted incumbent."""
    busy: bool = False


@dataclass(frozen=True)
class MemberPlan:
    """Replicas to apply and the member's shared-group status; ``preempt_now`` when it loses the GPU while Ready."""

    replicas: int
    shared: SharedGroupStatus | None
    preempt_now: bool = False
    preempted_message: str = ""


def inflight_refreshes(annotations: Mapping[str, str]) -> dict[str, datetime]:
    """Each proxy's last refresh of its in-flight report for the model (unparsable values are ignored)."""
    out: dict[str, datetime] = {}
    for key, value in annotations.items():
        if not key.startswith(INFLIGHT_PREFIX):
            continue
        try:
            seen = datetime.fromisoformat(value.strip())
        except ValueError:
            continue
        if seen.tzinfo is not None:
            out[key[len(INFLIGHT_PREFIX):]] = seen
    return out


def busy_proxies(annotations: Mapping[str, str], now: datetime, ttl: float) -> list[str]:
    """Proxies reporting in-flight requests for the model, refreshed within ``ttl`` seconds."""
    refreshes = inflight_refreshes(annotations)
    return sorted(proxy for proxy, seen in refreshes.items() if (now - seen).total_seconds() < ttl)


def _preempted_message(decision: MemberDecision, leader: Model | None) -> str:
    if decision.preempted_by.startswith(LEASE_PREFIX):
        return f"Preempted by GPU lease {decision.preempted_by[len(LEASE_PREFIX):]}"
    cause = f" ({decision.cause})" if decision.cause else ""
    if leader is not None:
        return f"Preempted by {leader.name} with priority {leader.priority}{cause}"
    return f"Preempted by {decision.preempted_by}{cause}" if decision.preempted_by else "Preempted"


def shared_status(model: Model, decision: MemberDecision, now: datetime) -> SharedGroupStatus:
    """``status.sharedGroup`` after the election; ``preemptedAt`` stamped when preempted in this pass; in a group
    that packs by memory, the member's need and where the figure comes from; the measured record kept while it
    applies to the model's generation (``measured_memory.kept``)."""
    old = model.status.shared_group
    preempted_at = now if decision.preempt_now else (old.preempted_at if old else None)
    need, budget = decision.need, decision.budget_mib
    return SharedGroupStatus(group_name=model.group or "", state=decision.state,
                             queue_position=decision.queue_position, preempted_by=decision.preempted_by,
                             preempted_at=preempted_at, memory_need_mib=round(need.mib, 2) if need else None,
                             memory_need_source=need.source if need else None,
                             memory_budget_mib=round(budget, 2) if budget is not None else None,
                             out_of_memory=decision.out_of_memory,
                             memory_measured=kept(old, model.metadata.generation))


def refusal_failure(inputs: MemberInputs) -> PodFailure | None:
    """A member whose need exceeds its group's whole memory budget: ``Failed`` with ``VRAMInsufficient``; one
    whose retry after an out-of-memory start ran out of memory too: ``Failed`` with ``OutOfMemory``."""
    decision = inputs.decision
    if decision is None or not decision.refusal:
        return None
    oom = decision.out_of_memory is not None and decision.out_of_memory.failure == decision.refusal
    return PodFailure(REASON_OUT_OF_MEMORY if oom else REASON_VRAM_INSUFFICIENT, decision.refusal)


def _wanted(inputs: MemberInputs) -> bool:
    """Requests are in flight to the model, or one waits for it (its wait marker): it is not idle, however long
    ago its ``lastActiveTime`` (a winner that waited for the loser's pod to go past its own idle timeout)."""
    return inputs.busy or waiting_since_of(inputs.model) is not None


def plan_member(inputs: MemberInputs, now: datetime, policy: ManagerPolicy) -> MemberPlan:
    """Replicas to apply and the member's shared-group status (spec §3.2, §3.5 + the drain gate: a preempted
    member keeps its replicas while ``inputs.busy``, until ``preemptedAt + drain_timeout``)."""
    model, decision = inputs.model, inputs.decision
    if decision is None or model.group is None:
        return MemberPlan(desired_replicas(model, now, in_flight=_wanted(inputs)), None)
    shared = shared_status(model, decision, now)
    scoped = model.model_copy(update={"status": model.status.model_copy(update={"shared_group": shared})})
    plan = MemberPlan(desired_replicas(scoped, now, in_flight=_wanted(inputs)), shared, decision.preempt_now,
                      _preempted_message(decision, inputs.leader))
    live = inputs.deployment
    draining = (shared.state == "Preempted" and plan.replicas == 0 and inputs.busy and live is not None
                and live.replicas > 0 and shared.preempted_at is not None
                and now < shared.preempted_at + timedelta(seconds=policy.drain_timeout))
    return replace(plan, replicas=live.replicas) if draining and live is not None else plan


def swap_source(winner: Model, members: Iterable[tuple[str, SharedGroupStatus | None]]) -> tuple[str, datetime] | None:
    """The incumbent preempted for ``winner`` since the winner's Ready condition last changed, if any."""
    ready = phases.find_condition(winner.status.conditions, phases.COND_READY)
    since = ready.last_transition_time if ready is not None else None
    best: tuple[str, datetime] | None = None
    for name, shared in members:
        if shared is None or shared.preempted_by != winner.name or shared.preempted_at is None:
            continue
        if since is not None and since >= shared.preempted_at:
            continue
        if best is None or shared.preempted_at > best[1]:
            best = (name, shared.preempted_at)
    return best


def restarting(model: Model, live: DeploymentFacts | None, replicas: int, phase: Phase) -> bool:
    """The model was Ready and is not any more while its Deployment keeps its replicas: its server crashed (an
    OOM kill, a failed health check) or its pod is being replaced (an eviction, a rollout). The way back to
    Ready is a restart activation, decided when the manager first sees it (Go records one too, from the Ready
    condition's flip)."""
    kept = live is not None and live.replicas > 0 and replicas > 0
    return kept and model.status.phase == phases.READY and phase in ("Pending", "Loading")


def next_activation(inputs: MemberInputs, replicas: int, phase: Phase, now: datetime) -> ActivationStatus | None:
    """Open an activation when the model is scaled up from zero (or from a not-running phase) or, with its
    replicas kept, stops being Ready (``restarting``: decided now, no queue time); keep it until Ready, drop it
    when scaled back to zero, preempted or Failed."""
    model, current = inputs.model, inputs.model.status.activation
    if replicas == 0 or phase in (phases.READY, phases.FAILED, phases.PREEMPTED):
        return None
    if current is not None:
        return current
    live = inputs.deployment
    if restarting(model, live, replicas, phase):
        return ActivationStatus(kind="cold_start", decided_at=now)
    if not (live is None or live.replicas == 0 or model.status.phase in (None, "Idle", "Preempted")):
        return None
    kind, decided, preempted = ("swap", inputs.swap[1], inputs.swap[0]) if inputs.swap else ("cold_start", now, None)
    last = model.status.last_active_time
    demand = last if last is not None and last < decided else None
    return ActivationStatus(kind=kind, decided_at=decided, demand_since=demand, preempted=preempted)


def activation_clock(model: Model) -> Activation | None:
    """A lifecycle clock rebuilt from the persisted ``status.activation`` (stage marks start empty)."""
    act = model.status.activation
    if act is None or act.decided_at is None:
        return None
    demand = act.demand_since.timestamp() if act.demand_since is not None else None
    return Activation(model.name, act.decided_at.timestamp(), kind=act.kind, preempted=act.preempted,
                      demand_since=demand)


def finish_member(inputs: MemberInputs, plan: MemberPlan, deployment: DeploymentFacts | None,
                  loading: LoadingDetail | None, now: datetime, *, failure: PodFailure | None = None
                  ) -> StatusInputs:
    """``build_status``'s inputs for ``plan`` over ``deployment``'s facts; a model Ready again clears its
    ``preemptedAt``; a model starting (Pending/Loading) whose pod shows a ``failure`` is ``Failed``."""
    shared = plan.shared
    phase = derive_phase(plan.replicas, deployment, shared.state if shared else None)
    if shared is not None and phase == phases.READY and shared.state == "Active":
        shared = shared.model_copy(update={"preempted_at": None})
    failed = failure is not None and (phase in (phases.PENDING, phases.LOADING)
                                      or (failure.reason in REFUSALS and phase != phases.READY))
    if failed:
        phase = phases.FAILED
    return StatusInputs(phase=phase, now=now, loading=loading, shared=shared,
                        activation=next_activation(inputs, plan.replicas, phase, now),
                        preempted_message=plan.preempted_message,
                        failure=(failure.reason, failure.message) if failure is not None and failed else None)


def _member_instants(model: Model, policy: ManagerPolicy) -> list[datetime]:
    out: list[datetime] = []
    last, shared = model.status.last_active_time, model.status.shared_group
    if last is not None:
        windows = [policy.election.demand_window, policy.election.recent_window, idle_timeout_seconds(model)]
        windows.append(Member.from_model(model, default_cold_start_timeout=policy.election.default_cold_start_timeout)
                       .cold_start_timeout)
        out.extend(last + timedelta(seconds=w) for w in windows)
    ready = phases.find_condition(model.status.conditions, phases.COND_READY)
    idles = model.serverless and last is not None  # else the replica count never reads the idle time
    if idles and model.status.phase == phases.READY and ready is not None and ready.last_transition_time is not None:
        out.append(ready.last_transition_time + timedelta(seconds=idle_timeout_seconds(model)))
    out.extend(seen + timedelta(seconds=policy.busy_ttl)
               for seen in inflight_refreshes(model.metadata.annotations).values())
    if shared is not None and shared.preempted_at is not None:
        out.append(shared.preempted_at + timedelta(seconds=policy.drain_timeout))
    waiting = waiting_since_of(model)
    if waiting is not None and policy.election.max_wait is not None:
        out.append(waiting + timedelta(seconds=policy.election.max_wait))
    return out


def next_wakeup(models: Sequence[Model], leases: Iterable[GPULease], now: datetime,
                policy: ManagerPolicy) -> datetime | None:
    """The earliest future instant at which an input of this group's decisions changes by time alone."""
    instants = [t for m in models for t in _member_instants(m, policy)]
    members = [Member.from_model(m) for m in models]
    if len(members) > 1:  # a group's holder may have to yield when its hold ends
        hold = group_hold(members, policy.election)
        instants += [m.ready_since + timedelta(seconds=hold) for m in members if m.ready_since is not None]
    instants += [lease.spec.expires_at for lease in leases if lease.spec.expires_at is not None]
    future = [t for t in instants if t > now]
    return min(future) + WAKE_MARGIN if future else None
