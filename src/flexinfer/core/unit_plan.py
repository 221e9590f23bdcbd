"""One reconcile pass over one unit, planned without I/O: the unit's stored facts in, one ``UnitPlan`` out.

A unit is an exclusive Model or every member of a shared GPU group. The manager's reconciler
(``flexinfer.manager.reconciler``) reads ``UnitFacts`` from its store, calls ``plan_unit`` once per pass and
executes the plan, doing only I/O. The plan, in the order the reconciler executes it:

- ``rejections``: Models that fail validation, or whose manifests cannot be rendered: phase ``Failed``,
  ``ConfigValid=False`` (``flexinfer.core.model_status.build.failed_status``), a Warning event
  ``ValidationFailed`` when the conditions change;
- ``declared``: every valid Model (its lifecycle series exist from now on);
- ``preemptions``: the members that lose the GPU while Ready (the shared-group election,
  ``flexinfer.core.election``, over the members with the proxies' ``ModelDemand`` reports folded in by
  ``flexinfer.core.demand_view``, GPULeases honoured; in a group whose GPU profile has ``multiModel``, the
  active set packed by memory, ``flexinfer.core.active_set``): the ``Preempted`` status and the Normal event
  ``Preempted``;
- ``members``: per member, losers before the leader, the Deployment and Service to apply
  (``flexinfer.core.manifests.render``; replicas and the swap drain gate from
  ``flexinfer.core.model_status.plan.plan_member``; a winner stays at zero replicas while a loser's pod still
  holds the device, ``flexinfer.core.device_handover``), the status patch (``finish_member`` + ``build_status``;
  ``{}`` when nothing changed), the fields ignored in stored objects, and what the lifecycle tracker needs
  (``stops``, ``ready_at``, ``ready_seen``);
- ``reap``: the pods of such losers whose containers have all exited, deleted at once (grace period 0);
- ``wake``: the next instant at which time alone changes a decision (``next_wakeup``), or the next log read
  while a server loads, whichever is first.

Every decision is a function of the facts as stored. Three inputs are only known between the manager's
own I/O, and each has its place:

- The drain protocol (docs/design/kubernetes-proxy.md) needs the ``Preempted`` write first, then the
  proxies' reports read afresh, then the loser's replicas. So a pass with ``preemptions`` does only them;
  the reconciler reads the reports from the API server and runs the follow-up pass at once with them
  (``UnitFacts.reports``) and with the same election (``UnitFacts.decided``: not held again over a group
  whose statuses are half written). That pass applies every member, the drain decided on fresh reports.
- The status is derived from the Deployment as stored before this pass's apply. An apply changes the
  Deployment's ``spec``; the phase reads its ``status`` and whether it exists (one created by this pass has
  an empty status: ``Pending`` either way). A newer status in the apply's response reaches the store
  with it and comes with its own watch event: the next pass writes it.
- A container that runs but is not ready says more in its log than in its state; only the plan knows
  which log it needs (``MemberAction.log``), and ``MemberAction.with_log`` folds the lines read into the
  status, the one status rebuilt after the plan. The same read measures a Ready llama.cpp server of a group
  that packs by memory, once per server run (``flexinfer.core.measured_memory``): the figure lands in
  ``status.sharedGroup.memoryMeasured`` and the pass that follows the write elects with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from flexinfer.api.conventions import ACTIVE_SERVICES_ANNOTATION, WAITING_SINCE_ANNOTATION
from flexinfer.api.errors import FlexInferError, InvalidResourceError
from flexinfer.api.model import Model, ModelStatus
from flexinfer.core import phases
from flexinfer.core.active_set import elect_active_set, holding, need_of
from flexinfer.core.controller_defaults import ControllerDefaults
from flexinfer.core.demand_view import demand_view, with_demand
from flexinfer.core.device_handover import reapable, releasing
from flexinfer.core.election import Election, Member, active_lease, elect, waiting_since_of
from flexinfer.core.flashloader_settings import cache_matches_model
from flexinfer.core.gpu_profiles import group_budget
from flexinfer.core.manifests.render import render_model
from flexinfer.core.measured_memory import MEASURE_LOG_LINES, wants_read
from flexinfer.core.model_status.build import (
    DeploymentFacts,
    failed_status,
    loading_detail,
    newest_pod,
    placed_on,
    status_patch,
)
from flexinfer.core.model_status.plan import (
    ManagerPolicy,
    MemberInputs,
    MemberPlan,
    busy_proxies,
    finish_member,
    next_wakeup,
    plan_member,
    refusal_failure,
    swap_source,
)
from flexinfer.core.model_status.pod_failure import (
    device_held_by_group,
    device_settles_at,
    out_of_memory_sign,
    pod_failure,
    shown_failure,
)
from flexinfer.core.oom_retry import OutOfMemoryFacts
from flexinfer.core.pod_answer import (
    MODEL_CONTAINER,
    answered_at,
    container_running,
    ready_by_answer,
    ready_from,
    run_key,
    with_pod_endpoint,
)
from flexinfer.core.unit_actions import (
    CRASH_LOG_LINES,
    IgnoredFields,
    LogRead,
    MemberAction,
    Preemption,
    Rejection,
    UnitPlan,
    member_status,
)
from flexinfer.core.unit_facts import StoredModel, UnitFacts

Json = dict[str, Any]


@dataclass(frozen=True)
class _Step:
    """A member's inputs and replica plan, and its status as stored."""

    inputs: MemberInputs
    plan: MemberPlan
    stored: ModelStatus
    releasing: str | None = None
    """The member whose pod must go before this one is scaled up from zero (``device_handover``)."""


