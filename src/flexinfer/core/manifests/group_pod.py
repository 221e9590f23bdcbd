"""The group pod of a shared GPU group (``TimeSliced``/``MemoryShared``): ConfigMap, Deployment and Service.

One pod per group holds the group's GPU once and runs ``flexinfer serve`` over the members
(``flexinfer.core.manifests.group_members``: who may join, where their weights are mounted); its local engine
swaps (``TimeSliced``) or packs by memory (``MemoryShared``: ``--group-memory <namespace>/<group>=<budget>``).
The ConfigMap holds the members' manifests (``group_manifest_text``, mounted at ``/etc/flexinfer/group``); the
SHA-256 of its bytes is the revision the manager compares with the pod's. The pod takes from the members what
each would get in default mode (``flexinfer.core.manifests.deployment``): the GPU resource once (the largest
``spec.gpu.count``), profile environment, supplemental groups, runtime class, node selector and tolerations
(union; on a conflict the oldest member wins), the members' CPU/memory requests summed (a limit only when every
member sets it: a member without one has no bound), the controller's ``/dev/shm`` size. Not carried over:
the per-model compile-cache hostPaths (one per member, each at ``/cache/compile``; the group pod has none).

Staging: ``flexinfer serve`` stages weights itself, into ``FLEXINFER_SHM_ROOT/<namespace>/<model>``. When the
flash-loader is on for a member (resolved as in default mode; the controller's ``DEFAULT_FLASH_LOADER_*`` are
passed to the pod so both resolve alike), the node's ``/dev/shm/flexinfer/<namespace>`` is mounted at
``/flash/<namespace>`` (the root ``/flash``): each copy lands where default mode keeps a shared model's copy,
survives the pod (scale to zero, swaps back) and is removed by the same cleanup Job when the Model is deleted.
The ``flash-tmpfs-owner`` init container hands that directory (created root-owned) to the image's user, 65532.

Drain: on scale-down the pod gets ``terminationGracePeriodSeconds`` = the drain budget (``GroupPodPlan``, passed
to ``serve`` as ``FLEXINFER_DRAIN_TIMEOUT``) + the servers' stop grace (``FLEXINFER_STOP_GRACE``, 10 s) + 10 s
(the proxy's drain delay and slack), so in-flight requests finish. Pure; called by the manager's group-pod plan
(``flexinfer.core.group_pod_plan``).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from flexinfer.api.conventions import (
    GPU_GROUP_LABEL,
    GROUP_POD_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    MODEL_LABEL,
)
from flexinfer.api.dumping import dump_documents
from flexinfer.api.model import API_VERSION, KIND, Model
from flexinfer.api.modelcache import ModelCache
from flexinfer.api.units import format_duration, parse_quantity
from flexinfer.core.controller_defaults import ControllerDefaults
from flexinfer.core.errors import ConfigError
from flexinfer.core.flashloader_settings import cache_matches_model, resolve_flash_loader
from flexinfer.core.group_strategy import GROUP_POD_STRATEGIES, MEMORY_SHARED
from flexinfer.core.manifests.deployment import gpu_limit, model_tolerations, resources_block
from flexinfer.core.manifests.group_members import (
    backend_problem,
    member_problems,
    member_volumes,
    model_document,
    seniority,
    served_spec,
    source_problem,
)
from flexinfer.core.manifests.volumes import (
    FLASH_TMPFS_ROOT,
    SHM_MOUNT,
    TERMINATION_MESSAGE,
    flash_tmpfs_owner_container,
    shm_volume,
)
from flexinfer.core.profiles import runtime_profile

__all__ = [
    "GROUP_POD_LABEL", "GROUP_POD_PORT", "MANIFEST_KEY", "GroupPodPlan", "group_manifest_text",
    "group_members_problems", "group_pod_name", "render_group_pod",
]

Json = dict[str, Any]
GROUP_POD_PORT: Final = 8080
MANIFEST_KEY: Final = "models.yaml"
MANIFEST_DIR: Final = "/etc/flexinfer/group"
FLASH_ROOT: Final = "/flash"
STATE_DIR: Final = "/var/lib/flexinfer/state"
APP_NAME: Final = "flexinfer-group"
NAME_PREFIX: Final = "flexinfer-group-"
MAX_NAME: Final = 63
DEFAULT_DRAIN_TIMEOUT_S: Final = 30.0
"""The local engine's default drain budget (``FLEXINFER_DRAIN_TIMEOUT``)."""
STOP_GRACE_S: Final = 10
GRACE_SLACK_S: Final = 10
STARTUP_FAILURE_THRESHOLD: Final = 120
"""``serve`` answers ``/readyz`` within seconds of starting (models start on demand); two minutes of 1 s probes."""
MIB: Final = 1 << 20


