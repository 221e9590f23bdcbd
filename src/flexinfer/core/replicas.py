"""Desired replicas for a Model (spec §3.2) and the per-model timeouts both engines use.

``desired_replicas`` is called by the Kubernetes engine on every reconcile; ``idle_timeout_seconds`` and
``cold_start_timeout_seconds`` are also used by the arbiter (``flexinfer.core.arbiter.state``).
"""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class ReplicaContext:
    """Facts about the node and the model's status the rule needs beyond the Model itself."""

    now: datetime
    warm_primary_allowed: bool = True
    """False when the node runs pipeline pods or is in gaming mode (the warm-primary exceptions)."""
    kv_cache_evicted: bool = False
    in_flight: bool = False
    """A proxy reports requests in flight to the model (``flexinfer.core.model_status.plan.busy_proxies``): it is
    not idle, whatever its ``lastActiveTime`` says."""


def desired_replicas(model: Model, ctx: ReplicaContext) -> int:
    """The replica count for the model's Deployment, first matching rule wins (spec §3.2):

    KV-cache evicted → 0; shared and not Active in its group → 0; not serverless → 1; no
    ``lastActiveTime`` → minReplicas (warm primary → 1); Loading → 1 (never reap mid-load); idle past
    the idle timeout → minReplicas; else max(1, minReplicas). Idle counts from the last activity or from
    when the model became Ready, whichever is later (the requests that woke it were waiting all along), and
    never while a proxy reports requests in flight to it.
    """
    status = model.status
    if ctx.kv_cache_evicted:
        return 0
    shared = status.shared_group
    if model.group and shared is not None and shared.state != "Active":
        return 0
    if not model.serverless:
        return 1
    floor = _min_replicas(model, ctx)
    if status.last_active_time is None:
        return floor
    if status.phase == "Loading":
        return 1
    idle_since = status.last_active_time
    ready = find_condition(status.conditions, COND_READY) if status.phase == READY else None
    if ready is not None and ready.status == "True" and ready.last_transition_time is not None:
        idle_since = max(idle_since, ready.last_transition_time)
    if not ctx.in_flight and (ctx.now - idle_since).total_seconds() > idle_timeout_seconds(model):
        return floor
    return max(1, floor)


def _min_replicas(model: Model, ctx: ReplicaContext) -> int:
    floor = model.min_replicas
    if floor < 1 and model.spec.config.get("warmPolicy") == "primary" and ctx.warm_primary_allowed:
        return 1
    return floor