def plan_unit(facts: UnitFacts, defaults: ControllerDefaults, policy: ManagerPolicy) -> UnitPlan:
    """The plan of one pass over the unit described by ``facts`` (see the module docstring)."""
    now = facts.now
    present = [s for s in facts.models if not (s.body.get("metadata") or {}).get("deletionTimestamp")]
    rejections = [rejection(s.body, s.error, now) for s in present if s.error is not None]
    stored = {s.model.name: s for s in present if s.model is not None}
    models = [_projected(s.model, facts, policy) for s in stored.values() if s.model is not None]
    election = _held(facts.decided) if facts.decided else _election(models, facts, policy) if facts.group else None
    steps = _steps(models, election, facts, policy, stored)
    decided = [_decide(step, facts, defaults, policy, stored[step.inputs.model.name].body) for step in steps]
    reap = reapable({s.releasing for s in steps if s.releasing}, facts.pods)
    rejections += [d for _, d, _ in decided if isinstance(d, Rejection)]
    preemptions = tuple(d for _, d, _ in decided if isinstance(d, Preemption))
    # A pass that preempts does only that: the members wait for the reports read after these writes.
    members = () if preemptions else tuple(d for _, d, _ in decided if isinstance(d, MemberAction))
    after = [_projected(model.model_copy(update={"status": status}), facts, policy) for model, _, status in decided]
    declared = () if facts.decided else tuple(models)  # a follow-up pass: declared by the pass that preempted
    return UnitPlan(now, tuple(rejections), declared, preemptions, members, _wake(after, members, facts, policy),
                    election, _unreadable_markers(models) if facts.group is not None else (), reap)


def _decide(step: _Step, facts: UnitFacts, defaults: ControllerDefaults, policy: ManagerPolicy,
            body: Json) -> tuple[Model, Rejection | Preemption | MemberAction, ModelStatus]:
    """One member's part of the plan and the status it leaves the member with."""
    model, now = step.inputs.model, facts.now
    try:
        manifests = _manifests(model, replace(step.plan, replicas=0) if step.releasing else step.plan, facts,
                               defaults)
    except FlexInferError as error:
        refused = rejection(body, error, now)
        return model, refused, failed_status(step.stored, model.metadata.generation, refused.message, now)
    action = _action(step, manifests, facts, policy)
    if not step.plan.preempt_now:
        return model, action, action.status
    by = step.inputs.decision.preempted_by if step.inputs.decision else ""
    return model, Preemption(model, action.patch, by, step.plan.preempted_message), action.status


def _wake(after: Sequence[Model], members: Sequence[MemberAction], facts: UnitFacts,
          policy: ManagerPolicy) -> datetime | None:
    """The next time-driven change of the unit's decisions, and the next log read while a server loads."""
    wake = next_wakeup(after, facts.leases if facts.group else (), facts.now, policy)
    settled = device_settles_at(facts.pods_gone_at, facts.now)
    if settled is not None:
        wake = settled if wake is None else min(wake, settled)
    if not any(m.status.phase == phases.LOADING and m.inputs.loading and m.inputs.loading.log_container
               for m in members):
        return wake
    next_read = facts.now + timedelta(seconds=policy.log_poll_interval)
    return next_read if wake is None else min(wake, next_read)


