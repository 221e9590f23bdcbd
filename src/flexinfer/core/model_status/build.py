"""Model status derived from its Deployment and newest pod (spec §3.6, §3.8), as pure functions.

- ``DeploymentFacts.from_body``: the replica counts of a Deployment document;
- ``derive_phase``: the phase implied by the desired replicas, the shared-group state and those facts;
- ``loading_detail``: ``loadingSubstage`` + ``message`` from the newest pod's container states;
- ``build_status``: the complete manager-owned status (conditions with ``lastTransitionTime``
  semantics from ``flexinfer.core.phases``; a pod that cannot start, ``StatusInputs.failure``, gives phase
  ``Failed`` with its reason on ``Ready`` and its cause in ``message``), and ``status_patch``: the merge patch
  from one status to another (empty when nothing changed, so the manager writes only on change).

``failed_status`` and ``with_ignored_fields`` set ``ConfigValid=False`` for an invalid Model or a field ignored
in a stored object; ``ready_source``/``ready_since`` name the object and the Ready instant the cluster
recorded. Called by the manager's reconcile plan (``flexinfer.core.unit_plan``) and by
``flexinfer.core.model_status.plan``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from flexinfer.api.model import (
    ActivationStatus,
    CacheStatus,
    GPUStatus,
    LoadingSubstage,
    Model,
    ModelStatus,
    Phase,
    SharedGroupStatus,
)
from flexinfer.core import phases
from flexinfer.core.cache_strategy import effective_cache_strategy
from flexinfer.core.profiles import BACKENDS

Json = dict[str, Any]
MESSAGE_LIMIT: Final = 160
MANAGED_FIELDS: Final = (
    "phase", "conditions", "loadingSubstage", "message", "loadingProgressAt", "endpoint", "podEndpoint", "sharedGroup",
    "activation", "cache", "observedGeneration", "lastActiveTime", "gpu",
)
"""Top-level status keys the manager writes; ``metrics`` is left alone, and of ``gpu`` only ``node`` is written
(``placed_on``). ``lastActiveTime`` is the
newest demand the proxies reported (``flexinfer.core.demand_view``): the manager keeps it in status so it
outlives the proxy pods whose ``ModelDemand`` reports carried it (a proxy rollout must not make a serving
model look idle)."""
REASON_VALIDATION_FAILED: Final = "ValidationFailed"
REASON_FIELD_IGNORED: Final = "InvalidFieldIgnored"
_WAITING_INIT: Final = ("containercreating", "podinitializing")
FLASH_LOADER: Final = "flash-loader"
"""The staging init container; while it runs, its log's progress lines refine the message (bytes staged)."""


@dataclass(frozen=True)
class DeploymentFacts:
    """What a Deployment says about its pods: wanted, ready and unavailable replicas."""

    replicas: int = 0
    ready_replicas: int = 0
    unavailable_replicas: int = 0

    @classmethod
    def from_body(cls, body: Mapping[str, Any] | None) -> DeploymentFacts | None:
        """``None`` when there is no Deployment."""
        if body is None:
            return None
        spec, status = body.get("spec") or {}, body.get("status") or {}
        return cls(int(spec.get("replicas", 1) or 0), int(status.get("readyReplicas") or 0),
                   int(status.get("unavailableReplicas") or 0))


@dataclass(frozen=True)
class LoadingDetail:
    """``status.loadingSubstage`` and ``status.message`` while Loading."""

    substage: LoadingSubstage
    message: str
    log_container: str | None = None
    """Set when only the container's log can say more (the server runs, its readiness probe does not pass
    yet; or the flash-loader stages and its progress lines say how many bytes are in place)."""


def endpoint(model: Model) -> str:
    """The in-cluster Service URL: ``http://<name>.<namespace>.svc:<port>`` (port 80 if unknown)."""
    backend = BACKENDS.get(model.backend)
    port = backend.port if backend is not None else 80
    return f"http://{model.name}.{model.namespace}.svc:{port}"


def derive_phase(desired: int, facts: DeploymentFacts | None, shared_state: str | None) -> Phase:
    """Preempted members stay Preempted; 0 desired → Idle; then ready → Ready, unavailable → Loading,
    else Pending. Scaling down is never reported Ready, even while an old pod still answers."""
    if shared_state == "Preempted":
        return "Preempted"
    if desired == 0:
        return "Idle"
    if facts is None:
        return "Pending"
    if facts.ready_replicas > 0:
        return phases.READY
    if facts.unavailable_replicas > 0:
        return "Loading"
    return "Pending"


def _true_since(conditions: Iterable[Mapping[str, Any]] | None, type_: str) -> datetime | None:
    for condition in conditions or []:
        if condition.get("type") == type_ and condition.get("status") == "True":
            try:
                return datetime.fromisoformat(str(condition.get("lastTransitionTime") or ""))
            except ValueError:
                return None
    return None