@dataclass(frozen=True)
class GroupPodPlan:
    """What ``render_group_pod`` needs besides the members, their ModelCaches and the controller defaults."""

    namespace: str
    group: str
    strategy: str
    """``TimeSliced`` or ``MemoryShared``."""
    replicas: int
    """0 or 1."""
    budget_mib: float | None
    """``MemoryShared``: the group's memory budget in MiB (``None``: ``auto``, ``serve`` asks the GPU)."""
    token_secret: str
    """The Secret whose key ``token`` is the pod's admin token."""
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    """How long an outgoing member may finish in-flight requests (in a swap and when the pod stops)."""
    env: tuple[tuple[str, str], ...] = ()
    """Settings the manager hands on to the pod's ``serve`` (the swap knobs, tracing), after FlexInfer's own."""


def group_pod_name(group: str) -> str:
    """``flexinfer-group-<group>``; over 63 characters, cut and ended with 8 hex digits of the group's SHA-256."""
    name = NAME_PREFIX + group
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(group.encode()).hexdigest()[:8]
    return f"{name[:MAX_NAME - len(digest) - 1].rstrip('-')}-{digest}"


def group_members_problems(members: Sequence[Model],
                           defaults: ControllerDefaults) -> tuple[str | None, dict[str, str]]:
    """The image every member must run in (the resolved image of the oldest member that can otherwise join;
    ``None`` when none can) and ``{member name: why it cannot join}``: another image, a source the pod's local
    engine cannot read (anything but ``file://`` and ``pvc://``; a ``file:///models/…`` source on an empty
    volume), a backend it does not run, an unknown runtime profile."""
    return member_problems(members, defaults)


def group_manifest_text(plan: GroupPodPlan, members: Sequence[Model], caches: Sequence[ModelCache]) -> str:
    """The YAML stream ``serve`` reads in the pod: the members it can serve (by name; ``source`` as mounted in
    the pod), then the ModelCaches matching one of them (by name). Same inputs, same bytes."""
    served = sorted((m for m in members if source_problem(m) is None and backend_problem(m) is None),
                    key=lambda m: m.name)
    matched = sorted((c for c in caches if any(c.namespace == m.namespace and cache_matches_model(c, m)
                                               for m in served)), key=lambda c: (c.namespace, c.name))
    return dump_documents([*(model_document(m) for m in served), *(_cache_document(c) for c in matched)])


def render_group_pod(plan: GroupPodPlan, members: Sequence[Model], caches: Sequence[ModelCache],
                     defaults: ControllerDefaults) -> list[Json]:
    """``[ConfigMap, Deployment, Service]`` of the group pod. Members with a problem
    (``group_members_problems``) are left out; ``ConfigError`` when none is left or the strategy has no pod."""
    if plan.strategy not in GROUP_POD_STRATEGIES:
        raise ConfigError(f"group {plan.namespace}/{plan.group}: strategy {plan.strategy!r} has no group pod "
                          f"(expected one of {', '.join(sorted(GROUP_POD_STRATEGIES))})")
    image, problems = member_problems(members, defaults)
    served = sorted((m for m in members if m.name not in problems), key=seniority)
    if image is None or not served:
        raise ConfigError(f"group {plan.namespace}/{plan.group}: no member can run in its group pod"
                          + "".join(f"; {why}" for why in problems.values()))
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _metadata(plan, members),
                 "data": {MANIFEST_KEY: group_manifest_text(plan, served, caches)}}
    return [configmap, _deployment(plan, served, caches, defaults, image=image, metadata=_metadata(plan, members)),
            _service(plan, _metadata(plan, members))]


