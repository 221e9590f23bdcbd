"""One reconcile pass over a shared group that runs in a group pod (``TimeSliced``/``MemoryShared``), planned
without I/O.

The group pod (``flexinfer.core.manifests.group_pod``) holds the group's GPU and runs ``flexinfer serve`` over
the members; its local engine swaps and packs them. The manager's part, decided here:

- ``rejections``: members that fail validation, or that cannot run in the group pod (another image, a source
  the pod cannot read: ``group_members_problems``) — phase ``Failed``, ``ConfigValid=False`` naming the member
  and the rule; they are left out of the pod's manifests;
- ``objects``: the ConfigMap (the members' manifests), Deployment and Service of the group pod, with ``replicas``
  1 while any member is wanted (not serverless, pinned by ``minReplicas``/warm primary, a request waits or runs
  for it, its last request is younger than its idle timeout, or the pod runs, loads or queues it) and 0 once
  none is (scale to zero; the next request's demand brings the pod back, a cold start). While a member's own
  pod from ``Exclusive`` mode, or the previous group pod (scaled to zero, still terminating), holds the device,
  the group pod waits at 0 (no Pending on the device, no scheduler back-off; a terminating group pod whose
  containers have exited is ``reap``ed at once);
  ``retire`` lists those members' own Deployments and Services to delete;
- ``members``: each member's status mirrored from the pod's report (``flexinfer.core.group_pod_report``):
  its phase there, ``Failed`` with the pod's last error; before the pod answers, ``Loading`` for the members
  wanted (``Failed`` with the pod's own failure, e.g. an image that cannot be pulled) and ``Idle`` for the
  others. ``status.endpoint`` is the group Service; while the pod answers, ``sharedGroup.groupEndpoint`` (the
  pod's own URL, or the Service with pod endpoints off) is where proxies forward in any phase but Failed;
- ``push``: the pod runs another revision of the manifests than this pass renders (the manager sends them);
- ``wake``: the next instant time alone changes a wanted member's inputs (``next_wakeup``: its idle timeout
  ending, counted as the replica rule counts it, a proxy's in-flight report going stale, ...; the pod may then
  scale to zero), or a released device settling.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flexinfer.api.model import Model, ModelStatus, SharedGroupStatus
from flexinfer.api.modelcache import ModelCache
from flexinfer.core import phases
from flexinfer.core.controller_defaults import ControllerDefaults
from flexinfer.core.demand_view import demand_view, with_demand
from flexinfer.core.device_handover import holds_device, reapable
from flexinfer.core.election import waiting_since_of
from flexinfer.core.errors import ConfigError
from flexinfer.core.flashloader_settings import cache_matches_model
from flexinfer.core.gpu_profiles import UNLIMITED, group_budget
from flexinfer.core.group_pod_report import MemberReport, PodReport
from flexinfer.core.group_strategy import MEMORY_SHARED
from flexinfer.core.manifest_revision import manifest_revision
from flexinfer.core.manifests.group_pod import (
    GROUP_POD_PORT,
    GroupPodPlan,
    group_manifest_text,
    group_members_problems,
    group_pod_name,
    render_group_pod,
)
from flexinfer.core.model_status.build import (
    LoadingDetail,
    StatusInputs,
    build_status,
    loading_detail,
    newest_pod,
    placed_on,
    status_patch,
)
from flexinfer.core.model_status.plan import ManagerPolicy, busy_proxies, next_wakeup
from flexinfer.core.model_status.pod_failure import (
    PodFailure,
    device_held_by_group,
    device_settles_at,
    pod_failure,
    shown_failure,
)
from flexinfer.core.replicas import desired_replicas
from flexinfer.core.unit_actions import Rejection
from flexinfer.core.unit_facts import UnitFacts
from flexinfer.core.unit_plan import rejection

Json = dict[str, Any]
RUNNING = frozenset({phases.PENDING, phases.LOADING, phases.READY})
"""Member phases in the pod's report that keep the pod wanted."""
REASON_GROUP_POD = "GroupPodFailed"


@dataclass(frozen=True)
class GroupPodFacts:
    """The unit's stored facts plus the group pod's objects and its last report."""

    unit: UnitFacts
    namespace: str
    strategy: str
    deployment: Json | None
    """The group pod's Deployment as stored."""
    pods: Sequence[Json]
    """The group pod's pods as stored."""
    report: PodReport | None
    """The pod's last answer (``None``: no pod answers now)."""
    token_secret: str
    """The Secret holding the pod's admin token."""
    gone_at: datetime | None = None
    """When a group pod was last seen deleted (``None``: not since the manager started)."""