@dataclass(frozen=True)
class ReadySource:
    """The object whose condition says when the model's server became Ready: ``kind`` (``Pod``, else
    ``Deployment``), its ``name`` and the condition's ``lastTransitionTime`` (``since``, whole seconds)."""

    kind: str
    name: str
    since: datetime


def ready_source(pod: Mapping[str, Any] | None, deployment: Mapping[str, Any] | None) -> ReadySource | None:
    """The newest pod's ``Ready=True`` condition, else the Deployment's ``Available=True`` one; ``None`` when
    neither says. The lifecycle clock decides whether to trust it
    (``flexinfer.core.lifecycle_clock.observed_ready``), together with when the manager's watch showed that
    object turn Ready (the manager's store keeps it by kind and name)."""
    for kind, body, type_ in (("Pod", pod, "Ready"), ("Deployment", deployment, "Available")):
        if body is None:
            continue
        since = _true_since((body.get("status") or {}).get("conditions"), type_)
        if since is not None:
            return ReadySource(kind, str((body.get("metadata") or {}).get("name") or ""), since)
    return None


def ready_since(pod: Mapping[str, Any] | None, deployment: Mapping[str, Any] | None) -> datetime | None:
    """When the model's server became Ready, as the cluster recorded it (``ready_source``'s ``since``)."""
    source = ready_source(pod, deployment)
    return source.since if source is not None else None