def group_labels(group: str) -> dict[str, str]:
    """The labels of the group pod's objects and pods."""
    name = group_pod_name(group)
    return {"app.kubernetes.io/name": APP_NAME, "app.kubernetes.io/instance": name, MANAGED_BY_LABEL: MANAGED_BY,
            GPU_GROUP_LABEL: group, GROUP_POD_LABEL: group, MODEL_LABEL: name}


def group_selector(group: str) -> dict[str, str]:
    """The Deployment's (immutable) and the Service's selector."""
    name = group_pod_name(group)
    return {"app.kubernetes.io/name": APP_NAME, "app.kubernetes.io/instance": name, GROUP_POD_LABEL: group}


def _metadata(plan: GroupPodPlan, members: Sequence[Model]) -> Json:
    """Name, namespace, labels; an owner reference per member with a uid, none the controller, so the objects
    are collected with the last member."""
    meta: Json = {"name": group_pod_name(plan.group), "namespace": plan.namespace, "labels": group_labels(plan.group)}
    owners = [{"apiVersion": API_VERSION, "kind": KIND, "name": m.name, "uid": m.metadata.uid,
               "controller": False, "blockOwnerDeletion": False}
              for m in sorted(members, key=lambda m: m.name) if m.metadata.uid]
    if owners:
        meta["ownerReferences"] = owners
    return meta


def _service(plan: GroupPodPlan, metadata: Json) -> Json:
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": {
        "type": "ClusterIP", "selector": group_selector(plan.group),
        "ports": [{"name": "http", "port": GROUP_POD_PORT, "targetPort": GROUP_POD_PORT, "protocol": "TCP"}]}}


def _deployment(plan: GroupPodPlan, served: Sequence[Model], caches: Sequence[ModelCache],
                defaults: ControllerDefaults, *, image: str, metadata: Json) -> Json:
    """Recreate: the old pod is gone (and the GPU free) before the new one starts; never two group pods."""
    volumes, mounts = member_volumes(served)
    volumes = [{"name": "manifests", "configMap": {"name": group_pod_name(plan.group)}}, *volumes,
               shm_volume(defaults.shm_size_limit), {"name": "state", "emptyDir": {}}]
    mounts = [{"name": "manifests", "mountPath": MANIFEST_DIR, "readOnly": True}, *mounts,
              {"name": "shm", "mountPath": SHM_MOUNT}, {"name": "state", "mountPath": STATE_DIR}]
    pod: Json = {"serviceAccountName": "default", "automountServiceAccountToken": False, "restartPolicy": "Always",
                 "terminationGracePeriodSeconds": math.ceil(plan.drain_timeout_s) + STOP_GRACE_S + GRACE_SLACK_S}
    env = _env(plan, served, defaults)
    staging = _staging(served, caches, defaults)
    if staging is not None:
        flash_volume, owner = staging
        volumes.append(flash_volume)
        mounts.append({"name": "flash-tmpfs", "mountPath": f"{FLASH_ROOT}/{plan.namespace}"})
        env.insert(1, {"name": "FLEXINFER_SHM_ROOT", "value": FLASH_ROOT})
        pod["initContainers"] = [owner]
    pod["containers"] = [_container(plan, served, defaults, image=image, env=env, mounts=mounts)]
    pod["volumes"] = volumes
    pod.update(_scheduling(served))
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata, "spec": {
        "replicas": plan.replicas, "selector": {"matchLabels": group_selector(plan.group)},
        "strategy": {"type": "Recreate"},
        "template": {"metadata": {"labels": group_labels(plan.group)}, "spec": pod}}}


