"""The manager's settings: flags over environment variables over defaults (spec §7).

``METRICS_BIND_ADDRESS`` (``:8080``), ``HEALTH_PROBE_BIND_ADDRESS`` (``:8081``), ``LEADER_ELECT``
(false), ``POD_NAMESPACE`` (the Lease's namespace; ``default``), ``POD_NAME`` (the leader identity;
hostname + a random suffix when unset), ``FLEXINFER_SWAP_DRAIN_TIMEOUT`` (``60s``: how long a preempted
model may keep serving reported in-flight requests), ``FLEXINFER_MANAGER_WORKERS`` (4 concurrent
reconciles of different units), and the swap knobs both engines share (``flexinfer.core.swap_knobs``:
``FLEXINFER_SWAP_MIN_HOLD``, ``FLEXINFER_SWAP_MAX_WAIT``, the election's hold and starvation bound), and
``FLEXINFER_GPU_PROFILES`` (``flexinfer.core.gpu_profiles``: the shared groups that pack by memory),
``FLEXINFER_POD_ENDPOINTS`` (true: starting pods are asked directly, a Ready model's pod is published),
``FLEXINFER_GROUP_STRATEGIES`` (``flexinfer.core.group_strategy``: the shared groups that run in a group pod). An
unparsable value of these is a ``ConfigError`` naming the variable.
Controller defaults (``DEFAULT_SHM_SIZE_LIMIT``, ``DEFAULT_FLASH_LOADER_*``, images) come from
``flexinfer.core.controller_defaults``: unparsable ones keep the Go fallback and are logged as warnings.
Built by ``flexinfer.assembly.run_manager``.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from flexinfer import settings
from flexinfer.core.controller_defaults import ControllerDefaults, controller_defaults
from flexinfer.core.election import ElectionPolicy
from flexinfer.core.envvalues import EnvReader, EnvVar, Kind
from flexinfer.core.gpu_profiles import parse_gpu_profiles
from flexinfer.core.group_strategy import parse_group_strategies
from flexinfer.core.model_status.plan import ManagerPolicy
from flexinfer.core.swap_knobs import swap_knobs
from flexinfer.manager.http import parse_bind_address

DEFAULT_METRICS = ":8080"
DEFAULT_HEALTH = ":8081"
DEFAULT_DRAIN_TIMEOUT_S = 60.0
GROUP_POD_ENV = ("FLEXINFER_SWAP_MIN_HOLD", "FLEXINFER_SWAP_MAX_WAIT", "FLEXINFER_OTEL_ENABLED",
                 "FLEXINFER_OTEL_SERVICE_NAMESPACE", "FLEXINFER_OTEL_TRUST_INCOMING", "OTEL_SDK_DISABLED",
                 "OTEL_RESOURCE_ATTRIBUTES", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG",
                 "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL")
"""The manager's variables a group pod's ``serve`` gets the same value of, when set: the swap knobs both engines
share, and tracing (the pod's spans join the proxy's traces)."""

ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar("METRICS_BIND_ADDRESS", DEFAULT_METRICS, "Address of `/metrics` (`--metrics-bind-address` wins).",
           Kind.ADDRESS),
    EnvVar("HEALTH_PROBE_BIND_ADDRESS", DEFAULT_HEALTH,
           "Address of `/healthz` and `/readyz` (`--health-probe-bind-address` wins).", Kind.ADDRESS),
    EnvVar("LEADER_ELECT", "false", "Lease-based leader election, so only one replica acts (`--leader-elect`).",
           Kind.BOOL),
    EnvVar("POD_NAMESPACE", "default", "Namespace of the leader-election Lease `flexinfer-manager`."),
    EnvVar("POD_NAME", "hostname + random suffix", "This replica's identity in the Lease."),
    EnvVar("KUBECONFIG", "in-cluster service account", "Kubeconfig file (`--kubeconfig` wins)."),
    EnvVar("FLEXINFER_SWAP_DRAIN_TIMEOUT", "60s",
           "How long a preempted model keeps serving requests that proxies report in flight.", Kind.DURATION),
    EnvVar("FLEXINFER_MANAGER_WORKERS", "4", "Concurrent reconciles of different models/groups.", Kind.INT),
    EnvVar("FLEXINFER_GPU_PROFILES", "", "GPU profiles with Go's GPUProfile fields, a JSON list: "
           '`[{"architecture": "gfx1100", "vramMB": 24576, "features": {"multiModel": true}}]`. A shared group '
           "whose members run on an architecture with `multiModel` keeps as many of them Active as fit in `vramMB` "
           "(by `spec.gpu.vramEstimateMB`; 0 or less: no limit) and evicts by cost; other groups run one model at a "
           "time (Helm `controller.gpuProfiles`).", Kind.JSON),
    EnvVar("FLEXINFER_POD_ENDPOINTS", "true",
           "Ask a starting model pod's server directly (its readiness probe's path and port) so the Model is Ready "
           "as soon as it answers, and publish a Ready model's one pod as `status.podEndpoint`, where the "
           "in-cluster proxy forwards; false: the kubelet's probes decide Ready and every request goes through "
           "the model's Service (Helm `controller.podEndpoints`).", Kind.BOOL),
    EnvVar("FLEXINFER_GROUP_STRATEGIES", "", "How shared GPU groups run, `GROUP=STRATEGY,...` (`GROUP`: a "
           "`spec.gpu.shared` value, or `namespace/group`, which wins): `Exclusive` (default: one Deployment per "
           "Model, swaps scale them), `TimeSliced` (one group pod holds the GPU and runs `flexinfer serve` over "
           "the members, one at a time) or `MemoryShared` (the group pod packs members by memory) (Helm "
           "`controller.groupStrategies`).", Kind.PAIRS),
)


@dataclass(frozen=True)
class ManagerConfig:
    """Everything ``flexinfer manager`` is configured with."""

    metrics_bind_address: str = DEFAULT_METRICS
    health_probe_bind_address: str = DEFAULT_HEALTH
    leader_elect: bool = False
    pod_namespace: str = "default"
    identity: str = ""
    kubeconfig: str | None = None
    namespaces: tuple[str, ...] = ()
    """Namespaces to watch; empty = the whole cluster."""
    workers: int = 4
    policy: ManagerPolicy = field(default_factory=ManagerPolicy)
    defaults: ControllerDefaults = field(default_factory=ControllerDefaults)
    lease_duration: int = 15
    renew_every: float = 5.0


def _bind_address(read: EnvReader, flag_value: str | None, name: str, flag: str, default: str) -> str:
    """The flag's value, else the variable's, else ``default``; ``ConfigError`` names where a bad one came from."""
    if flag_value:
        parse_bind_address(flag_value, flag)
        return flag_value
    value = read.text(name, default)
    parse_bind_address(value, f"{name} ({flag})")
    return value


def manager_config(env: Mapping[str, str], *, metrics_bind_address: str | None = None,
                   health_probe_bind_address: str | None = None, leader_elect: bool | None = None,
                   kubeconfig: str | None = None, namespaces: Sequence[str] = ()) -> ManagerConfig:
    """Resolve flags (``None`` = not given) over ``env``; ``ConfigError`` names a bad value."""
    read = EnvReader(env)
    metrics = _bind_address(read, metrics_bind_address, "METRICS_BIND_ADDRESS", "--metrics-bind-address",
                            DEFAULT_METRICS)
    health = _bind_address(read, health_probe_bind_address, "HEALTH_PROBE_BIND_ADDRESS",
                           "--health-probe-bind-address", DEFAULT_HEALTH)
    elect = leader_elect if leader_elect is not None else read.flag("LEADER_ELECT", False)
    identity = read.text("POD_NAME") or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    knobs = swap_knobs(env)
    return ManagerConfig(
        metrics_bind_address=metrics, health_probe_bind_address=health, leader_elect=elect,
        pod_namespace=read.text("POD_NAMESPACE", "default"), identity=identity,
        kubeconfig=kubeconfig, namespaces=tuple(namespaces),
        workers=read.integer("FLEXINFER_MANAGER_WORKERS", 4, minimum=1),
        policy=ManagerPolicy(election=ElectionPolicy(min_hold=knobs.min_hold, max_wait=knobs.max_wait),
                             drain_timeout=read.duration("FLEXINFER_SWAP_DRAIN_TIMEOUT", DEFAULT_DRAIN_TIMEOUT_S),
                             gpu_profiles=parse_gpu_profiles(read.raw("FLEXINFER_GPU_PROFILES")),
                             pod_endpoints=read.flag("FLEXINFER_POD_ENDPOINTS", True),
                             group_strategies=parse_group_strategies(read.raw("FLEXINFER_GROUP_STRATEGIES")),
                             group_pod_env=tuple((name, env[name]) for name in GROUP_POD_ENV if env.get(name))),
        defaults=controller_defaults(env, warn=settings.warn),
    )
