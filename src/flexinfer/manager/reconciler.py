"""Reconciles one unit (an exclusive Model, or every member of a shared group) from the store.

Per pass: validate (invalid → phase Failed, ``ConfigValid=False``, Warning event, nothing rendered; a stored
quantity or duration that cannot be parsed, in the Model or a matching ModelCache, is only ignored: the model
runs with the next setting, ``ConfigValid=False`` reason ``InvalidFieldIgnored`` and a Warning event name it);
fold the proxies' ``ModelDemand`` reports into each Model (``flexinfer.core.demand_view``: demand, wait
marker, in-flight reports); elect the group's active member (``flexinfer.core.election``, GPULeases
honoured, the wait markers feeding the starvation bound); per member, plan replicas
(``flexinfer.core.model_status.plan``), write a preemption first (Preempted status, Normal event
``Preempted``, preemptions counter) and re-check in-flight reports with a fresh read of the reports
after that write (docs/design/kubernetes-proxy.md), apply the
rendered Deployment + Service (``flexinfer.manager.applier``), derive the status from the applied Deployment
and the newest pod (while its server or flash-loader runs but is not ready, refined from its log tail:
``flexinfer.core.loading_logs``) and write it only when it changed; observe lifecycle metrics on
transitions (with the pass's facts: an incumbent scaled to zero ends a swap's drain; the pod's Ready
condition time is the Ready instant); finally arm a timer for the next time-driven change (and the next
log read while a server loads). Called by the reconcile queue (``flexinfer.manager.program``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from lightkube import ApiError

from flexinfer.api.conventions import ACTIVE_SERVICES_ANNOTATION, WAITING_SINCE_ANNOTATION
from flexinfer.api.errors import FlexInferError, InvalidResourceError
from flexinfer.api.loading import validate_stored
from flexinfer.api.model import Model, ModelStatus
from flexinfer.api.modeldemand import ModelDemand
from flexinfer.core.controller_defaults import ControllerDefaults
from flexinfer.core.demand_view import demand_view, with_demand
from flexinfer.core.election import (
    Election,
    Member,
    active_lease,
    elect,
    waiting_since_of,
)
from flexinfer.core.flashloader_settings import cache_matches_model
from flexinfer.core.loading_logs import LOG_TAIL_LINES, refine_from_log
from flexinfer.core.manifests.render import render_model
from flexinfer.core.model_status.build import (
    REASON_FIELD_IGNORED,
    DeploymentFacts,
    LoadingDetail,
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
from flexinfer.core.phases import READY
from flexinfer.core.replicas import ReplicaContext
from flexinfer.manager.applier import Applier
from flexinfer.manager.client import KubeApi
from flexinfer.manager.lifecycle import LifecycleTracker, PassFacts
from flexinfer.manager.ports import ReconcileScope
from flexinfer.manager.store import Store, Unit
from flexinfer.runtime.observer import LifecycleObserver

log = logging.getLogger("flexinfer.manager")
Body = dict[str, Any]
INVALID = 422
STATUS_REFUSED = (". The API server refuses status updates of this Model until the field is fixed: the stored value "
                  "no longer matches the CRD schema")


def utcnow() -> datetime:
    return datetime.now(UTC)


def _deleting(body: Body) -> bool:
    return bool((body.get("metadata") or {}).get("deletionTimestamp"))


@dataclass(frozen=True)
class Step:
    """One member's inputs and plan for this pass."""

    inputs: MemberInputs
    plan: MemberPlan