def _container(plan: GroupPodPlan, served: Sequence[Model], defaults: ControllerDefaults, *, image: str,
               env: list[Json], mounts: list[Json]) -> Json:
    def probe(path: str) -> Json:
        return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": 1}
    return {
        "name": "flexinfer", "image": image, "imagePullPolicy": defaults.model_image_pull_policy,
        "command": _command(plan),
        "ports": [{"name": "http", "containerPort": GROUP_POD_PORT, "protocol": "TCP"}],
        "env": env, "resources": _resources(served), "volumeMounts": mounts,
        "startupProbe": {**probe("/readyz"), "failureThreshold": STARTUP_FAILURE_THRESHOLD},
        "readinessProbe": probe("/readyz"),
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10, "failureThreshold": 6},
        "securityContext": {"allowPrivilegeEscalation": False},
        **TERMINATION_MESSAGE,
    }


def _command(plan: GroupPodPlan) -> list[str]:
    command = ["flexinfer", "serve", "-f", f"{MANIFEST_DIR}/{MANIFEST_KEY}", "--no-watch", "--host", "0.0.0.0",
               "--port", str(GROUP_POD_PORT)]
    if plan.strategy == MEMORY_SHARED:
        budget = "auto" if plan.budget_mib is None else f"{_number(Decimal(str(plan.budget_mib)))}Mi"
        command += ["--group-memory", f"{plan.namespace}/{plan.group}={budget}"]
    return command


def _env(plan: GroupPodPlan, served: Sequence[Model], defaults: ControllerDefaults) -> list[Json]:
    """Admin token, ``serve``'s state, drain and stop grace, the controller's flash-loader defaults, the settings
    the manager hands on (``GroupPodPlan.env``), then each member's profile environment (the oldest member's
    value on a conflict)."""
    flash = defaults.flash_loader
    pairs = [("FLEXINFER_STATE_DIR", STATE_DIR), ("FLEXINFER_DRAIN_TIMEOUT", format_duration(plan.drain_timeout_s)),
             ("FLEXINFER_STOP_GRACE", f"{STOP_GRACE_S}s"),
             ("DEFAULT_FLASH_LOADER_ENABLED", _flag(flash.enabled)),
             ("DEFAULT_FLASH_LOADER_CONCURRENCY", str(flash.concurrency)),
             ("DEFAULT_FLASH_LOADER_BUFFER_KB", str(flash.buffer_size_kb)),
             ("DEFAULT_FLASH_LOADER_VERIFY", _flag(flash.verify_integrity)),
             ("DEFAULT_FLASH_LOADER_EXCLUDE", flash.exclude_patterns),
             ("DEFAULT_FLASH_LOADER_TMPFS_SIZE_LIMIT", flash.tmpfs_size_limit or ""),
             ("DEFAULT_FLASH_LOADER_MAX_RATE", flash.max_rate or "")]
    pairs += [(name, value) for name, value in plan.env if name not in {n for n, _ in pairs}]
    seen = {name for name, _ in pairs}
    for model in served:
        for name, value in runtime_profile(model).env:
            if name not in seen:
                seen.add(name)
                pairs.append((name, value))
    token = {"name": "FLEXINFER_ADMIN_TOKEN",
             "valueFrom": {"secretKeyRef": {"name": plan.token_secret, "key": "token"}}}
    return [token, *({"name": name, "value": value} for name, value in pairs if value)]


