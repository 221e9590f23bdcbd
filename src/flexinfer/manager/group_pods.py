"""Reconciles a shared group that runs in a group pod: the I/O shell around ``flexinfer.core.group_pod_plan``.

A pass (called by the reconciler for units whose group's strategy is ``TimeSliced``/``MemoryShared``,
``flexinfer.core.group_strategy``): make sure the group's admin-token Secret exists (created once with a random
token; the pod reads it as ``FLEXINFER_ADMIN_TOKEN``), plan, then write: rejections, the retired members' own
Deployments and Services (deleted), the ConfigMap (applied when its content changed), the Deployment and
Service (``Applier``), the link to the running pod (``flexinfer.manager.group_pod_link``), the members' status
patches, all at once (a Warning event when a member fails, once per message; none while a running pod has not
answered its first poll yet — a new pod, or a restarted manager's first passes — so a member's
``groupEndpoint`` is not withdrawn for a moment) and, when the pod runs another revision of the manifests, a
push of this pass's. With no member left the group's objects are deleted. The group objects of a group that no
longer runs in a group pod are deleted too (``retire``).

The pod's cold starts and swaps come back through the link and are observed into the manager's histograms
(same names, labels and buckets as default mode). A member's first cold start in a pod that the manager scaled
up from zero for it counts from the request that woke the group (its ``lastActiveTime`` then), so the pod's
own start is in the figure: a cold start measured as such.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from flexinfer.api.conventions import GPU_GROUP_LABEL, MANAGED_BY, MANAGED_BY_LABEL
from flexinfer.api.model import Model
from flexinfer.core.controller_defaults import ControllerDefaults
from flexinfer.core.device_handover import holds_device
from flexinfer.core.group_pod_plan import GroupPodFacts, GroupPodPass, MemberMirror, plan_group_pod
from flexinfer.core.group_strategy import runs_in_group_pod, strategy_of
from flexinfer.core.manifests.group_pod import GROUP_POD_PORT, group_pod_name
from flexinfer.core.model_status.plan import ManagerPolicy
from flexinfer.core.unit_actions import Rejection
from flexinfer.core.unit_facts import UnitFacts
from flexinfer.manager.applier import Applier
from flexinfer.manager.client import KubeApi
from flexinfer.manager.group_pod_link import GroupPodLinks, LifecycleEvent, LinkTarget
from flexinfer.manager.ports import ReconcileScope
from flexinfer.manager.store import Store, Unit
from flexinfer.runtime.observer import LifecycleObserver

log = logging.getLogger("flexinfer.manager")
Body = dict[str, Any]
TOKEN_KEY = "token"


def token_secret_name(group: str) -> str:
    """The Secret holding a group pod's admin token."""
    return f"{group_pod_name(group)}-admin"[:63].rstrip("-")