def newest_pod(pods: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The most recently created pod (ties broken by name)."""
    def key(pod: Mapping[str, Any]) -> tuple[str, str]:
        meta = pod.get("metadata") or {}
        return str(meta.get("creationTimestamp") or ""), str(meta.get("name") or "")
    return max(pods, key=key, default=None)


def short_message(text: str) -> str:
    """The first line of ``text``, cut to the status message limit."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= MESSAGE_LIMIT else line[: MESSAGE_LIMIT - 1] + "…"


def _container_detail(status: Mapping[str, Any], init: bool) -> LoadingDetail | None:
    name = str(status.get("name") or "container")
    state = status.get("state") or {}
    what = f"init container {name}" if init else name
    if "waiting" in state:
        waiting = state["waiting"] or {}
        reason, message = str(waiting.get("reason") or ""), str(waiting.get("message") or "")
        if "imagepull" in reason.lower():
            return LoadingDetail("ImagePulling", short_message(f"pulling image for {what}: {message or reason}"))
        if reason.lower() in _WAITING_INIT:
            return LoadingDetail("Initializing", short_message(f"{what}: {reason}"))
        return LoadingDetail("Initializing", short_message(f"{what}: {reason} {message}".rstrip()))
    if "running" in state and not status.get("ready"):
        if init and name == FLASH_LOADER:
            return LoadingDetail("LoadingWeights", "flash-loader staging weights into tmpfs", log_container=name)
        if init:
            return LoadingDetail("Initializing", short_message(f"{what} running"))
        return LoadingDetail("Initializing", short_message(f"{name} running, readiness probe not passing yet"),
                             log_container=name)
    if "terminated" in state and not init:
        reason = str((state["terminated"] or {}).get("reason") or "terminated")
        return LoadingDetail("Initializing", short_message(f"{name} terminated: {reason}"))
    return None


def loading_detail(pod: Mapping[str, Any] | None) -> LoadingDetail | None:
    """Substage + message from the pod's init containers first, then its main containers (spec §3.8)."""
    if pod is None:
        return None
    status = pod.get("status") or {}
    for key, init in (("initContainerStatuses", True), ("containerStatuses", False)):
        for container in status.get(key) or []:
            detail = _container_detail(container, init)
            if detail is not None:
                return detail
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return LoadingDetail("Initializing", short_message(f"pod not scheduled: {condition.get('message') or ''}"))
    return None


@dataclass(frozen=True)
class StatusInputs:
    """Everything ``build_status`` needs besides the Model and its current status."""

    phase: Phase
    now: datetime
    loading: LoadingDetail | None = None
    shared: SharedGroupStatus | None = None
    activation: ActivationStatus | None = None
    preempted_message: str = ""
    failure: tuple[str, str] | None = None
    """While phase Failed because the pod cannot start (``flexinfer.core.model_status.pod_failure``): its reason
    and message, written to the ``Ready`` condition and ``message``."""


def _conditions(model: Model, inputs: StatusInputs) -> list[Any]:
    now, gen = inputs.now, model.metadata.generation
    conditions = phases.set_condition(list(model.status.conditions), phases.COND_CONFIG_VALID, "True",
                                      phases.REASON_CONFIG_VALID, now=now, observed_generation=gen)
    conditions = phases.set_condition(conditions, phases.COND_CACHED, "True", phases.REASON_BACKEND_READY,
                                      now=now, observed_generation=gen)
    status, reason = phases.ready_condition(inputs.phase)
    message = inputs.preempted_message if inputs.phase == "Preempted" else ""
    if inputs.phase == phases.FAILED and inputs.failure is not None:
        reason, message = inputs.failure
    return phases.set_condition(conditions, phases.COND_READY, status, reason, message=message, now=now,
                                observed_generation=gen)


def build_status(model: Model, inputs: StatusInputs) -> ModelStatus:
    """The manager-owned status for ``inputs``; proxy-owned ``lastActiveTime`` is carried over."""
    old = model.status
    substage: LoadingSubstage | None = None
    message: str | None = None
    if inputs.phase == "Loading" and inputs.loading is not None:
        substage, message = inputs.loading.substage, inputs.loading.message
    elif inputs.phase == "Preempted":
        substage, message = "Preempted", inputs.preempted_message or None
    elif inputs.phase == phases.FAILED and inputs.failure is not None:
        message = inputs.failure[1]
    progress = old.loading_progress_at
    if (substage, message) != (old.loading_substage, old.message):
        progress = inputs.now if substage is not None else None
    return old.model_copy(update={
        "phase": inputs.phase, "conditions": _conditions(model, inputs), "loading_substage": substage,
        "message": message, "loading_progress_at": progress, "endpoint": endpoint(model),
        "shared_group": inputs.shared, "activation": inputs.activation,
        "cache": CacheStatus(strategy=effective_cache_strategy(model), ready=True),
        "observed_generation": model.metadata.generation,
    })


def placed_on(status: ModelStatus, pod: Mapping[str, Any] | None) -> ModelStatus:
    """``status`` with ``gpu.node`` = the node ``pod`` is bound to; kept as it is while no pod is bound (scaled
    to zero, Pending): the node the model last ran on, where a shared model's persistent tmpfs stays."""
    node = str(((pod or {}).get("spec") or {}).get("nodeName") or "")
    if not node or (status.gpu is not None and status.gpu.node == node):
        return status
    gpu = (status.gpu or GPUStatus()).model_copy(update={"node": node})
    return status.model_copy(update={"gpu": gpu})


def failed_status(old: ModelStatus, generation: int | None, message: str, now: datetime) -> ModelStatus:
    """Status of a Model whose spec is invalid: phase Failed, ``ConfigValid=False`` naming the field(s)."""
    conditions = phases.set_condition(list(old.conditions), phases.COND_CONFIG_VALID, "False",
                                      REASON_VALIDATION_FAILED, message=message, now=now,
                                      observed_generation=generation)
    conditions = phases.set_condition(conditions, phases.COND_READY, "False", REASON_VALIDATION_FAILED,
                                      message=message, now=now, observed_generation=generation)
    return old.model_copy(update={
        "phase": "Failed", "conditions": conditions, "loading_substage": None, "message": short_message(message),
        "loading_progress_at": None, "activation": None, "observed_generation": generation,
    })


def with_ignored_fields(status: ModelStatus, message: str, generation: int | None, now: datetime) -> ModelStatus:
    """``status`` with ``ConfigValid=False`` (reason ``InvalidFieldIgnored``) naming fields whose stored value
    could not be parsed and was ignored; the model still runs, so the phase and ``Ready`` are left as they are."""
    conditions = phases.set_condition(list(status.conditions), phases.COND_CONFIG_VALID, "False",
                                      REASON_FIELD_IGNORED, message=message, now=now, observed_generation=generation)
    return status.model_copy(update={"conditions": conditions})


def _without_empty(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_empty(v) for k, v in value.items() if v != ""}
    if isinstance(value, list):
        return [_without_empty(v) for v in value]
    return value


def status_document(status: ModelStatus) -> Json:
    """The status as Kubernetes JSON (camelCase; unset fields and empty strings left out — an empty
    string reads back as the default, and some API servers mangle ``""`` in custom resources)."""
    return _without_empty(status.model_dump(by_alias=True, exclude_none=True, mode="json"))  # type: ignore[no-any-return]


def merge_diff(before: Json, after: Json) -> Json:
    """RFC 7386 merge patch turning ``before`` into ``after`` (nested objects diffed, lists replaced)."""
    patch: Json = {key: None for key in before if key not in after}
    for key, value in after.items():
        old = before.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            nested = merge_diff(old, value)
            if nested:
                patch[key] = nested
        elif old != value:
            patch[key] = value
    return patch


def status_patch(old: ModelStatus, new: ModelStatus) -> Json:
    """Merge patch of the manager-owned keys that differ; ``{}`` when unchanged (no write needed)."""
    before, after = status_document(old), status_document(new)
    owned_before = {k: v for k, v in before.items() if k in MANAGED_FIELDS}
    owned_after = {k: v for k, v in after.items() if k in MANAGED_FIELDS}
    return merge_diff(owned_before, owned_after)
