"""Desired replicas for a Model (spec §3.2) and the per-model timeouts both engines use.

``desired_replicas`` is called for every member of every reconcile pass of the manager
(``flexinfer.core.model_status.plan.plan_member``); ``idle_timeout_seconds`` and ``cold_start_timeout_seconds``
are also used by the election, the arbiter (``flexinfer.core.arbiter.state``) and the proxy's demand side.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

from flexinfer.api.model import Model
from flexinfer.api.units import parse_duration
from flexinfer.core.phases import COND_READY, READY, find_condition

DEFAULT_IDLE_TIMEOUT: Final = 300.0
"""Backend default idle timeout for LLM backends (5 m)."""
IMAGE_GEN_IDLE_TIMEOUT: Final = 600.0
"""Backend default idle timeout for image generation backends (10 m)."""
IMAGE_GEN_BACKENDS: Final = frozenset({"diffusers", "comfyui"})


def idle_timeout_seconds(model: Model) -> float:
    """``spec.serverless.idleTimeout``, else the backend default (5 m LLMs, 10 m image generation)."""
    spec = model.spec.serverless
    if spec is not None and spec.idle_timeout:
        return parse_duration(spec.idle_timeout)
    return IMAGE_GEN_IDLE_TIMEOUT if model.backend in IMAGE_GEN_BACKENDS else DEFAULT_IDLE_TIMEOUT


def cold_start_timeout_seconds(model: Model, default: float) -> float:
    """``spec.serverless.coldStartTimeout``, else ``default`` (the proxy/engine setting)."""
    spec = model.spec.serverless
    if spec is not None and spec.cold_start_timeout:
        return parse_duration(spec.cold_start_timeout)
    return default


def desired_replicas(model: Model, now: datetime, *, in_flight: bool = False) -> int:
    """The replica count for the model's Deployment at ``now``, first matching rule wins (spec §3.2):

    shared and not Active in its group → 0; not serverless → 1; no ``lastActiveTime`` → minReplicas (warm
    primary → 1); Loading → 1 (never reap mid-load); idle past the idle timeout → minReplicas; else
    max(1, minReplicas). Idle counts from the last activity or from when the model became Ready, whichever is
    later (the requests that woke it were waiting all along), and never while ``in_flight`` (a proxy reports
    requests in flight to the model, ``flexinfer.core.model_status.plan.busy_proxies``, or a request waits for
    it). The Go rules that read
    node facts (a KV-cache eviction; no warm primary while the node runs pipeline pods or is in gaming mode)
    have no input here.
    """
    status = model.status
    shared = status.shared_group
    if model.group and shared is not None and shared.state != "Active":
        return 0
    if not model.serverless:
        return 1
    floor = _min_replicas(model)
    if status.last_active_time is None:
        return floor
    if status.phase == "Loading":
        return 1
    idle_since = status.last_active_time
    ready = find_condition(status.conditions, COND_READY) if status.phase == READY else None
    if ready is not None and ready.status == "True" and ready.last_transition_time is not None:
        idle_since = max(idle_since, ready.last_transition_time)
    if not in_flight and (now - idle_since).total_seconds() > idle_timeout_seconds(model):
        return floor
    return max(1, floor)


def _min_replicas(model: Model) -> int:
    floor = model.min_replicas
    if floor < 1 and model.spec.config.get("warmPolicy") == "primary":
        return 1
    return floor