def rejection(body: Json, error: FlexInferError, now: datetime) -> Rejection:
    """An invalid Model's rejection: phase ``Failed``, ``ConfigValid=False`` with the problems ``error`` names."""
    meta = body.get("metadata") or {}
    problems = error.problems if isinstance(error, InvalidResourceError) else []
    message = "; ".join(str(p) for p in problems) or str(error)
    old = ModelStatus.model_validate(body.get("status") or {})
    return Rejection(body, status_patch(old, failed_status(old, meta.get("generation"), message, now)), message)


def _projected(model: Model, facts: UnitFacts, policy: ManagerPolicy) -> Model:
    return with_demand(model, demand_view(facts.reports, model.name, facts.now, policy.busy_ttl))


def _election(models: Sequence[Model], facts: UnitFacts, policy: ManagerPolicy) -> Election:
    """The shared group's active member (members carry the proxies' wait markers; GPULeases honoured)."""
    timeout, now = policy.election.default_cold_start_timeout, facts.now
    members = [Member.from_model(m, waiting_since=waiting_since_of(m), default_cold_start_timeout=timeout,
                                 busy=bool(busy_proxies(m.metadata.annotations, now, policy.busy_ttl)))
               for m in models]
    lease = active_lease(facts.leases, facts.group or "", facts.now)
    budget = group_budget(policy.gpu_profiles, models)
    if budget is None or not models:
        return elect(members, facts.now, policy.election, lease)
    needs = {m.name: need_of(m, budget) for m in models}
    held = holding(models, facts.deployments, facts.pods)
    return elect_active_set(members, now, policy.election, group=f"{models[0].namespace}/{facts.group}",
                            budget_mib=budget, needs=needs, holding=held, lease=lease, oom=_oom_facts(models, facts))


def _oom_facts(models: Sequence[Model], facts: UnitFacts) -> OutOfMemoryFacts:
    """What each member's newest pod says about running out of memory, and the records stored for its generation."""
    signs = {m.name: sign for m in models
             if (sign := out_of_memory_sign(newest_pod(facts.pods.get(m.name, ())))) is not None}
    records = {}
    for m in models:
        shared = m.status.shared_group
        record = shared.out_of_memory if shared is not None else None
        if record is not None and record.observed_generation == m.metadata.generation:
            records[m.name] = record
    return OutOfMemoryFacts(signs, records, {m.name: m.metadata.generation for m in models})


def _releasing(step: _Step, active: set[str], facts: UnitFacts) -> str | None:
    live = step.inputs.deployment
    if step.plan.replicas == 0 or (live is not None and live.replicas > 0):
        return None
    return releasing(step.inputs.model.name, active, facts.pods)


def _held(election: Election) -> Election:
    """``election`` with its preemptions done (the losers' status says ``Preempted`` since ``now``)."""
    members = {name: replace(d, preempt_now=False) for name, d in election.members.items()}
    return replace(election, members=members)


def _unreadable_markers(models: Sequence[Model]) -> tuple[tuple[str, str], ...]:
    return tuple((m.key, m.metadata.annotations[WAITING_SINCE_ANNOTATION]) for m in models
                 if WAITING_SINCE_ANNOTATION in m.metadata.annotations and waiting_since_of(m) is None)


def _steps(models: Sequence[Model], election: Election | None, facts: UnitFacts, policy: ManagerPolicy,
           stored: Mapping[str, StoredModel]) -> list[_Step]:
    """Each member's inputs and replica plan; the leader last (an incumbent is preempted before the winner
    is scaled up) and told which incumbent it takes the GPU from."""
    by_name = {m.name: m for m in models}
    steps = []
    for model in models:
        decision = election.members.get(model.name) if election else None
        leader = by_name.get(decision.preempted_by) if decision is not None else None
        live = DeploymentFacts.from_body(facts.deployments.get(model.name))
        busy = bool(busy_proxies(model.metadata.annotations, facts.now, policy.busy_ttl))
        inputs = MemberInputs(model, live, decision, leader, busy=busy)
        own = stored[model.name].model
        steps.append(_Step(inputs, plan_member(inputs, facts.now, policy), own.status if own else model.status))
    if election is None or election.leader is None:
        return steps
    active = {name for name, d in election.members.items() if d.state == "Active"}
    shared = [(s.inputs.model.name, s.plan.shared) for s in steps]
    steps = [replace(s, inputs=replace(s.inputs, swap=swap_source(s.inputs.model, shared)),
                     releasing=_releasing(s, active, facts)) if s.inputs.model.name in active else s for s in steps]
    return sorted(steps, key=lambda s: s.inputs.model.name in active)


