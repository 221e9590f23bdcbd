"""The Deployment of one Model's server pod (spec §1.4, §2.3, §2.4) as a plain dict.

Pure; ``flexinfer.core.manifests.render.render_model`` calls ``render_deployment`` with resolved settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from flexinfer.api.model import Model
from flexinfer.core.cache_strategy import is_pvc_source
from flexinfer.core.controller_defaults import ControllerDefaults
from flexinfer.core.envvalues import duration_or_none
from flexinfer.core.flashloader_settings import FlashLoaderConfig
from flexinfer.core.manifests.volumes import (
    MODEL_MOUNT,
    SHM_MOUNT,
    TERMINATION_MESSAGE,
    compile_cache_mount,
    compile_cache_volume,
    flash_init_containers,
    flash_tmpfs_volume,
    model_mount,
    model_volume,
    shm_volume,
    to_flash_tmpfs,
)
from flexinfer.core.profiles import (
    BackendDefaults,
    RuntimeProfile,
    backend_defaults,
    compile_cache_host_dir,
    config_args,
    parallel_args,
    served_name_args,
)

Json = dict[str, Any]
GPU_TOLERATION: Json = {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
DEFAULT_STARTUP_TIMEOUT_S = 900.0
STARTUP_PROBE_PERIOD_S = 1
"""The startup probe asks every second, so a server is seen up about a second after it listens; its failure
threshold spreads the model's start-up budget (``spec.config.startupTimeout``) over these periods."""
READINESS_PROBE_PERIOD_S = 2
READINESS_FAILURE_THRESHOLD = 15
"""Once started: readiness every 2 s (the kubelet may wait one period after the startup probe passes before it
asks), and a server busy for up to 30 s in a row (15 failed probes) stays Ready."""
HF_HOME = f"{MODEL_MOUNT}/.cache/huggingface"


@dataclass(frozen=True)
class PodInputs:
    """Everything the pod template depends on besides the Model itself."""

    defaults: ControllerDefaults
    flash_loader: FlashLoaderConfig
    profile: RuntimeProfile
    labels: dict[str, str]
    selector: dict[str, str]
    annotations: dict[str, str]


def render_deployment(model: Model, inputs: PodInputs, replicas: int, metadata: Json) -> Json:
    """``apps/v1 Deployment`` named after the model; ``maxSurge: 0`` so two GPU pods never coexist."""
    spec: Json = {
        "replicas": replicas,
        "selector": {"matchLabels": dict(inputs.selector)},
        "template": {
            "metadata": {"labels": dict(inputs.labels), "annotations": dict(inputs.annotations)},
            "spec": pod_spec(model, inputs, replicas),
        },
    }
    if model.gpu_count > 0:
        spec["strategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata, "spec": spec}


def pod_spec(model: Model, inputs: PodInputs, replicas: int) -> Json:
    """The pod: scheduling, security, volumes, the flash-loader and the ``model`` container."""
    backend = backend_defaults(model)
    volumes, mounts = _volumes_and_mounts(model, inputs, backend)
    spec: Json = {
        "serviceAccountName": "default",
        "automountServiceAccountToken": False,
        "restartPolicy": "Always",
        "containers": [_model_container(model, inputs, backend, mounts)],
        "volumes": volumes,
    }
    if inputs.flash_loader.enabled and backend.needs_volume:
        spec["initContainers"] = flash_init_containers(model, inputs.flash_loader)
    spec.update(_scheduling(model, inputs, replicas))
    return spec


def _volumes_and_mounts(model: Model, inputs: PodInputs, backend: BackendDefaults) -> tuple[list[Json], list[Json]]:
    volumes: list[Json] = [shm_volume(inputs.defaults.shm_size_limit)]
    mounts: list[Json] = [{"name": "shm", "mountPath": SHM_MOUNT}]
    if backend.needs_volume:
        volumes.insert(0, model_volume(model))
        mount = model_mount(model)
        if inputs.flash_loader.enabled:
            volumes.append(flash_tmpfs_volume(model, inputs.flash_loader))
            mount = to_flash_tmpfs(mount)
        mounts.insert(0, mount)
    compile_dir = compile_cache_host_dir(model, inputs.profile)
    if compile_dir is not None:
        volumes.append(compile_cache_volume(compile_dir))
        mounts.append(compile_cache_mount())
    return volumes, mounts


def _scheduling(model: Model, inputs: PodInputs, replicas: int) -> Json:
    out: Json = {}
    if model.spec.node_selector:
        out["nodeSelector"] = dict(model.spec.node_selector)
    tolerations = model_tolerations(model)
    if tolerations:
        out["tolerations"] = tolerations
    if model.gpu_count > 0 and inputs.profile.supplemental_groups:
        out["securityContext"] = {"supplementalGroups": list(inputs.profile.supplemental_groups)}
    if model.gpu_count > 0 and inputs.profile.runtime_class_name:
        out["runtimeClassName"] = inputs.profile.runtime_class_name
    if replicas > 1:
        out.update(_spread(inputs.selector))
    return out


def model_tolerations(model: Model) -> list[Json]:
    """The GPU toleration (GPU models), then ``spec.tolerations``."""
    tolerations = [dict(GPU_TOLERATION)] if model.gpu_count > 0 else []
    return tolerations + [t.to_dict() for t in model.spec.tolerations]


def _spread(selector: dict[str, str]) -> Json:
    """Multi-replica: never two replicas on one node; spread across nodes when possible."""
    term = {"labelSelector": {"matchLabels": dict(selector)}, "topologyKey": "kubernetes.io/hostname"}
    return {
        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}},
        "topologySpreadConstraints": [{
            "maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": dict(selector)},
        }],
    }


