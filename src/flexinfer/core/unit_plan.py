"""One reconcile pass over one unit, planned without I/O: the unit's stored facts in, one ``UnitPlan`` out.

A unit is an exclusive Model or every member of a shared GPU group. The manager's reconciler
(``flexinfer.manager.reconciler``) reads ``UnitFacts`` from its store, calls ``plan_unit`` once per pass and
executes the plan, doing only I/O. The plan, in the order the reconciler executes it:

- ``rejections``: Models that fail validation (or whose manifests cannot be rendered): phase ``Failed``,
  ``ConfigValid=False`` (``flexinfer.core.model_status.build.failed_status``), a Warning event when the
  conditions change;
- ``declared``: every valid Model (its lifecycle series exist from now on);
- ``preemptions``: members that lose the GPU while Ready in this pass (the shared-group election,
  ``flexinfer.core.election``, over the members with the proxies' ``ModelDemand`` reports folded in,
  ``flexinfer.core.demand_view``): the ``Preempted`` status to write first, the Normal event ``Preempted``;
- ``members``: per member (losers before the leader), the Deployment and Service to apply
  (``flexinfer.core.manifests.render``, replicas from ``flexinfer.core.model_status.plan.plan_member``), the
  status patch (``finish_member`` + ``build_status``, only when it changed), the fields ignored in stored
  objects, and what the lifecycle tracker needs (``stops``, ``ready_at``);
- ``wake``: the next instant at which time alone changes a decision (and the next log read while a server
  loads).

The plan is a function of observed facts only. Three reads sit between the manager's writes, and each
has its place:

- A preemption must be written before the loser's replicas are decided, and the proxies' reports read
  afresh after that write (the drain protocol, docs/design/kubernetes-proxy.md). So a pass with
  ``preemptions`` leaves the losers' Deployments alone; the reconciler then reads the reports from the API
  server and runs the next pass at once with them (``UnitFacts.reports``): that pass, in which the losers
  are ``Preempted``, decides their drain.
- The status is derived from the Deployment as stored, not as applied: an apply changes its ``spec``,
  while the phase reads the Deployment's ``status`` and whether it exists (a Deployment created by this
  pass has an empty status: ``Pending`` either way). A newer status returned by the apply reaches the
  store with the apply's response and brings its own watch event, hence the next pass.
- The log tail of a container that runs but is not ready refines the loading detail; only the plan knows
  which one it needs (``MemberAction.log``), and ``MemberAction.with_log`` folds the lines in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from flexinfer.api.conventions import ACTIVE_SERVICES_ANNOTATION, WAITING_SINCE_ANNOTATION
from flexinfer.api.errors import FieldProblem, FlexInferError, InvalidResourceError
from flexinfer.api.gpulease import GPULease
from flexinfer.api.model import Model, ModelStatus
from flexinfer.api.modelcache import ModelCache
from flexinfer.api.modeldemand import ModelDemand
from flexinfer.core import phases
from flexinfer.core.controller_defaults import ControllerDefaults
from flexinfer.core.demand_view import demand_view, with_demand
from flexinfer.core.election import Election, Member, active_lease, elect, waiting_since_of
from flexinfer.core.flashloader_settings import cache_matches_model
from flexinfer.core.loading_logs import LOG_TAIL_LINES, refine_from_log
from flexinfer.core.manifests.render import render_model
from flexinfer.core.model_status.build import (
    REASON_FIELD_IGNORED,
    REASON_VALIDATION_FAILED,
    DeploymentFacts,
    StatusInputs,
    build_status,
    failed_status,
    loading_detail,
    newest_pod,
    ready_since,
    status_patch,
    with_ignored_fields,
)
from flexinfer.core.model_status.plan import (
    ManagerPolicy,
    MemberInputs,
    MemberPlan,
    busy_proxies,
    finish_member,
    next_wakeup,
    plan_member,
    swap_source,
)
from flexinfer.core.replicas import ReplicaContext

Json = dict[str, Any]


@dataclass(frozen=True)
class StoredModel:
    """A stored Model body: the typed Model (``None`` when invalid) or its validation error, and the fields
    ignored because their stored value cannot be parsed."""

    body: Json
    model: Model | None
    error: InvalidResourceError | None = None
    ignored: tuple[FieldProblem, ...] = ()


@dataclass(frozen=True)
class CacheProblem:
    """A ModelCache of the unit's namespace whose stored fields were ignored."""

    body: Json
    cache: ModelCache
    ignored: tuple[FieldProblem, ...]