@dataclass(frozen=True)
class MemberMirror:
    """A member's status for this pass and the merge patch that writes it (``{}``: unchanged)."""

    model: Model
    status: ModelStatus
    patch: Json
    failure: tuple[str, str] | None = None


@dataclass(frozen=True)
class GroupPodPass:
    """What the reconciler executes (see the module docstring)."""

    now: datetime
    name: str
    rejections: tuple[Rejection, ...]
    declared: tuple[Model, ...]
    objects: tuple[Json, ...]
    """ConfigMap, Deployment, Service; empty when no member is left (the objects are deleted)."""
    replicas: int
    manifest: str
    revision: str
    push: bool
    members: tuple[MemberMirror, ...]
    retire: tuple[str, ...]
    """Members whose own (``Exclusive`` mode) Deployment and Service are deleted."""
    wanted: tuple[str, ...]
    """The members that want the pod up now (their demand brings it back from zero)."""
    wake: datetime | None
    reap: tuple[tuple[str, str], ...] = ()
    """(namespace, name) of terminating group pods whose containers have all exited: deleted at once (grace
    period 0) so the next group pod gets the device without waiting for the kubelet."""
    held_by: tuple[str, ...] = ()
    """While members want the pod and it stays at zero: the pods that still hold the device (members' own pods
    from ``Exclusive`` mode, a terminating group pod), for the manager's log."""


def plan_group_pod(facts: GroupPodFacts, defaults: ControllerDefaults, policy: ManagerPolicy) -> GroupPodPass:
    """The plan of one pass over a group that runs in a group pod (see the module docstring)."""
    unit, now = facts.unit, facts.unit.now
    group = unit.group or ""
    present = [s for s in unit.models if not (s.body.get("metadata") or {}).get("deletionTimestamp")]
    rejections = [rejection(s.body, s.error, now) for s in present if s.error is not None]
    bodies = {s.model.name: s.body for s in present if s.model is not None}
    models = [with_demand(s.model, demand_view(unit.reports, s.model.name, now, policy.busy_ttl))
              for s in present if s.model is not None]
    _, problems = group_members_problems(models, defaults)
    rejections += [rejection(bodies[name], ConfigError(message), now) for name, message in sorted(problems.items())]
    members = sorted((m for m in models if m.name not in problems), key=lambda m: m.name)
    name = group_pod_name(group)
    own_pods = [p for n in bodies for p in unit.pods.get(n, ()) if holds_device(p)]  # from Exclusive mode
    wanted = {m.name for m in members if _wanted(m, facts, policy)}
    terminating = [p for p in facts.pods if (p.get("metadata") or {}).get("deletionTimestamp") and holds_device(p)]
    scaled = int(((facts.deployment or {}).get("spec") or {}).get("replicas") or 0)
    # From zero, a new group pod is made only once the last one is gone (no Pending on the device, no back-off).
    replicas = 1 if wanted and not own_pods and (scaled > 0 or not terminating) else 0
    plan = GroupPodPlan(namespace=facts.namespace, group=group, strategy=facts.strategy, replicas=replicas,
                        budget_mib=_budget(facts.strategy, members, policy), token_secret=facts.token_secret,
                        drain_timeout_s=policy.drain_timeout, env=policy.group_pod_env)
    caches = caches_of(members, unit.caches)
    text = group_manifest_text(plan, members, caches) if members else ""
    objects = tuple(render_group_pod(plan, members, caches, defaults)) if members else ()
    revision = manifest_revision(text.encode())
    report = facts.report
    stored = {s.model.name: s.model.status for s in present if s.model is not None}
    mirrors = tuple(_mirror(m, stored[m.name], facts, policy, name=name, starting=m.name in wanted and replicas > 0)
                    for m in members)
    return GroupPodPass(
        now=now, name=name, rejections=tuple(rejections), declared=tuple(members), objects=objects,
        replicas=replicas, manifest=text, revision=revision,
        push=bool(members) and report is not None and report.revision != revision, members=mirrors,
        retire=tuple(sorted(n for n in bodies if n in unit.deployments)), wanted=tuple(sorted(wanted)),
        wake=_earliest(next_wakeup([m for m in members if m.name in wanted], (), now, policy),
                       device_settles_at({name: facts.gone_at} if facts.gone_at else {}, now)),
        reap=reapable({name}, {name: terminating}),
        held_by=tuple(sorted(_pod_names(own_pods + ([] if scaled > 0 else terminating))))
        if wanted and not replicas else ())