class Reconciler:
    """See the module docstring. ``wake`` arms the unit's timer (wall-clock instant)."""

    def __init__(self, api: KubeApi, store: Store, defaults: ControllerDefaults, policy: ManagerPolicy, *,
                 sink: LifecycleObserver, scope: ReconcileScope, wake: Callable[[Unit, datetime], None],
                 clock: Callable[[], datetime] = utcnow) -> None:
        self._api, self._store, self._defaults, self._policy = api, store, defaults, policy
        self._scope, self._wake, self._clock = scope, wake, clock
        self.applier = Applier(api, store)
        self.lifecycle = LifecycleTracker(sink)
        self._bad_markers: dict[str, str] = {}
        self._reported_ignored: dict[str, str] = {}

    async def reconcile(self, unit: Unit) -> None:
        now = self._clock()
        parsed = [p for p in self._store.unit_models(unit) if not _deleting(p.body)]
        for item in parsed:
            if item.error is not None:
                await self._invalid(item.body, item.error, now)
        models = [self._projected(p.model, now) for p in parsed if p.model is not None]
        for model in models:
            self.lifecycle.declared(model)
        steps = self._plan(unit, models, now)
        reading_logs = False
        for step in steps:
            reading_logs |= await self._member(step, now)
        current = [self._projected(p.model, now) for p in self._store.unit_models(unit)
                   if p.model is not None and not _deleting(p.body)]
        leases = self._store.leases(unit.namespace) if unit.group else []
        wake = next_wakeup(current, leases, now, self._policy)
        if reading_logs:
            next_read = now + timedelta(seconds=self._policy.log_poll_interval)
            wake = next_read if wake is None else min(wake, next_read)
        if wake is not None:
            self._wake(unit, wake)

    # ---------------------------------------------------------------- planning (pure calls)

    def _plan(self, unit: Unit, models: list[Model], now: datetime) -> list[Step]:
        ctx = ReplicaContext(now=now)
        election = self.election(unit, models, now) if unit.group else None
        by_name = {m.name: m for m in models}
        steps = []
        for model in models:
            decision = election.members.get(model.name) if election else None
            leader = by_name.get(election.leader or "") if election else None
            live = DeploymentFacts.from_body(self._store.deployment(model.namespace, model.name))
            busy = bool(busy_proxies(model.metadata.annotations, now, self._policy.busy_ttl))
            inputs = MemberInputs(model, live, decision, leader, busy=busy)
            steps.append(Step(inputs, plan_member(inputs, ctx, self._policy)))
        if election is not None and election.leader is not None:
            steps = self._with_swap(steps, election)
        return steps

    def _projected(self, model: Model, now: datetime, reports: list[ModelDemand] | None = None) -> Model:
        """``model`` with the proxies' reports folded in (the store's, or ``reports`` when given)."""
        found = self._store.demands(model.namespace) if reports is None else reports
        return with_demand(model, demand_view(found, model.name, now, self._policy.busy_ttl))

    def election(self, unit: Unit, models: list[Model], now: datetime) -> Election:
        """Elect the shared group's active member (members carry the proxies' wait markers)."""
        timeout = self._policy.election.default_cold_start_timeout
        members = [Member.from_model(m, waiting_since=self.waiting_since(m), default_cold_start_timeout=timeout)
                   for m in models]
        lease = active_lease(self._store.leases(unit.namespace), unit.name, now)
        return elect(members, now, self._policy.election, lease)

    def waiting_since(self, model: Model) -> datetime | None:
        """The proxy's wait marker (starvation bound); an unparsable one is ignored, logged once per value."""
        marker = waiting_since_of(model)
        text = model.metadata.annotations.get(WAITING_SINCE_ANNOTATION)
        if marker is None and text is not None and self._bad_markers.get(model.key) != text:
            self._bad_markers[model.key] = text
            log.warning("model %s: ignoring annotation %s=%r (not an RFC 3339 time)",
                        model.key, WAITING_SINCE_ANNOTATION, text)
        return marker

    @staticmethod
    def _with_swap(steps: list[Step], election: Election) -> list[Step]:
        shared = [(s.inputs.model.name, s.plan.shared) for s in steps]
        out = [replace(s, inputs=replace(s.inputs, swap=swap_source(s.inputs.model, shared)))
               if s.inputs.model.name == election.leader else s for s in steps]
        # Losers first: the incumbent is marked Preempted before the winner is scaled up.
        return sorted(out, key=lambda s: s.inputs.model.name == election.leader)

    def _stored_status(self, model: Model) -> ModelStatus:
        """The status as stored (``model`` may carry the proxies' reports folded in), validated once by the store."""
        parsed = self._store.model(model.namespace, model.name)
        return parsed.model.status if parsed is not None and parsed.model is not None else model.status

    def _store_body(self, model: Model) -> Body:
        parsed = self._store.model(model.namespace, model.name)
        return parsed.body if parsed is not None else {}

    # ---------------------------------------------------------------- one member (I/O)

    async def _member(self, step: Step, now: datetime) -> bool:
        """Apply and write one member; True while its loading substage comes from its server's log."""
        model = step.inputs.model
        async with self._scope("model", model.namespace, model.name):
            try:
                rendered = self._render(model, step.plan)
            except FlexInferError as error:
                await self._invalid(self._store_body(model), error, now)
                return False
            if step.plan.preempt_now:
                step, model = await self._preempt(step, now)
                rendered = self._render(model, step.plan)
            deployment = await self.applier.apply(rendered[0])
            applied_at = self._clock()
            await self.applier.apply(rendered[1])
            return await self._write_status(step, model, deployment, now, applied_at)

    def _render(self, model: Model, plan: MemberPlan) -> list[Body]:
        caches = self._store.caches(model.namespace)
        deployment, service = render_model(model, caches, self._defaults, plan.replicas)
        if plan.shared is not None:
            active = ",".join(model.spec.service_labels) if plan.shared.state == "Active" else ""
            service["metadata"].setdefault("annotations", {})[ACTIVE_SERVICES_ANNOTATION] = active
        return [deployment, service]

    async def _preempt(self, step: Step, now: datetime) -> tuple[Step, Model]:
        """Mark the loser Preempted before touching replicas, then read the proxies' reports afresh from
        the API server: a proxy confirms the model is still Ready only after its in-flight report landed,
        so every request forwarded before this write is either in that read or refused by its proxy
        (docs/design/kubernetes-proxy.md)."""
        model, plan = step.inputs.model, step.plan
        finished = finish_member(step.inputs, plan, step.inputs.deployment, None, now)
        body = await self._patch(model, status_patch(model.status, self._status(model, finished.inputs, now)))
        to = step.inputs.decision.preempted_by if step.inputs.decision else ""
        self.lifecycle.preempted(model, to)
        await self._api.post_event(body, "Normal", "Preempted", plan.preempted_message)
        log.info("model %s preempted: %s", model.key, plan.preempted_message)
        updated = self._projected(self._model_from(body, model), now, await self._fresh_reports(model))
        busy = busy_proxies(updated.metadata.annotations, now, self._policy.busy_ttl)
        if busy:
            log.info("model %s drains in-flight requests of %s", model.key, ", ".join(busy))
        inputs = replace(step.inputs, model=updated, busy=bool(busy))
        return Step(inputs, plan_member(inputs, ReplicaContext(now=now), self._policy)), updated

    async def _fresh_reports(self, model: Model) -> list[ModelDemand] | None:
        """The ``ModelDemand`` reports of the model's namespace read from the API server now (a quorum
        read); the store's when the read fails (logged)."""
        bodies = await self._api.list_demands(model.namespace)
        if bodies is None:
            log.warning("model %s: cannot read the proxy reports; using the watch cache", model.key)
            return None
        reports = []
        for body in bodies:
            try:
                reports.append(ModelDemand.model_validate(body))
            except ValueError:
                continue
        return reports

    async def _write_status(self, step: Step, model: Model, deployment: Body, now: datetime,
                            applied_at: datetime) -> bool:
        applied = DeploymentFacts.from_body(deployment)
        pod = newest_pod(self._store.pods(model.namespace, model.name))
        inputs, detail = replace(step.inputs, model=model), loading_detail(pod)
        finished = finish_member(inputs, step.plan, applied, detail, now)
        reading_log = finished.phase == "Loading" and detail is not None and detail.log_container is not None
        if reading_log and pod is not None and detail is not None:
            detail = await self._from_log(model, pod, detail)
            finished = finish_member(inputs, step.plan, applied, detail, now)
        status = self._status(model, finished.inputs, now)
        patch = status_patch(self._stored_status(model), status)
        try:
            body = await self._patch(model, patch) if patch else self._store_body(model)
        except ApiError as error:
            if error.status.code != INVALID or not self._own_ignored(model):
                raise
            # Before Kubernetes 1.28 (no validation ratcheting) a status write re-validates the whole stored
            # object, so a Model whose stored spec breaks the current schema cannot get any status: say so once.
            await self._report_ignored(model, self._store_body(model), STATUS_REFUSED)
            return False
        await self._report_ignored(model, body)
        live = step.inputs.deployment
        stopped = live is not None and live.replicas > 0 and step.plan.replicas == 0
        facts = PassFacts(stopped_at=applied_at if stopped else None,
                          ready_condition_at=ready_since(pod, deployment) if status.phase == READY else None)
        self.lifecycle.observe(model, status, now, facts)
        return reading_log

    # ---------------------------------------------------------------- fields ignored in stored objects

    def _status(self, model: Model, inputs: StatusInputs, now: datetime) -> ModelStatus:
        """``build_status``, with ``ConfigValid=False`` naming the fields ignored for this model (if any)."""
        status = build_status(model, inputs)
        ignored = self._ignored_fields(model)
        return with_ignored_fields(status, ignored, model.metadata.generation, now) if ignored else status

    def _own_ignored(self, model: Model) -> bool:
        parsed = self._store.model(model.namespace, model.name)
        return parsed is not None and bool(parsed.ignored)

    def _ignored_fields(self, model: Model) -> str:
        """The unparsable stored fields of the Model and of the ModelCaches that match it, one message."""
        parsed = self._store.model(model.namespace, model.name)
        parts = [f"{p.path}: {p.message}" for p in (parsed.ignored if parsed is not None else ())]
        for _, cache, ignored in self._store.cache_problems(model.namespace):
            if cache_matches_model(cache, model):
                parts += [f"ModelCache {cache.name} {p.path}: {p.message}" for p in ignored]
        return f"ignored (the next setting applies): {'; '.join(parts)}" if parts else ""

    async def _report_ignored(self, model: Model, body: Body, note: str = "") -> None:
        """A Warning event on the Model and on each ModelCache concerned, once per distinct message."""
        message = self._ignored_fields(model) + note
        if self._reported_ignored.get(model.key, "") == message:
            return
        self._reported_ignored[model.key] = message
        if not message:
            return
        log.warning("model %s: %s", model.key, message)
        await self._api.post_event(body, "Warning", REASON_FIELD_IGNORED, message)
        for cache_body, cache, ignored in self._store.cache_problems(model.namespace):
            key = f"cache:{cache.key}"
            text = "; ".join(f"{p.path}: {p.message}" for p in ignored) + " (ignored; fix the field)"
            if cache_matches_model(cache, model) and self._reported_ignored.get(key) != text:
                self._reported_ignored[key] = text
                await self._api.post_event(cache_body, "Warning", REASON_FIELD_IGNORED, text)

    async def _from_log(self, model: Model, pod: Mapping[str, Any], detail: LoadingDetail) -> LoadingDetail:
        """``detail`` refined by the newest lines of the running-but-unready container's log."""
        pod_name = str((pod.get("metadata") or {}).get("name") or "")
        if not pod_name or detail.log_container is None:
            return detail
        lines = await self._api.pod_log_tail(model.namespace, pod_name, detail.log_container, LOG_TAIL_LINES)
        refined = refine_from_log(lines)
        return detail if refined is None else replace(refined, log_container=detail.log_container)

    async def _patch(self, model: Model, patch: Body) -> Body:
        body = await self._api.patch_model_status(model.namespace, model.name, patch)
        self._store.put("Model", body)
        return body

    @staticmethod
    def _model_from(body: Body, fallback: Model) -> Model:
        try:
            model, _, _ = validate_stored(Model, body)
        except ValueError:
            return fallback
        return model

    async def _invalid(self, body: Body, error: FlexInferError, now: datetime) -> None:
        """Phase Failed + ``ConfigValid=False``; a Warning event each time the message changes."""
        meta = body.get("metadata") or {}
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        problems = error.problems if isinstance(error, InvalidResourceError) else []
        message = "; ".join(str(p) for p in problems) or str(error)
        old = ModelStatus.model_validate(body.get("status") or {})
        patch = status_patch(old, failed_status(old, meta.get("generation"), message, now))
        if not patch:
            return
        async with self._scope("model", namespace, name):
            updated = await self._api.patch_model_status(namespace, name, patch)
            self._store.put("Model", updated)
            if "conditions" in patch:
                await self._api.post_event(updated, "Warning", "ValidationFailed", message)
                log.warning("model %s/%s is invalid: %s", namespace, name, message)
        self.lifecycle.failed(namespace, name)

    def forget(self, model: Model | None, namespace: str, name: str) -> None:
        self.applier.forget(namespace, name)
        self.lifecycle.forget(model, namespace, name)