@dataclass(frozen=True)
class UnitFacts:
    """What the manager knows about one unit at ``now`` (Deployments and pods keyed by Model name)."""

    now: datetime
    models: Sequence[StoredModel]
    deployments: Mapping[str, Json] = field(default_factory=dict)
    pods: Mapping[str, Sequence[Json]] = field(default_factory=dict)
    reports: Sequence[ModelDemand] = ()
    caches: Sequence[ModelCache] = ()
    cache_problems: Sequence[CacheProblem] = ()
    group: str | None = None
    """The shared group's name; ``None`` for an exclusive Model."""
    leases: Sequence[GPULease] = ()
    decided: Election | None = None
    """The election of this reconcile's first pass, whose preemptions are written: the pass that follows a
    preemption keeps it instead of electing again over the half-written group."""


@dataclass(frozen=True)
class Rejection:
    """An invalid Model: the status patch to write (``{}``: already written) and the message naming the field."""

    body: Json
    patch: Json
    message: str
    reason: str = REASON_VALIDATION_FAILED

    @property
    def announce(self) -> bool:
        """The conditions change: post a Warning event ``ValidationFailed``."""
        return "conditions" in self.patch


@dataclass(frozen=True)
class Preemption:
    """A Ready member that loses the GPU in this pass: write ``patch`` first, then post ``message``."""

    model: Model
    patch: Json
    by: str
    message: str


@dataclass(frozen=True)
class IgnoredFields:
    """Fields ignored for a Model: ``message`` ('' when none) for it, ``own`` when some are in the Model itself
    (an API server without validation ratcheting then refuses its status writes), and one
    ``(key, body, message)`` per matching ModelCache that holds some."""

    message: str = ""
    own: bool = False
    caches: tuple[tuple[str, Json, str], ...] = ()
    reason: str = REASON_FIELD_IGNORED


@dataclass(frozen=True)
class LogRead:
    """The log tail to read: pod, container and how many lines."""

    pod: str
    container: str
    lines: int = LOG_TAIL_LINES


@dataclass(frozen=True)
class MemberAction:
    """One member's I/O for this pass. ``model`` is the Model as decided on (reports folded in)."""

    model: Model
    manifests: tuple[Json, Json]
    """The Deployment and the Service, applied in this order."""
    inputs: StatusInputs
    status: ModelStatus
    patch: Json
    ignored: IgnoredFields
    stops: bool = False
    """Its Deployment had replicas and is scaled to zero by this apply (a swap's drain ends)."""
    ready_at: datetime | None = None
    """While Ready: the Ready instant the cluster recorded (``build.ready_since``)."""
    busy: tuple[str, ...] = ()
    """Proxies reporting requests in flight for it."""
    log: LogRead | None = None
    stored: ModelStatus = field(default_factory=ModelStatus)

    def with_log(self, lines: Sequence[str]) -> MemberAction:
        """This action with the loading detail refined by the log's newest ``lines``."""
        loading = self.inputs.loading
        refined = refine_from_log(lines)
        if refined is None or loading is None:
            return self
        inputs = replace(self.inputs, loading=replace(refined, log_container=loading.log_container))
        status = _status(self.model, inputs, self.ignored)
        return replace(self, inputs=inputs, status=status, patch=status_patch(self.stored, status), log=None)