def _staging(served: Sequence[Model], caches: Sequence[ModelCache],
             defaults: ControllerDefaults) -> tuple[Json, Json] | None:
    """The node's ``/dev/shm/flexinfer/<namespace>`` and its owner init container, when a member is staged
    (resolved on the member as the pod reads it)."""
    for model in served:
        config = resolve_flash_loader(defaults, _as_served(model), caches)
        if config.enabled:
            volume = {"name": "flash-tmpfs", "hostPath": {"path": f"{FLASH_TMPFS_ROOT}/{model.namespace}",
                                                          "type": "DirectoryOrCreate"}}
            return volume, flash_tmpfs_owner_container(config)
    return None


def _as_served(model: Model) -> Model:
    return model.model_copy(update={"spec": type(model.spec).model_validate(served_spec(model))})


def _scheduling(served: Sequence[Model]) -> Json:
    """Node selector and tolerations of every member (deduplicated, oldest first); the GPU members' device
    groups and the first one's runtime class."""
    out: Json = {}
    selector: dict[str, str] = {}
    for model in served:
        selector = {**model.spec.node_selector, **selector}
    if selector:
        out["nodeSelector"] = dict(sorted(selector.items()))
    tolerations = _distinct(t for model in served for t in model_tolerations(model))
    if tolerations:
        out["tolerations"] = tolerations
    gpu_profiles = [runtime_profile(m) for m in served if m.gpu_count > 0]
    groups = list(dict.fromkeys(g for p in gpu_profiles for g in p.supplemental_groups))
    if groups:
        out["securityContext"] = {"supplementalGroups": groups}
    runtime_class = next((p.runtime_class_name for p in gpu_profiles if p.runtime_class_name), None)
    if runtime_class:
        out["runtimeClassName"] = runtime_class
    return out


def _resources(served: Sequence[Model]) -> Json:
    """Requests summed over the members; a limit summed only when every member sets it; the GPU limit of the
    member with the most GPUs (the pod holds the group's device once)."""
    specs = [m.spec.resources for m in served]
    requests = _sums([dict(s.requests) if s else {} for s in specs], every=False)
    limits = _sums([dict(s.limits) if s else {} for s in specs], every=True)
    gpu_members = [m for m in served if gpu_limit(m, runtime_profile(m))]
    if gpu_members:
        largest = max(gpu_members, key=lambda m: m.gpu_count)  # the oldest of equals (members come oldest first)
        limits.update(gpu_limit(largest, runtime_profile(largest)))
    return resources_block(limits, requests)


def _sums(declared: list[dict[str, str]], *, every: bool) -> dict[str, str]:
    keys = sorted({key for values in declared for key in values})
    if every:
        keys = [key for key in keys if all(key in values for values in declared)]
    return {key: _total(key, [values[key] for values in declared if key in values]) for key in keys}


def _total(key: str, quantities: list[str]) -> str:
    """The sum of ``quantities`` as a quantity: millicores for ``cpu``, else ``Gi``/``Mi`` when whole, else bytes."""
    total = sum((parse_quantity(q) for q in quantities), Decimal(0))
    if key == "cpu":
        return f"{math.ceil(total * 1000)}m"
    whole = math.ceil(total)
    for unit, size in (("Gi", MIB << 10), ("Mi", MIB)):
        if whole and whole % size == 0:
            return f"{whole // size}{unit}"
    return str(whole)


def _distinct(items: Iterable[Json]) -> list[Json]:
    out: list[Json] = []
    for item in items:
        if item not in out:
            out.append(item)
    return out


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _number(value: Decimal) -> str:
    """A decimal without exponent or trailing zeros (``24576``, ``1.5``)."""
    return format(value.normalize(), "f")


def _cache_document(cache: ModelCache) -> Json:
    metadata: Json = {"name": cache.name, "namespace": cache.namespace}
    if cache.metadata.labels:
        metadata["labels"] = dict(cache.metadata.labels)
    spec = cache.spec.model_dump(by_alias=True, exclude_unset=True, exclude_none=True, mode="json")
    return {"apiVersion": cache.api_version, "kind": cache.kind, "metadata": metadata, "spec": spec}