def _pod_names(pods: Sequence[Json]) -> list[str]:
    return [str((p.get("metadata") or {}).get("name") or "") for p in pods]


def _budget(strategy: str, members: Sequence[Model], policy: ManagerPolicy) -> float | None:
    """``MemoryShared``: the budget a GPU profile gives (``None``: ask the GPU in the pod; no limit counts as
    that too, the device's memory being the real limit)."""
    if strategy != MEMORY_SHARED or not members:
        return None
    budget = group_budget(policy.gpu_profiles, members)
    return None if budget is None or budget == UNLIMITED else budget


def _reported(model: Model, report: PodReport | None) -> MemberReport | None:
    return report.members.get(model.key) if report is not None else None


def _wanted(model: Model, facts: GroupPodFacts, policy: ManagerPolicy) -> bool:
    """The member keeps (or brings back) the group pod (see the module docstring)."""
    now = facts.unit.now
    reported = _reported(model, facts.report)
    if reported is not None and (reported.phase in RUNNING or reported.busy):
        return True
    busy = bool(busy_proxies(model.metadata.annotations, now, policy.busy_ttl)) or waiting_since_of(model) is not None
    standalone = model.model_copy(update={"status": model.status.model_copy(update={"shared_group": None})})
    return desired_replicas(standalone, now, in_flight=busy) > 0


def _mirror(model: Model, stored: ModelStatus, facts: GroupPodFacts, policy: ManagerPolicy, *, name: str,
            starting: bool) -> MemberMirror:
    """The member's status (``stored``: as the store holds it) from the pod's report, or from the group pod itself
    before it answers."""
    report, now = facts.report, facts.unit.now
    pod = newest_pod(facts.pods)
    reported = _reported(model, report)
    loading: LoadingDetail | None = None
    failure: tuple[str, str] | None = None
    if report is not None:
        phase = reported.phase if reported is not None else phases.PENDING
        if phase == phases.FAILED:
            failure = ("StartFailed", reported.last_error if reported and reported.last_error else "the server failed")
    elif starting:
        held = device_held_by_group(name, {name: list(facts.pods)}, {name: facts.gone_at} if facts.gone_at else {},
                                    now, shared=False)  # the last group pod releases the device: a wait, no failure
        found: PodFailure | None = pod_failure(pod, gpu_wait_expected=held, previous=shown_failure(stored))
        phase = phases.FAILED if found is not None else phases.LOADING
        failure = (found.reason, found.message) if found is not None else None
        loading = loading_detail(pod)
    else:
        phase = phases.IDLE
    url = _group_url(name, model.namespace)
    forward = None
    if report is not None:
        forward = report.url if policy.pod_endpoints else url
    shared = SharedGroupStatus(
        group_name=model.group or "", state="Active" if phase in (phases.LOADING, phases.READY) else "Queued",
        strategy=facts.strategy, group_endpoint=forward,
        memory_need_mib=reported.need_mib if reported else None,
        memory_need_source=reported.need_source if reported and reported.need_source in _SOURCES else None)
    base = model.model_copy(update={"status": stored})
    status = build_status(base, StatusInputs(phase, now, loading, shared, failure=failure))  # type: ignore[arg-type]
    status = status.model_copy(update={
        "endpoint": url, "pod_endpoint": forward if phase == phases.READY and policy.pod_endpoints else None,
        "last_active_time": model.status.last_active_time})
    status = placed_on(status, pod)
    return MemberMirror(model, status, status_patch(stored, status), failure)


_SOURCES = frozenset({"measured", "declared", "estimated", "unknown"})


def _group_url(name: str, namespace: str) -> str:
    return f"http://{name}.{namespace}.svc:{GROUP_POD_PORT}"


def _earliest(*moments: datetime | None) -> datetime | None:
    return min((m for m in moments if m is not None), default=None)


def caches_of(members: Sequence[Model], caches: Sequence[ModelCache]) -> list[ModelCache]:
    """The ModelCaches that match a member (what the pod's manifests carry)."""
    return [c for c in caches if any(cache_matches_model(c, m) for m in members)]