@dataclass(frozen=True)
class UnitPlan:
    """One pass over one unit (see the module docstring)."""

    now: datetime
    rejections: tuple[Rejection, ...] = ()
    declared: tuple[Model, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    members: tuple[MemberAction, ...] = ()
    wake: datetime | None = None
    election: Election | None = None
    unreadable_markers: tuple[tuple[str, str], ...] = ()
    """(Model key, annotation text) of wait markers that are not RFC 3339 times (ignored)."""


@dataclass(frozen=True)
class _Step:
    inputs: MemberInputs
    plan: MemberPlan
    stored: ModelStatus


def plan_unit(facts: UnitFacts, defaults: ControllerDefaults, policy: ManagerPolicy) -> UnitPlan:
    """The plan of one pass over the unit described by ``facts`` (see the module docstring)."""
    now = facts.now
    present = [s for s in facts.models if not (s.body.get("metadata") or {}).get("deletionTimestamp")]
    rejections = [_rejection(s.body, s.error, now) for s in present if s.error is not None]
    stored = {s.model.name: s for s in present if s.model is not None}
    models = [_projected(s.model, facts, policy) for s in stored.values() if s.model is not None]
    election = _held(facts.decided) if facts.decided else _election(models, facts, policy) if facts.group else None
    preemptions: list[Preemption] = []
    members: list[MemberAction] = []
    after: list[Model] = []
    for step in _steps(models, election, facts, policy, stored):
        model, status = step.inputs.model, None
        try:
            manifests = _manifests(model, step.plan, facts, defaults)
        except FlexInferError as error:
            rejection = _rejection(stored[model.name].body, error, now)
            rejections.append(rejection)
            status = failed_status(step.stored, model.metadata.generation, rejection.message, now)
        else:
            action = _action(step, manifests, facts, policy)
            status = action.status
            if step.plan.preempt_now:
                by = step.inputs.decision.preempted_by if step.inputs.decision else ""
                preemptions.append(Preemption(model, action.patch, by, step.plan.preempted_message))
            else:
                members.append(action)
        after.append(_projected(model.model_copy(update={"status": status}), facts, policy))
    wake = next_wakeup(after, facts.leases if facts.group else (), now, policy)
    if any(m.inputs.loading and m.inputs.loading.log_container for m in members if m.status.phase == "Loading"):
        next_read = now + timedelta(seconds=policy.log_poll_interval)
        wake = next_read if wake is None else min(wake, next_read)
    return UnitPlan(now, tuple(rejections), tuple(models), tuple(preemptions), tuple(members), wake, election,
                    _unreadable_markers(models) if facts.group is not None else ())


def _rejection(body: Json, error: FlexInferError, now: datetime) -> Rejection:
    meta = body.get("metadata") or {}
    problems = error.problems if isinstance(error, InvalidResourceError) else []
    message = "; ".join(str(p) for p in problems) or str(error)
    old = ModelStatus.model_validate(body.get("status") or {})
    return Rejection(body, status_patch(old, failed_status(old, meta.get("generation"), message, now)), message)


def _projected(model: Model, facts: UnitFacts, policy: ManagerPolicy) -> Model:
    return with_demand(model, demand_view(facts.reports, model.name, facts.now, policy.busy_ttl))


def _election(models: Sequence[Model], facts: UnitFacts, policy: ManagerPolicy) -> Election:
    """The shared group's active member (members carry the proxies' wait markers; GPULeases honoured)."""
    timeout = policy.election.default_cold_start_timeout
    members = [Member.from_model(m, waiting_since=waiting_since_of(m), default_cold_start_timeout=timeout)
               for m in models]
    lease = active_lease(facts.leases, facts.group or "", facts.now)
    return elect(members, facts.now, policy.election, lease)


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
    ctx = ReplicaContext(now=facts.now)
    by_name = {m.name: m for m in models}
    steps = []
    for model in models:
        decision = election.members.get(model.name) if election else None
        leader = by_name.get(election.leader or "") if election else None
        live = DeploymentFacts.from_body(facts.deployments.get(model.name))
        busy = bool(busy_proxies(model.metadata.annotations, facts.now, policy.busy_ttl))
        inputs = MemberInputs(model, live, decision, leader, busy=busy)
        own = stored[model.name].model
        steps.append(_Step(inputs, plan_member(inputs, ctx, policy), own.status if own else model.status))
    if election is None or election.leader is None:
        return steps
    shared = [(s.inputs.model.name, s.plan.shared) for s in steps]
    steps = [replace(s, inputs=replace(s.inputs, swap=swap_source(s.inputs.model, shared)))
             if s.inputs.model.name == election.leader else s for s in steps]
    return sorted(steps, key=lambda s: s.inputs.model.name == election.leader)


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
    finished = finish_member(step.inputs, plan, live, loading_detail(pod), facts.now)
    ignored = _ignored(model, facts)
    status = _status(model, finished.inputs, ignored)
    detail = finished.inputs.loading
    pod_name = str(((pod or {}).get("metadata") or {}).get("name") or "")
    log = None
    if finished.phase == phases.LOADING and detail is not None and detail.log_container and pod_name:
        log = LogRead(pod_name, detail.log_container)
    deployment = facts.deployments.get(model.name)
    return MemberAction(
        model, manifests, finished.inputs, status, status_patch(step.stored, status), ignored,
        stops=live is not None and live.replicas > 0 and plan.replicas == 0,
        ready_at=ready_since(pod, deployment) if status.phase == phases.READY else None,
        busy=tuple(busy_proxies(model.metadata.annotations, facts.now, policy.busy_ttl)), log=log,
        stored=step.stored)


def _status(model: Model, inputs: StatusInputs, ignored: IgnoredFields) -> ModelStatus:
    """``build_status``, with ``ConfigValid=False`` naming the fields ignored for this model (if any)."""
    status = build_status(model, inputs)
    if not ignored.message:
        return status
    return with_ignored_fields(status, ignored.message, model.metadata.generation, inputs.now)


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