def _manifests(model: Model, plan: MemberPlan, facts: UnitFacts, defaults: ControllerDefaults) -> tuple[Json, Json]:
    deployment, service = render_model(model, list(facts.caches), defaults, plan.replicas)
    if plan.shared is not None:
        active = ",".join(model.spec.service_labels) if plan.shared.state == "Active" else ""
        service["metadata"].setdefault("annotations", {})[ACTIVE_SERVICES_ANNOTATION] = active
    return deployment, service


def _action(step: _Step, manifests: tuple[Json, Json], facts: UnitFacts, policy: ManagerPolicy) -> MemberAction:
    """The member's status from the Deployment as stored and its newest pod (see the module docstring)."""
    model, live, plan = step.inputs.model, step.inputs.deployment, step.plan
    pod = newest_pod(facts.pods.get(model.name, ()))
    held = device_held_by_group(model.name, facts.pods, facts.pods_gone_at, facts.now, shared=model.group is not None)
    found = refusal_failure(step.inputs) or pod_failure(pod, gpu_wait_expected=held,
                                                        previous=shown_failure(step.stored))
    answered = answered_at(pod, facts.answered) if policy.pod_endpoints else None
    inputs = finish_member(step.inputs, plan, ready_by_answer(live, answered), loading_detail(pod), facts.now,
                           failure=found)
    failure = found if inputs.phase == phases.FAILED else None
    ignored = _ignored(model, facts)
    status = placed_on(member_status(model, inputs, ignored), pod)
    detail = inputs.loading
    pod_name = str(((pod or {}).get("metadata") or {}).get("name") or "")
    log = None
    if inputs.phase == phases.LOADING and detail is not None and detail.log_container and pod_name:
        log = LogRead(pod_name, detail.log_container)
    if failure is not None and failure.log_container and pod_name:
        log = LogRead(pod_name, failure.log_container, CRASH_LOG_LINES, previous=True)
    if status.phase == phases.READY and pod is not None:
        log = _measure_read(model, status, pod) or log
    source = ready_from(pod, facts.deployments.get(model.name), answered) if status.phase == phases.READY else None
    status = with_pod_endpoint(status, pod, plan.replicas, source if policy.pod_endpoints else None)
    seen = facts.ready_seen.get((source.kind, source.name)) if source is not None else None
    return MemberAction(
        model, manifests, inputs, status, status_patch(step.stored, status), ignored,
        stops=live is not None and live.replicas > 0 and plan.replicas == 0,
        ready_at=source.since if source is not None else None,
        ready_seen=answered if source is not None and source.since == answered else seen,
        busy=tuple(busy_proxies(model.metadata.annotations, facts.now, policy.busy_ttl)), log=log,
        stored=step.stored, failure=failure)


def _measure_read(model: Model, status: ModelStatus, pod: Mapping[str, Any]) -> LogRead | None:
    """The read that measures a Ready member of a group that packs by memory (``measured_memory``), if due."""
    shared = status.shared_group
    if shared is None or shared.memory_need_source is None:
        return None
    run = run_key(pod)  # Ready by the server's answer, the kubelet may not report the container yet: its log waits
    if not container_running(pod) or not wants_read(model, shared.memory_measured, run) or run is None:
        return None
    return LogRead(run.partition("#")[0], MODEL_CONTAINER, MEASURE_LOG_LINES, run=run)


def _ignored(model: Model, facts: UnitFacts) -> IgnoredFields:
    """The unparsable stored fields of the Model and of the ModelCaches that match it."""
    own = next((s.ignored for s in facts.models if s.model is not None and s.model.name == model.name), ())
    parts = [f"{p.path}: {p.message}" for p in own]
    caches = []
    for problem in facts.cache_problems:
        if cache_matches_model(problem.cache, model):
            parts += [f"ModelCache {problem.cache.name} {p.path}: {p.message}" for p in problem.ignored]
            text = "; ".join(f"{p.path}: {p.message}" for p in problem.ignored) + " (ignored; fix the field)"
            caches.append((f"cache:{problem.cache.key}", problem.body, text))
    if not parts:
        return IgnoredFields()
    return IgnoredFields(f"ignored (the next setting applies): {'; '.join(parts)}", bool(own), tuple(caches))
