"""A model pod asked directly: where its server answers, and whether the manager may ask it before the kubelet.

The kubelet notices a server is up only at its next probe (up to a probe period after it listens), and a
Service routes to the pod only after kube-proxy has programmed the endpoint (about a second more). The manager
can instead ask the pod itself, at the readiness path and port of the pod's own ``readinessProbe``, as soon as
the pod has an address and its model container is starting or running (the kubelet reports a started container
only at its next relist, up to a second later, and the server may listen before that): ``health_target`` says
what to ask (``None`` when there is nothing to ask: no pod IP, an exec probe, a container that exited, crashed
and waits to restart, or cannot be created, the pod terminating or already Ready). An answer counts for the
container run it was given by (``run_key``: the pod and the container's restart count, the same before and
after the kubelet reports the run started) until the kubelet sees the pod Ready: the prober then drops it, so
from then on the kubelet's view alone decides (a server that stops answering its probe later is not Ready).
``pod_endpoint`` is the pod's own base URL, which the manager publishes as ``status.podEndpoint`` of a Ready
model served by one pod, and the in-cluster proxy forwards to. Pure; used by ``flexinfer.core.unit_plan`` and
the manager's prober (``flexinfer.manager.pod_prober``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final

from flexinfer.api.model import ModelStatus
from flexinfer.core.model_status.build import DeploymentFacts, ReadySource, ready_source
from flexinfer.core.phases import READY

Json = Mapping[str, Any]

MODEL_CONTAINER = "model"


@dataclass(frozen=True)
class HealthTarget:
    """What to ask: ``url``; ``key`` names the pod and its container run (an answer is kept per run)."""

    url: str
    key: str


STARTING: Final = frozenset({"ContainerCreating", "PodInitializing"})
"""Why a model container waits on its first start (sandbox and image, or the init containers): asked already."""


def _model_container(pod: Json) -> tuple[Json, Json] | None:
    """The model container's spec and status (an empty status before the kubelet reported any)."""
    spec = next((c for c in (pod.get("spec") or {}).get("containers") or () if c.get("name") == MODEL_CONTAINER),
                None)
    status: Json = next((c for c in (pod.get("status") or {}).get("containerStatuses") or ()
                         if c.get("name") == MODEL_CONTAINER), {})
    return (spec, status) if spec is not None else None


def _port(container: Json, port: object) -> int | None:
    if isinstance(port, int):
        return port
    for declared in container.get("ports") or ():
        if declared.get("name") == port and isinstance(declared.get("containerPort"), int):
            return int(declared["containerPort"])
    return None


def _ready_condition(pod: Json) -> Json | None:
    return next((c for c in (pod.get("status") or {}).get("conditions") or () if c.get("type") == "Ready"), None)


def run_key(pod: Json) -> str | None:
    """The pod's name and its model container's current run (its ``restartCount``): while that run is starting
    or running; ``None`` once it exited, while it waits to be restarted or cannot be created."""
    found = _model_container(pod)
    if found is None:
        return None
    status = found[1]
    state = status.get("state") or {}
    restarts = int(status.get("restartCount") or 0)
    first_start = not state or (str((state.get("waiting") or {}).get("reason") or "") in STARTING
                                and restarts == 0 and not status.get("lastState"))
    if "running" not in state and not first_start:
        return None
    name = str((pod.get("metadata") or {}).get("name") or "")
    return f"{name}#{restarts}"


def container_running(pod: Json) -> bool:
    """The kubelet reports the pod's model container running (its log can be read)."""
    found = _model_container(pod)
    return found is not None and "running" in (found[1].get("state") or {})


def _base(pod: Json, port: object) -> str | None:
    ip = (pod.get("status") or {}).get("podIP")
    found = _model_container(pod)
    number = _port(found[0], port) if found else None
    if not ip or number is None:
        return None
    host = f"[{ip}]" if ":" in str(ip) else str(ip)
    return f"http://{host}:{number}"


def _probe(pod: Json) -> Json | None:
    found = _model_container(pod)
    get = ((found[0].get("readinessProbe") or {}).get("httpGet") or {}) if found else {}
    return get if get.get("port") is not None and (get.get("scheme") or "HTTP") == "HTTP" else None


def health_target(pod: Json | None) -> HealthTarget | None:
    """What to ask a pod whose model container runs and that is not Ready yet (see the module docstring)."""
    if pod is None or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    if kubelet_ready(pod):
        return None
    get, key = _probe(pod), run_key(pod)
    base = _base(pod, get.get("port")) if get is not None else None
    if get is None or key is None or base is None:
        return None
    path = str(get.get("path") or "/")
    return HealthTarget(base + (path if path.startswith("/") else "/" + path), key)


def kubelet_ready(pod: Json) -> bool:
    """The kubelet says the pod is Ready (its ``Ready`` condition is True)."""
    ready = _ready_condition(pod)
    return ready is not None and ready.get("status") == "True"


def pod_endpoint(pod: Json | None) -> str | None:
    """The base URL of the pod's server (the port its readiness probe asks), ``None`` when not known."""
    get = _probe(pod) if pod is not None else None
    return _base(pod, get.get("port")) if pod is not None and get is not None else None


def answered_at(pod: Json | None, answered: Mapping[str, datetime]) -> datetime | None:
    """When ``pod``'s current server run answered the manager, if it did and that answer still stands."""
    if pod is None or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    key = run_key(pod)
    return answered.get(key) if key is not None else None


def ready_by_answer(live: DeploymentFacts | None, at: datetime | None) -> DeploymentFacts | None:
    """The Deployment's facts with the answering pod counted ready (the kubelet will say so at its next probe)."""
    if at is None or live is None or live.replicas == 0 or live.ready_replicas > 0:
        return live
    return replace(live, ready_replicas=1, unavailable_replicas=max(live.unavailable_replicas - 1, 0))


def ready_from(pod: Json | None, deployment: Json | None, at: datetime | None) -> ReadySource | None:
    """``ready_source``, with a pod that answered the manager before its ``Ready`` condition turned True as the
    source (``kind`` ``Pod``, ``since`` the answer), ahead of the Deployment's ``Available`` condition."""
    pod_ready = ready_source(pod, None)
    if pod_ready is not None or at is None or pod is None:
        return pod_ready or ready_source(None, deployment)
    return ReadySource("Pod", str((pod.get("metadata") or {}).get("name") or ""), at)


def with_pod_endpoint(status: ModelStatus, pod: Json | None, replicas: int, source: ReadySource | None) -> ModelStatus:
    """``status.podEndpoint``: the Ready model's one pod's own URL, when that pod is what says it is Ready;
    cleared otherwise (several replicas, no pod address, not Ready: clients use ``status.endpoint``)."""
    name = str(((pod or {}).get("metadata") or {}).get("name") or "")
    mine = (status.phase == READY and replicas == 1 and source is not None and source.kind == "Pod"
            and source.name == name and not ((pod or {}).get("metadata") or {}).get("deletionTimestamp"))
    url = pod_endpoint(pod) if mine else None
    return status if status.pod_endpoint == url else status.model_copy(update={"pod_endpoint": url})