def _model_container(model: Model, inputs: PodInputs, backend: BackendDefaults, mounts: list[Json]) -> Json:
    container: Json = {"name": "model", "image": model_image(model, inputs.defaults, inputs.profile),
                       "imagePullPolicy": inputs.defaults.model_image_pull_policy}
    args = container_args(model, backend)
    if args:
        container["args"] = args
    container.update({
        "ports": [{"name": "http", "containerPort": backend.port, "protocol": "TCP"}],
        "env": _container_env(model, inputs, backend),
        "resources": _resources(model, inputs.profile),
        "volumeMounts": mounts,
        "readinessProbe": {"httpGet": {"path": backend.readiness_path, "port": "http"},
                           "periodSeconds": READINESS_PROBE_PERIOD_S,
                           "failureThreshold": READINESS_FAILURE_THRESHOLD},
        "startupProbe": {"httpGet": {"path": backend.startup_path, "port": "http"},
                         "periodSeconds": STARTUP_PROBE_PERIOD_S,
                         "failureThreshold": _startup_failure_threshold(model)},
        "securityContext": {"allowPrivilegeEscalation": False},
        **TERMINATION_MESSAGE,
    })
    return container


def model_image(model: Model, defaults: ControllerDefaults, profile: RuntimeProfile) -> str:
    """``spec.image`` → ``DEFAULT_<BACKEND>_IMAGE`` → the backend's image for the profile flavour."""
    if model.spec.image:
        return model.spec.image
    backend = backend_defaults(model)
    override = defaults.backend_images.get(backend.name)
    return override or backend.images[profile.image_flavour]


def model_reference(model: Model) -> str:
    """What the server is told to load: the HF repo id, ``/models`` for pvc://, the path for file://."""
    scheme, _, rest = model.spec.source.partition("://")
    if is_pvc_source(model):
        return MODEL_MOUNT
    if scheme.lower() == "file":
        return "/" + rest.lstrip("/")
    return rest.strip("/")


def container_args(model: Model, backend: BackendDefaults) -> list[str]:
    """The backend's argument template with ``{model}``/``{port}`` filled in, the name the server answers to
    (``--alias NAME`` for llama.cpp, ``--served-model-name NAME`` for vLLM: the local engine's name, not the
    path it loads), the arguments that make it log what it allocates (``--verbosity 4`` for llama.cpp, as
    locally: ``BackendDefaults.log_args``), its parallel capacity (``--parallel N`` for llama.cpp: the number
    of requests the proxy lets through to it at once; left to ``spec.config.args`` when they set it), then
    ``spec.config.args`` unchanged and last (as the local engine appends them)."""
    args = [arg.format(model=model_reference(model), port=backend.port) for arg in backend.args]
    if backend.hf_model_flag and model.spec.source.lower().startswith("hf://"):
        args = [backend.hf_model_flag if arg == "--model" else arg for arg in args]
    return (args + list(served_name_args(model)) + list(backend.log_args) + list(parallel_args(model))
            + list(config_args(model)))


def _container_env(model: Model, inputs: PodInputs, backend: BackendDefaults) -> list[Json]:
    pairs = list(backend.env) + list(inputs.profile.env)
    if compile_cache_host_dir(model, inputs.profile) is not None:
        pairs += list(inputs.profile.compile_cache_env)
    if backend.needs_volume and model.spec.source.lower().startswith("hf://"):
        pairs += [("HF_HOME", HF_HOME), ("HF_HUB_CACHE", f"{HF_HOME}/hub")]
    return [{"name": name, "value": value} for name, value in pairs]


def _resources(model: Model, profile: RuntimeProfile) -> Json:
    spec = model.spec.resources
    limits = dict(spec.limits) if spec else {}
    requests = dict(spec.requests) if spec else {}
    limits.update(gpu_limit(model, profile))
    return resources_block(limits, requests)


def resources_block(limits: dict[str, str], requests: dict[str, str]) -> Json:
    """A container's ``resources`` with only the parts that have entries."""
    out: Json = {}
    if limits:
        out["limits"] = limits
    if requests:
        out["requests"] = requests
    return out


def gpu_limit(model: Model, profile: RuntimeProfile) -> dict[str, str]:
    """``{<device-plugin resource>: <spec.gpu.count>}`` for a GPU model whose profile has a resource, else ``{}``."""
    if model.gpu_count > 0 and profile.gpu_resource:
        return {profile.gpu_resource: str(model.gpu_count)}
    return {}


def _startup_failure_threshold(model: Model) -> int:
    """``spec.config.startupTimeout`` (a duration) divided into probe periods; default 15 minutes."""
    raw = model.spec.config.get("startupTimeout")
    seconds = duration_or_none(str(raw)) if raw is not None else None
    return max(1, math.ceil((seconds or DEFAULT_STARTUP_TIMEOUT_S) / STARTUP_PROBE_PERIOD_S))
