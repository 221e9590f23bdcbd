"""Names FlexInfer writes on stored objects: labels, annotations, prefixes, the finalizer, the flash-loader's
environment contract.

These names are a wire between programs (the manager, the in-cluster proxy, the flash-loader init container,
kubectl users, the Go reference): each is defined here once and imported by whoever writes or reads it. A
name already on stored objects keeps its spelling, even where it is irregular, so existing clusters keep
working across an upgrade.
"""

from __future__ import annotations

from typing import Final

DOMAIN: Final = "flexinfer.ai"
"""The prefix of FlexInfer's labels and annotations (the API group, ``ai.flexinfer``, is the reverse)."""

# Labels (and the pod annotations that repeat them) on the Deployments, Services and Pods the manager renders.
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "flexinfer"
MODEL_LABEL: Final = f"{DOMAIN}/model"
"""The Model's name, on its Deployment, Service and Pods (label) and on its Pods (annotation)."""
BACKEND_LABEL: Final = f"{DOMAIN}/backend"
GPU_GROUP_LABEL: Final = f"{DOMAIN}/gpu-group"
"""The shared-GPU group of a model that has one."""
GROUP_POD_LABEL: Final = f"{DOMAIN}/group-pod"
"""The group's name, on the ConfigMap, Deployment, Service and Pod of a group that runs in one group pod."""
TMPFS_CLEANUP_LABEL: Final = f"{DOMAIN}/tmpfs-cleanup"
"""On the pod of the Job that empties a deleted model's flash-loader tmpfs (never the model's selector)."""
PROXY_LABEL: Final = f"{DOMAIN}/proxy"
"""On a ModelDemand: the identity of the proxy replica that reports through it."""

# Annotations.
VRAM_ESTIMATE_ANNOTATION: Final = f"{DOMAIN}/gpu.vram-estimate-mb"
SERVICE_LABELS_ANNOTATION: Final = f"{DOMAIN}/service-labels"
ENDPOINT_OVERRIDE_ANNOTATION: Final = f"{DOMAIN}/endpoint-override"
"""On a Model: the URL the in-cluster proxy uses instead of ``status.endpoint`` (test-only, opt-in)."""
WAITING_SINCE_ANNOTATION: Final = f"{DOMAIN}/waiting-since"
"""On a Model: when a request began waiting for it (the shared-group election's queue order)."""
INFLIGHT_PREFIX: Final = f"inflight.{DOMAIN}/"
"""Prefix of the per-proxy in-flight annotations on a Model: ``inflight.flexinfer.ai/<proxy>``."""
ACTIVE_SERVICES_ANNOTATION: Final = "ai.flexinfer/active-services"
"""On a Service: the serving model names behind it. The domain is reversed (it was first written with the API
group's spelling); the name stays as stored so existing Services keep being read and updated."""

FINALIZER: Final = f"{DOMAIN}/model-cleanup"
"""On a Model: released once the manager has cleaned up after it."""

# The flash-loader init container's environment (written by the manifest renderer, read by ``flash-load``).
FLASH_SRC: Final = "FLASH_SRC"
FLASH_DST: Final = "FLASH_DST"
FLASH_CONCURRENCY: Final = "FLASH_CONCURRENCY"
FLASH_BUFFER_KB: Final = "FLASH_BUFFER_KB"
FLASH_VERIFY: Final = "FLASH_VERIFY"
FLASH_EXCLUDE: Final = "FLASH_EXCLUDE"
FLASH_VARIANT: Final = "FLASH_VARIANT"
FLASH_MAX_RATE: Final = "FLASH_MAX_RATE"