class GroupPods:
    """See the module docstring."""

    def __init__(self, api: KubeApi, store: Store, applier: Applier, *, defaults: ControllerDefaults,
                 policy: ManagerPolicy, sink: LifecycleObserver, wake: Callable[[Unit], None]) -> None:
        self._api, self._store, self._applier = api, store, applier
        self._defaults, self._policy, self._sink = defaults, policy, sink
        self.links: GroupPodLinks[Unit] = GroupPodLinks(wake, self._replay)
        self._tokens: dict[tuple[str, str], str] = {}
        self._configmaps: dict[tuple[str, str], str] = {}
        self._pushed: dict[Unit, tuple[str, str]] = {}
        self._woke: dict[Unit, dict[str, datetime]] = {}
        self._held: dict[Unit, tuple[str, ...]] = {}
        self._announced: dict[str, str] = {}
        self._started = datetime.now(UTC)

    def owns(self, unit: Unit) -> bool:
        """Whether ``unit`` is a group that runs in a group pod."""
        return unit.group and runs_in_group_pod(self._policy.group_strategies, unit.namespace, unit.name)

    async def reconcile(self, unit: Unit, facts: UnitFacts, *, reject: Callable[[Rejection], Awaitable[None]],
                        patch: Callable[[Model, Body], Awaitable[Body]], scope: ReconcileScope,
                        declared: Callable[[Model], None]) -> datetime | None:
        """One pass; returns when time alone changes a decision next."""
        ns, name = unit.namespace, group_pod_name(unit.name)
        secret = token_secret_name(unit.name)
        deployment = self._store.deployment(ns, name)
        pods = list(self._store.pods(ns, name))
        run = _running(pods)
        report = self.links.report(unit)
        if report is not None and (run is None or report.run != _uid(run)):
            report = None
        plan = plan_group_pod(GroupPodFacts(facts, ns, strategy_of(self._policy.group_strategies, ns, unit.name),
                                            deployment, pods, report, secret, self._store.pods_gone_at(ns, name)),
                              self._defaults, self._policy)
        owners = plan.objects[0]["metadata"].get("ownerReferences", []) if plan.objects else []
        # The pod reads its token from the Secret at start: it exists before the Deployment asks for a pod.
        token = await self._token(ns, secret, unit.name, owners) if plan.objects else None
        target = _target(run, token) if token is not None and run else None
        for rejection in plan.rejections:
            await reject(rejection)
        for model in plan.declared:
            declared(model)
        for member in plan.retire:
            for kind in ("Deployment", "Service"):
                if await self._api.delete(kind, ns, member):
                    log.info("model %s/%s: its own %s deleted (group %s runs in a group pod)", ns, member, kind,
                             unit.name)
        for namespace, pod in plan.reap:
            if await self._api.delete("Pod", namespace, pod, grace_period=0):
                log.info("group pod %s/%s: its containers have exited; deleted now so the next one gets the GPU",
                         namespace, pod)
            self._store.forget_pod(namespace, pod)  # gone at once: the follow-up pass goes on without the watch
        await self._write_objects(unit, plan, deployment)
        self.links.track(unit, target)
        waiting = self.links.asking(unit)  # a running pod not heard from yet (a new pod, a restarted manager)
        # All at once: a member whose requests wait for the pod's endpoint is not published after the others.
        await asyncio.gather(*(self._mirror(mirror, patch, scope) for mirror in plan.members
                               if mirror.patch and not (waiting and report is None)))
        await self._push(unit, plan, target)
        return plan.wake

    async def _mirror(self, mirror: MemberMirror, patch: Callable[[Model, Body], Awaitable[Body]],
                      scope: ReconcileScope) -> None:
        """Write one member's status patch (and its Warning event when it fails)."""
        async with scope("model", mirror.model.namespace, mirror.model.name):
            body = await patch(mirror.model, mirror.patch)
            await self._announce(mirror.model, body, mirror.failure)

    async def _write_objects(self, unit: Unit, plan: GroupPodPass, deployment: Body | None) -> None:
        ns = unit.namespace
        if not plan.objects:
            await self._delete_objects(unit, "no member left")
            return
        configmap, rendered, service = plan.objects
        if self._configmaps.get((ns, plan.name)) != plan.revision:
            await self._api.apply(configmap)
            self._configmaps[(ns, plan.name)] = plan.revision
        before = int(((deployment or {}).get("spec") or {}).get("replicas") or 0)
        if plan.held_by and self._held.get(unit) != plan.held_by:
            log.info("group %s: wanted by %s; its pod waits until the device is released by %s", unit,
                     ", ".join(plan.wanted), ", ".join(plan.held_by))
        self._held[unit] = plan.held_by
        if plan.replicas > before:
            self._woke[unit] = {m.name: m.status.last_active_time for m in plan.declared
                                if m.name in plan.wanted and m.status.last_active_time is not None}
            log.info("group %s: group pod scaled up (%s)", unit, ", ".join(sorted(self._woke[unit])) or "pinned")
        elif plan.replicas < before:
            log.info("group %s: every member idle; group pod scaled to zero", unit)
        await self._applier.apply(rendered)
        await self._applier.apply(service)

    async def _push(self, unit: Unit, plan: GroupPodPass, target: LinkTarget | None) -> None:
        """Send this pass's manifests to a pod that runs another revision, once per pod run and revision."""
        if not plan.push or target is None or self._pushed.get(unit) == (target.run, plan.revision):
            return
        self._pushed[unit] = (target.run, plan.revision)
        if await self.links.push(unit, plan.manifest):
            log.info("group %s: manifests %s handed to its pod", unit, plan.revision)

    async def _announce(self, model: Model, body: Body, failure: tuple[str, str] | None) -> None:
        """A Warning event when a member fails in (or with) the group pod, once per message."""
        text = failure[1] if failure else ""
        if self._announced.get(model.key, "") == text:
            return
        self._announced[model.key] = text
        if failure is not None:
            await self._api.post_event(body, "Warning", failure[0], failure[1])

    async def _token(self, namespace: str, name: str, group: str, owners: list[Body]) -> str:
        """The group pod's admin token: read from its Secret, or a new Secret made with a random one (owned by the
        members, so it goes with the last of them)."""
        known = self._tokens.get((namespace, name))
        if known is not None:
            return known
        token = await self._api.secret_value(namespace, name, TOKEN_KEY)
        if token is None:
            token = secrets.token_urlsafe(32)
            body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                    "metadata": {"name": name, "namespace": namespace, "ownerReferences": owners,
                                 "labels": {MANAGED_BY_LABEL: MANAGED_BY, GPU_GROUP_LABEL: group}},
                    "stringData": {TOKEN_KEY: token}}
            if not await self._api.create(body):
                token = await self._api.secret_value(namespace, name, TOKEN_KEY) or token
        self._tokens[(namespace, name)] = token
        return token

    def _replay(self, unit: Unit, events: list[LifecycleEvent]) -> None:
        """The pod's cold starts and swaps, observed into the manager's histograms; those that ended before this
        manager started are left out (a manager that ran then observed them: a restart must not count them
        twice)."""
        woke = self._woke.get(unit, {})
        for event in events:
            ended = _moment(event.at)
            if ended is not None and ended < self._started:
                continue
            namespace, _, name = event.model.partition("/")
            parsed = self._store.model(namespace, name)
            if parsed is None or parsed.model is None:
                continue
            if event.kind == "swap":
                self._sink.swap(parsed.model, event.seconds)
            elif event.kind == "cold_start":
                self._sink.cold_start(parsed.model, _from_wake(event, woke.pop(name, None)))

    async def retire(self, unit: Unit) -> None:
        """A group that no longer runs in a group pod (its strategy changed to ``Exclusive``): stop talking to its
        pod and delete the pod's objects, once."""
        self.links.track(unit, None)
        self._woke.pop(unit, None)
        self._pushed.pop(unit, None)
        await self._delete_objects(unit, "it runs Exclusive now")

    async def _delete_objects(self, unit: Unit, why: str) -> None:
        """Delete the group pod's Deployment, Service, ConfigMap and token Secret, once: nothing is asked of the
        API server while the store holds neither the Deployment nor the Service."""
        name, secret = group_pod_name(unit.name), token_secret_name(unit.name)
        if self._store.deployment(unit.namespace, name) is None and self._store.service(unit.namespace, name) is None:
            return
        for kind, named in (("Deployment", name), ("Service", name), ("ConfigMap", name), ("Secret", secret)):
            if await self._api.delete(kind, unit.namespace, named):
                log.info("group %s: %s; its group pod's %s deleted", unit, why, kind)
        self._configmaps.pop((unit.namespace, name), None)
        self._tokens.pop((unit.namespace, secret), None)

    async def close(self) -> None:
        await self.links.close()


