"""The multi-model active set of a shared group that packs by memory (spec §3.3, multi-model mode), decided by the
memory planner (``flexinfer.core.memory_plan``) the local engine's arbiter uses.

Go keeps Active, in a group whose GPU profile has ``features.multiModel``, the leader of the one-at-a-time
election plus every other member that wants to run, by priority (name tiebreak) while the sum of
``gpu.vramEstimateMB`` stays within the profile's ``vramMB``. ``elect_active_set`` does that, and evicts by cost
when a member that wants to run does not fit:

- a member *wants to run* when it can take demand (not Failed, its cache ready) and is Ready, pinned
  (``minReplicas >= 1``, a warm primary, forced), demanded (a waiting request, or ``lastActiveTime`` within the
  demand window) or Active and still starting within its cold-start window;
- the *residents* are the Active members that still want to run (those starting count as loading: never
  evicted), plus every other member whose Deployment or pod still holds the device (leaving: its memory is not
  back yet);
- the *candidates* (members that want to run, neither resident nor leaving) are considered in order: those
  residents were evicted for within the demand window (the memory being freed is theirs), the election's leader
  (``flexinfer.core.election.choose_leader``), members waiting past the starvation bound (oldest first), then
  demanded members, then pinned ones, each by priority then name. One that fits beside the residents becomes
  Active. The first one that does not fit may evict residents chosen by the planner (idle before busy, lower
  priority, least recently used; never a pinned, loading or held one unless it starves; a busy one drains, and
  only for a strictly higher priority or a starving request) when a request waits for it (the proxies' wait
  marker; a ``lastActiveTime`` within the demand window only lets it join when it fits, so recently used idle
  members do not evict each other in turn): the victims lose the GPU now (Preempted, drained as in any swap) and
  it becomes Active once their pods are gone, and nobody else starts meanwhile (none takes the memory being
  freed for it). After a candidate that must wait for members it may not evict (pinned, starting, held, busy),
  later ones join when they fit without evicting anyone;
- a member whose need exceeds the whole budget is refused (``MemberDecision.refusal``) and never started;
- a member whose pod ran out of memory while starting (``oom``; ``flexinfer.core.oom_retry``) gets the group's
  evictable members evicted and one retry, started before anyone else once nobody that left holds the device;
  nobody else starts until that retry is Ready or failed; a second out-of-memory fails it.

A member's need is given (``needs``; ``need_of``): what its llama.cpp server's log showed once it was Ready, for
its current generation (measured), else ``spec.gpu.vramEstimateMB`` (declared), else for a vLLM member on a GPU
its ``--gpu-memory-utilization`` times the profile's ``vramMB`` (estimated), else the whole budget (unknown: it runs
alone). ``holding`` names the members whose Deployment or pod still holds the device. A budget
of ``math.inf`` (a profile with ``vramMB`` <= 0) keeps every member that wants to run Active.
A GPULease that frees the card parks every member, as in the one-at-a-time election. Pure; called by the
manager's reconcile plan (``flexinfer.core.unit_plan``).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from flexinfer.api.gpulease import GPULease
from flexinfer.api.model import Model, OutOfMemoryStatus
from flexinfer.core import vllm_need
from flexinfer.core.election import (
    Election,
    ElectionPolicy,
    Member,
    MemberDecision,
    MemberState,
    MemoryView,
    best,
    choose_leader,
    demanded,
    elect,
    group_hold,
    lease_frees_card,
    starving,
    within,
)
from flexinfer.core.errors import ConfigError
from flexinfer.core.measured_memory import measured_need
from flexinfer.core.memory_need import MemoryNeed, declared_mib, eviction_cause, first_known, too_large_message
from flexinfer.core.memory_plan import EPSILON_MIB, Candidate, Evict, Fits, Resident, plan
from flexinfer.core.model_status.build import DeploymentFacts
from flexinfer.core.oom_retry import OutOfMemoryFacts, OutOfMemoryTurn, out_of_memory_turn
from flexinfer.core.phases import READY

STARTING = ("Pending", "Loading")


def elect_active_set(members: Sequence[Member], now: datetime, policy: ElectionPolicy, *, group: str,
                     budget_mib: float, needs: Mapping[str, MemoryNeed], holding: Collection[str] = (),
                     lease: GPULease | None = None, oom: OutOfMemoryFacts | None = None) -> Election:
    """The active set of ``group`` (``namespace/name``) and every member's decision (see the module docstring).
    ``holding``: members whose Deployment wants replicas or whose pod still exists; ``oom``: out-of-memory
    starts (``flexinfer.core.oom_retry``)."""
    needs = {m.name: needs.get(m.name, MemoryNeed(budget_mib, "unknown")) for m in members}
    if lease_frees_card(lease, members):
        parked = elect(members, now, policy, lease)
        decisions = {name: replace(d, need=needs[name]) for name, d in parked.members.items()}
        return replace(parked, members=decisions, memory=_view(members, set(), holding, needs, budget_mib))
    namespace = group.partition("/")[0]
    refused = {m.name: too_large_message(f"{namespace}/{m.name}", needs[m.name], group, budget_mib) for m in members
               if needs[m.name].mib > budget_mib + EPSILON_MIB}
    primary, reason = choose_leader(members, now, policy)
    hold = group_hold(members, policy)
    active = {m.name for m in members if m.state == "Active" and m.name not in refused and wants(m, now, policy)}
    turn = OutOfMemoryTurn()
    if oom is not None and not math.isinf(budget_mib):
        turn = out_of_memory_turn(members, oom, group=group, budget_mib=budget_mib, needs=needs, active=active,
                                  now=now)
        refused.update(turn.failed)
        active -= {*turn.failed, *turn.fresh, *turn.victims}
    retrying = turn.retrying
    view = [_resident(m, needs[m.name], m.name not in active, now, hold) for m in members
            if m.name in active or m.name in holding]
    evicted: dict[str, tuple[str, str]] = {}
    # A retry after an out-of-memory start waits until every member that left is gone; nobody else starts meanwhile.
    blocked = any(m.name in holding and m.name not in active for m in members)
    fit_only = False
    planned = {m.preempted_by for m in members if m.phase == "Preempted" and m.preempted_by
               and within(now, m.preempted_at, policy.demand_window)}
    ranked = sorted((m for m in members if m.name not in active and m.name not in refused and m.name not in holding
                     and wants(m, now, policy)), key=lambda m: (m.name not in retrying,
                                                               *_rank(m, primary, planned, now, policy)))
    for member in ranked:
        if retrying and (member.name not in retrying or blocked):
            break
        need = needs[member.name]
        result = Fits() if math.isinf(budget_mib) else plan(budget_mib, view, _candidate(member, need, now, policy))
        if isinstance(result, Fits):
            active.add(member.name)
            view.append(Resident(member.name, need.mib, member.priority, loading=True))
            continue
        if isinstance(result, Evict) and not fit_only and _may_evict(member):
            cause = eviction_cause(f"{namespace}/{member.name}", need, sum(r.need_mib for r in view), group,
                                   budget_mib)
            gone = {v.key for v in result.victims}
            evicted.update((key, (member.name, cause)) for key in gone)
            active -= gone
            break  # memory is being freed for it: nobody else starts meanwhile
        fit_only = True
    leader = primary.name if primary is not None and primary.name in active else None
    if leader is None:
        chosen = best(m for m in members if m.name in active)
        leader, reason = (chosen.name, "packed") if chosen is not None else (None, "empty")
    decisions = _decide(members, active, {**turn.victims, **evicted}, refused, needs,
                        budget=None if math.isinf(budget_mib) else budget_mib, records=turn.records)
    view_now = replace(_view(members, active, holding, needs, budget_mib, evicted=tuple(evicted)),
                       evicted_for_oom=tuple(turn.victims))
    return Election(leader, reason, decisions, view_now)


def need_of(model: Model, budget: float) -> MemoryNeed:
    """What a member takes of its group's budget, by the rule both engines share (``memory_need.first_known``): what
    its server's log showed for its current generation (``measured``, ``flexinfer.core.measured_memory``), else
    ``spec.gpu.vramEstimateMB``, else an estimate, else the whole budget (``unknown``; nothing in a group without a
    limit). The manager cannot read the weights, so its only estimate is vLLM's on a GPU, which does not depend on
    them (``flexinfer.core.vllm_need``): ``--gpu-memory-utilization`` times the card's memory, the GPU profile's
    ``vramMB`` that is the budget (vLLM takes that share of each card it uses). A value vLLM would refuse gives no
    estimate (the server fails to start and says why)."""
    return first_known(measured_need(model), declared_mib(model), _estimate(model, budget),
                       unknown_mib=0.0 if math.isinf(budget) else budget)


def _estimate(model: Model, budget: float) -> float | None:
    if math.isinf(budget) or model.gpu_count == 0:
        return None
    try:
        return vllm_need.need_mib(model, device_mib=budget, weights_bytes=None)
    except ConfigError:
        return None


def holding(models: Iterable[Model], deployments: Mapping[str, Any], pods: Mapping[str, Sequence[Any]]) -> set[str]:
    """Members whose Deployment wants replicas or whose pod still exists: they hold the device (or soon will)."""
    out = set()
    for model in models:
        live = DeploymentFacts.from_body(deployments.get(model.name))
        if (live is not None and live.replicas > 0) or pods.get(model.name):
            out.add(model.name)
    return out


def wants(m: Member, now: datetime, policy: ElectionPolicy) -> bool:
    """``m`` wants to run (see the module docstring)."""
    if not m.can_take_demand:
        return False
    if m.phase == READY or m.min_replicas >= 1 or m.warm_primary or m.force or demanded(m, now, policy):
        return True
    window = max(policy.recent_window, m.cold_start_timeout)
    return m.state == "Active" and m.phase in STARTING and within(now, m.last_active, window)


def _ts(moment: datetime | None) -> float | None:
    return moment.timestamp() if moment is not None else None


def _resident(m: Member, need: MemoryNeed, leaving: bool, now: datetime, hold: float) -> Resident:
    """The planner's view of a member that holds (or is starting on, or leaving) the group's memory."""
    used = [t for t in (_ts(m.last_active), _ts(m.ready_since)) if t is not None]
    return Resident(
        key=m.name, need_mib=need.mib, priority=m.priority, last_used=max(used, default=0.0),
        busy=m.busy or m.waiting_since is not None, oldest_wait=_ts(m.waiting_since),
        pinned=m.min_replicas >= 1 or m.warm_primary or m.force, loading=m.phase != READY, leaving=leaving,
        held=within(now, m.ready_since, hold))


def _candidate(m: Member, need: MemoryNeed, now: datetime, policy: ElectionPolicy) -> Candidate:
    return Candidate(need.mib, m.priority, urgent=m.force or starving(m, now, policy),
                     oldest_wait=_ts(m.waiting_since))


def _may_evict(m: Member) -> bool:
    """Only a member a request waits for (or a forced one) evicts others; the rest join when they fit."""
    return m.force or m.waiting_since is not None


def _rank(m: Member, primary: Member | None, planned: Collection[str], now: datetime,
          policy: ElectionPolicy) -> tuple[object, ...]:
    hungry = starving(m, now, policy)
    waited = _ts(m.waiting_since) if hungry else 0.0
    return (m.name not in planned, primary is None or m.name != primary.name, not hungry, waited,
            not (m.force or demanded(m, now, policy)), -m.priority, m.name)


def _decide(members: Sequence[Member], active: set[str], evicted: Mapping[str, tuple[str, str]],
            refused: Mapping[str, str], needs: Mapping[str, MemoryNeed], *, budget: float | None,
            records: Mapping[str, OutOfMemoryStatus]) -> dict[str, MemberDecision]:
    out = {m.name: MemberDecision("Active", 0, "", False, need=needs[m.name], budget_mib=budget,
                                  out_of_memory=records.get(m.name)) for m in members if m.name in active}
    queued = sorted((m for m in members if m.name not in active), key=lambda m: (-m.priority, m.name))
    for position, m in enumerate(queued, start=1):
        preempt = m.phase == READY
        state: MemberState = "Preempted" if preempt or m.phase == "Preempted" else "Queued"
        by, cause = evicted.get(m.name, ("", ""))
        if not by and state == "Preempted":
            by = m.preempted_by  # who evicted it earlier: the swap it took part in is measured from there
        out[m.name] = MemberDecision(state, position, by, preempt, cause=cause, refusal=refused.get(m.name, ""),
                                     need=needs[m.name], budget_mib=budget, out_of_memory=records.get(m.name))
    return out


def _view(members: Sequence[Member], active: set[str], holding: Collection[str], needs: Mapping[str, MemoryNeed],
          budget: float, *, evicted: tuple[str, ...] = ()) -> MemoryView:
    """Used: Ready Active members and leaving ones that still hold the device; reserved: Active ones starting."""
    used = sum(needs[m.name].mib for m in members
               if (m.name in active and m.phase == READY) or (m.name not in active and m.name in holding))
    reserved = sum(needs[m.name].mib for m in members if m.name in active and m.phase != READY)
    return MemoryView(budget, used, reserved, evicted)
