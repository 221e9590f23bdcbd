"""Reconciles one unit (an exclusive Model, or every member of a shared group): the I/O shell around
``flexinfer.core.unit_plan``.

A pass reads the unit's facts from the store (``facts``: no API read), calls ``plan_unit`` once and executes
the plan, each Model's writes in its own reconcile scope: the status patches of invalid Models (Warning event
``ValidationFailed``), the preemptions (the ``Preempted`` status, the Normal event ``Preempted``, the
preemptions counter), then per member the server-side apply of its Deployment and Service
(``flexinfer.manager.applier``), the log tail the plan asks for (``pods/log``; a crashed container's previous
run), the status patch when it changed, a Warning event named after a pod failure when it appears or its cause
changes (``Unschedulable``, ``ImagePullBackOff``, ``CrashLoopBackOff``, …), the Warning events
``InvalidFieldIgnored`` (once per distinct message; a status write refused with 422 because of such a field
says so instead) and the lifecycle observations
(``flexinfer.manager.lifecycle``, with the instant an incumbent's Deployment was scaled to zero: a swap's
drain ends). A pass that preempts does only that; the proxies' ``ModelDemand`` reports are then read
afresh from the API server (a quorum read after the ``Preempted`` write; the watch cache when it fails:
docs/design/kubernetes-proxy.md) and the follow-up pass runs at once with them and the same election. A pass
that deletes exited pods (``reap``) does only that, and is planned again at once without them: the winner they
held the device from is scaled up right after the delete, not one queued pass later.
The last pass arms the unit's timer. A group whose strategy runs it in a group pod is reconciled by
``flexinfer.manager.group_pods`` instead (and a group that no longer does has its group pod's objects deleted).
Called by the reconcile queue (``flexinfer.manager.program``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from lightkube import ApiError

from flexinfer.api.conventions import WAITING_SINCE_ANNOTATION
from flexinfer.api.model import Model
from flexinfer.api.modeldemand import ModelDemand
from flexinfer.core.controller_defaults import ControllerDefaults
from flexinfer.core.manifests.group_pod import group_pod_name
from flexinfer.core.model_status.plan import ManagerPolicy
from flexinfer.core.unit_actions import IgnoredFields, MemberAction, Preemption, Rejection, UnitPlan
from flexinfer.core.unit_facts import CacheProblem, StoredModel, UnitFacts
from flexinfer.core.unit_plan import plan_unit
from flexinfer.manager.applier import Applier
from flexinfer.manager.client import KubeApi
from flexinfer.manager.group_pods import GroupPods
from flexinfer.manager.lifecycle import LifecycleTracker, PassFacts
from flexinfer.manager.memory_report import MemoryReport
from flexinfer.manager.pod_prober import PodProber
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


class Reconciler:
    """See the module docstring. ``wake`` arms the unit's timer (wall-clock instant)."""

    def __init__(self, api: KubeApi, store: Store, defaults: ControllerDefaults, policy: ManagerPolicy, *,
                 sink: LifecycleObserver, scope: ReconcileScope, wake: Callable[[Unit, datetime], None],
                 clock: Callable[[], datetime] = utcnow) -> None:
        self._api, self._store, self._defaults, self._policy = api, store, defaults, policy
        self._scope, self._wake, self._clock = scope, wake, clock
        self.applier = Applier(api, store)
        self.lifecycle = LifecycleTracker(sink)
        self.memory = MemoryReport()
        self.prober: PodProber[Unit] = PodProber(lambda unit: wake(unit, clock()), clock)
        self.group_pods = GroupPods(api, store, self.applier, defaults=defaults, policy=policy, sink=sink,
                                    wake=lambda unit: wake(unit, clock()))
        self._bad_markers: dict[str, str] = {}
        self._reported_ignored: dict[str, str] = {}

    async def reconcile(self, unit: Unit) -> None:
        now = self._clock()
        facts = self.facts(unit, now)
        if self.group_pods.owns(unit):
            wake = await self.group_pods.reconcile(unit, facts, reject=self._reject, patch=self._patch,
                                                   scope=self._scope, declared=self.lifecycle.declared)
            if wake is not None:
                self._wake(unit, wake)
            return
        if unit.group:
            await self.group_pods.retire(unit)
        if self._policy.pod_endpoints:
            self.prober.track(unit, (p for bodies in facts.pods.values() for p in bodies))
            if await self.prober.first_answers(unit):  # a server already up is Ready in this pass
                now = self._clock()
                facts = self.facts(unit, now)
        plan = plan_unit(facts, self._defaults, self._policy)
        if plan.reap and not plan.preemptions:  # the members were decided with those pods holding the device
            await self._execute(replace(plan, members=()))
            now = self._clock()
            plan = plan_unit(self.facts(unit, now), self._defaults, self._policy)
        await self._execute(plan)
        if unit.group:
            self._record_memory(unit, plan)
        if plan.preemptions:
            reports = await self._fresh_reports(unit.namespace)
            draining = {p.model.name for p in plan.preemptions}
            facts = replace(self.facts(unit, now, reports), decided=plan.election)
            plan = plan_unit(facts, self._defaults, self._policy)
            await self._execute(plan, draining)
        if plan.wake is not None:
            self._wake(unit, plan.wake)

    def _record_memory(self, unit: Unit, plan: UnitPlan) -> None:
        """The group's memory figures for ``/metrics``; each member evicted (for room, or after another's start ran
        out of memory) counted once."""
        self.memory.record(unit.namespace, unit.name, plan.election)
        memory = plan.election.memory if plan.election is not None else None
        if memory is None:
            return
        for preemption in plan.preemptions:
            if preemption.model.name in memory.evicted:
                self.memory.evicted(unit.namespace, unit.name)
            elif preemption.model.name in memory.evicted_for_oom:
                self.memory.evicted(unit.namespace, unit.name, "out_of_memory")

    def facts(self, unit: Unit, now: datetime, reports: Sequence[ModelDemand] | None = None) -> UnitFacts:
        """The unit's facts from the store (the proxies' reports from ``reports`` when given)."""
        ns, parsed = unit.namespace, self._store.unit_models(unit)
        names = [m.name for m in (p.model for p in parsed) if m is not None]
        deployments = {n: d for n in names if (d := self._store.deployment(ns, n)) is not None}
        pods = {n: list(self._store.pods(ns, n)) for n in names}
        if unit.group and (held := list(self._store.pods(ns, group_pod_name(unit.name)))):
            pods[group_pod_name(unit.name)] = held  # a group pod still holds the device (back to Exclusive)
        return UnitFacts(
            now=now, models=[StoredModel(p.body, p.model, p.error, p.ignored) for p in parsed],
            deployments=deployments, pods=pods, ready_seen=self._ready_seen(ns, deployments, pods),
            answered=self.prober.answered(p for bodies in pods.values() for p in bodies),
            pods_gone_at={n: gone for n in names if (gone := self._store.pods_gone_at(ns, n)) is not None},
            reports=self._store.demands(ns) if reports is None else reports, caches=self._store.caches(ns),
            cache_problems=[CacheProblem(*c) for c in self._store.cache_problems(ns)],
            group=unit.name if unit.group else None,
            leases=self._store.leases(ns, unit.name) if unit.group else ())

    def _ready_seen(self, namespace: str, deployments: Mapping[str, Body],
                    pods: Mapping[str, Sequence[Body]]) -> dict[tuple[str, str], datetime]:
        """When the watch showed each of these Deployments and pods turn Ready, for those it saw do so live."""
        names = [("Deployment", n) for n in deployments]
        names += [("Pod", str((p.get("metadata") or {}).get("name") or "")) for bodies in pods.values() for p in bodies]
        return {(kind, name): seen for kind, name in names
                if (seen := self._store.ready_seen(kind, namespace, name)) is not None}

    async def _execute(self, plan: UnitPlan, draining: Set[str] = frozenset()) -> None:
        for rejection in plan.rejections:
            await self._reject(rejection)
        for model in plan.declared:
            self.lifecycle.declared(model)
        for key, text in plan.unreadable_markers:
            if self._bad_markers.get(key) != text:
                self._bad_markers[key] = text
                log.warning("model %s: ignoring annotation %s=%r (not an RFC 3339 time)",
                            key, WAITING_SINCE_ANNOTATION, text)
        for preemption in plan.preemptions:
            await self._preempt(preemption)
        for namespace, pod in plan.reap:
            if await self._api.delete("Pod", namespace, pod, grace_period=0):
                log.info("pod %s/%s: its containers have exited; deleted now so the GPU goes to the next model",
                         namespace, pod)
            self._store.forget_pod(namespace, pod)  # gone at once: the pass planned right after scales the winner up
        # A member whose Deployment is scaled (up or down) goes first: its write is what the swap or the cold start
        # waits for; the others' status writes can follow it.
        for action in sorted(plan.members, key=lambda member: not self._scales(member)):
            if action.model.name in draining and action.busy:
                log.info("model %s drains in-flight requests of %s", action.model.key, ", ".join(action.busy))
            await self._member(action, plan.now)

    def _scales(self, action: MemberAction) -> bool:
        """This pass creates the member's Deployment or changes its replicas (read from the store: no rendering
        compared, no digest)."""
        deployment = action.manifests[0]
        live = self._store.live("Deployment", action.model.namespace, deployment["metadata"]["name"])
        return live is None or (live.get("spec") or {}).get("replicas") != deployment["spec"].get("replicas")

    # ---------------------------------------------------------------- writes

    async def _preempt(self, preemption: Preemption) -> None:
        """Mark the loser Preempted before its replicas are decided (the next pass decides its drain)."""
        model = preemption.model
        async with self._scope("model", model.namespace, model.name):
            body = await self._patch(model, preemption.patch) if preemption.patch else self._store_body(model)
            self.lifecycle.preempted(model, preemption.by)
            self._api.record_event(body, "Normal", "Preempted", preemption.message)  # not on the swap's path
            log.info("model %s preempted: %s", model.key, preemption.message)

    async def _fresh_reports(self, namespace: str) -> list[ModelDemand] | None:
        """The ``ModelDemand`` reports of ``namespace`` read from the API server now (a quorum read); ``None``
        (the store's are used) when the read fails (logged)."""
        bodies = await self._api.list_demands(namespace)
        if bodies is None:
            log.warning("namespace %s: cannot read the proxy reports; using the watch cache", namespace)
            return None
        reports = []
        for body in bodies:
            try:
                reports.append(ModelDemand.model_validate(body))
            except ValueError:
                continue
        return reports

    async def _member(self, action: MemberAction, now: datetime) -> None:
        """Apply the member's manifests, read the log the plan asks for, write its status, observe it."""
        model = action.model
        async with self._scope("model", model.namespace, model.name):
            deployment, service = action.manifests
            await self.applier.apply(deployment)
            stopped_at = self._clock() if action.stops else None
            await self.applier.apply(service)
            if action.log is not None:
                read = action.log
                action = action.with_log(await self._api.pod_log_tail(model.namespace, read.pod, read.container,
                                                                      read.lines, previous=read.previous))
            try:
                body = await self._patch(model, action.patch) if action.patch else self._store_body(model)
            except ApiError as error:
                if error.status.code != INVALID or not action.ignored.own:
                    raise
                # Before Kubernetes 1.28 (no validation ratcheting) a status write re-validates the whole stored
                # object, so a Model whose stored spec breaks the current schema cannot get any status: say so once.
                await self._report_ignored(model, action.ignored, self._store_body(model), STATUS_REFUSED)
                return
            await self._report_ignored(model, action.ignored, body)
            if action.announce and action.failure is not None:
                await self._api.post_event(body, "Warning", action.failure.reason, action.failure.message)
            self.lifecycle.observe(model, action.status, now, PassFacts(stopped_at, action.ready_at, action.ready_seen))

    async def _report_ignored(self, model: Model, ignored: IgnoredFields, body: Body, note: str = "") -> None:
        """A Warning event on the Model and on each ModelCache concerned, once per distinct message."""
        message = ignored.message + note
        if self._reported_ignored.get(model.key, "") == message:
            return
        self._reported_ignored[model.key] = message
        if not message:
            return
        log.warning("model %s: %s", model.key, message)
        await self._api.post_event(body, "Warning", ignored.reason, message)
        for key, cache_body, text in ignored.caches:
            if self._reported_ignored.get(key) != text:
                self._reported_ignored[key] = text
                await self._api.post_event(cache_body, "Warning", ignored.reason, text)

    async def _patch(self, model: Model, patch: Body) -> Body:
        body = await self._api.patch_model_status(model.namespace, model.name, patch)
        self._store.put("Model", body)
        return body

    def _store_body(self, model: Model) -> Body:
        parsed = self._store.model(model.namespace, model.name)
        return parsed.body if parsed is not None else {}

    async def _reject(self, rejection: Rejection) -> None:
        """Phase Failed + ``ConfigValid=False``; a Warning event each time the message changes."""
        if not rejection.patch:
            return
        meta = rejection.body.get("metadata") or {}
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        async with self._scope("model", namespace, name):
            updated = await self._api.patch_model_status(namespace, name, rejection.patch)
            self._store.put("Model", updated)
            if rejection.announce:
                await self._api.post_event(updated, "Warning", rejection.reason, rejection.message)
                log.warning("model %s/%s is invalid: %s", namespace, name, rejection.message)
        self.lifecycle.failed(namespace, name)

    def forget(self, model: Model | None, namespace: str, name: str) -> None:
        self.applier.forget(namespace, name)
        self.lifecycle.forget(model, namespace, name)
