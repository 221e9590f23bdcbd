"""Manifest rendering: a Model (+ controller defaults + ModelCaches) → the objects the manager applies.

``render_model`` returns the Deployment and the Service (spec §1.4) as plain dicts;
``render_tmpfs_cleanup_job`` the Job run when a shared model is deleted (spec §2.5). Pure: the manager's
reconcile plan (``flexinfer.core.unit_plan``) renders with the member's planned replicas and the manager
applies the result; ``flexinfer render`` prints it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flexinfer.api.conventions import (
    BACKEND_LABEL,
    GPU_GROUP_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    MODEL_LABEL,
    SERVICE_LABELS_ANNOTATION,
    VRAM_ESTIMATE_ANNOTATION,
)
from flexinfer.api.model import API_VERSION, KIND, Model
from flexinfer.api.modelcache import ModelCache
from flexinfer.core.controller_defaults import ControllerDefaults
from flexinfer.core.flashloader_settings import FlashLoaderConfig, resolve_flash_loader
from flexinfer.core.manifests.cleanup import tmpfs_cleanup_job
from flexinfer.core.manifests.deployment import PodInputs, render_deployment
from flexinfer.core.profiles import RuntimeProfile, backend_defaults, runtime_profile

__all__ = [
    "model_labels", "owner_reference", "render_model", "render_service", "render_tmpfs_cleanup_job",
    "selector_labels",
]

Json = dict[str, Any]


def selector_labels(model: Model) -> dict[str, str]:
    """Labels selecting the model's pods (immutable Deployment selector, Service selector)."""
    return {
        "app.kubernetes.io/name": "model",
        "app.kubernetes.io/instance": model.name,
        MANAGED_BY_LABEL: MANAGED_BY,
        MODEL_LABEL: model.name,
        BACKEND_LABEL: model.backend,
    }


def model_labels(model: Model) -> dict[str, str]:
    """Selector labels plus ``flexinfer.ai/gpu-group`` for shared-GPU models."""
    labels = selector_labels(model)
    if model.group is not None:
        labels[GPU_GROUP_LABEL] = model.group
    return labels


def pod_annotations(model: Model) -> dict[str, str]:
    """Model, backend and (when set) the VRAM estimate used for budgeting."""
    annotations = {MODEL_LABEL: model.name, BACKEND_LABEL: model.backend}
    if model.spec.gpu is not None and model.spec.gpu.vram_estimate_mb is not None:
        annotations[VRAM_ESTIMATE_ANNOTATION] = str(model.spec.gpu.vram_estimate_mb)
    return annotations


def owner_reference(model: Model) -> Json | None:
    """Controller owner reference to the Model (``None`` until the Model has a uid)."""
    if not model.metadata.uid:
        return None
    return {
        "apiVersion": API_VERSION, "kind": KIND, "name": model.name, "uid": model.metadata.uid,
        "controller": True, "blockOwnerDeletion": True,
    }


def _metadata(model: Model, annotations: dict[str, str] | None = None) -> Json:
    meta: Json = {"name": model.name, "namespace": model.namespace, "labels": model_labels(model)}
    if annotations:
        meta["annotations"] = annotations
    owner = owner_reference(model)
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return meta


def served_model_name(model: Model) -> str:
    """``litellm.servedModelName`` → ``config.servedModelName`` → the model name."""
    if model.spec.litellm is not None and model.spec.litellm.served_model_name:
        return model.spec.litellm.served_model_name
    configured = model.spec.config.get("servedModelName")
    return str(configured) if configured else model.name


def service_annotations(model: Model) -> dict[str, str]:
    """LiteLLM exposure and semantic routing labels."""
    annotations = {"litellm.flexinfer.ai/served-model": served_model_name(model)}
    litellm = model.spec.litellm
    if litellm is not None and litellm.aliases:
        annotations["litellm.flexinfer.ai/aliases"] = ",".join(litellm.aliases)
    if litellm is not None and litellm.copilot_alias:
        annotations["litellm.flexinfer.ai/copilot-model"] = litellm.copilot_alias
    if model.spec.service_labels:
        annotations[SERVICE_LABELS_ANNOTATION] = ",".join(model.spec.service_labels)
    return annotations


def render_service(model: Model) -> Json:
    """ClusterIP Service ``<model>`` with one port ``http`` = the backend port."""
    port = backend_defaults(model).port
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _metadata(model, service_annotations(model)),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(model),
            "ports": [{"name": "http", "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


def render_model(
    model: Model,
    caches: Sequence[ModelCache],
    defaults: ControllerDefaults,
    replicas: int,
    *,
    flash_loader: FlashLoaderConfig | None = None,
    profile: RuntimeProfile | None = None,
) -> list[Json]:
    """The Deployment and Service for ``model``; flash-loader settings and profile resolved unless given."""
    inputs = PodInputs(
        defaults=defaults,
        flash_loader=flash_loader or resolve_flash_loader(defaults, model, caches),
        profile=profile or runtime_profile(model),
        labels=model_labels(model),
        selector=selector_labels(model),
        annotations=pod_annotations(model),
    )
    return [render_deployment(model, inputs, replicas, _metadata(model)), render_service(model)]


def render_tmpfs_cleanup_job(model: Model, node: str, defaults: ControllerDefaults) -> Json | None:
    """The Job emptying a deleted shared model's ``/dev/shm/flexinfer/<ns>/<model>`` on ``node`` (where its pod
    ran), with the flash-loader image of ``defaults``; ``None`` if not needed."""
    return tmpfs_cleanup_job(model, model_labels(model), node, defaults.flash_loader.image)