def _moment(text: str) -> datetime | None:
    """An event's RFC 3339 time (``None``: unreadable or without a zone)."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def _from_wake(event: LifecycleEvent, woke_at: datetime | None) -> float:
    """The cold start's seconds, counted from the request that woke the group pod when there was one."""
    ended = _moment(event.at)
    if woke_at is None or ended is None:
        return event.seconds
    return max(event.seconds, (ended - woke_at).total_seconds())


def _running(pods: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The group pod to talk to: the newest one that has an address, has not ended and is not being deleted.
    Asked from the moment it has an address, not from the kubelet's ``Running`` report: the kubelet notices a
    started container only at its next relist (up to a second), and serve may listen before that."""
    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")
            and (p.get("status") or {}).get("podIP") and holds_device(p)]
    return max(live, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""), default=None)


def _uid(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return str(meta.get("uid") or meta.get("name"))


def _target(pod: Mapping[str, Any], token: str) -> LinkTarget:
    return LinkTarget(_uid(pod), f"http://{pod['status']['podIP']}:{_port(pod)}", token)


def _port(pod: Mapping[str, Any]) -> int:
    for container in (pod.get("spec") or {}).get("containers") or ():
        for port in container.get("ports") or ():
            if port.get("name") == "http" and isinstance(port.get("containerPort"), int):
                return int(port["containerPort"])
    return GROUP_POD_PORT
