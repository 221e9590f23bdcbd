"""The Job that empties a deleted shared model's persistent flash tmpfs on its node (spec §2.5).

Only shared models with a ``spec.nodeSelector`` get one (without it the node is unknown). The Job has no
owner reference so it outlives the Model. Pure; wrapped by ``flexinfer.core.manifests.render.render_tmpfs_cleanup_job``,
which the Kubernetes engine's delete handler calls.
"""

from __future__ import annotations

from typing import Any

from flexinfer.api.conventions import MANAGED_BY, MANAGED_BY_LABEL, TMPFS_CLEANUP_LABEL
from flexinfer.api.model import Model
from flexinfer.core.manifests.volumes import FLASH_TMPFS_ROOT, TERMINATION_MESSAGE, flash_tmpfs_host_dir

CLEANUP_IMAGE = "busybox:1.37"
CLEANUP_TTL_S = 120

Json = dict[str, Any]


def tmpfs_cleanup_job(model: Model, labels: dict[str, str]) -> Json | None:
    """``<model>-tmpfs-cleanup`` running ``rm -rf /dev/shm/flexinfer/<ns>/<model>``, or ``None``."""
    if model.group is None or not model.spec.node_selector:
        return None
    pod_spec: Json = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "nodeSelector": dict(model.spec.node_selector),
        "containers": [_cleanup_container(model)],
        "volumes": [{"name": "flash-tmpfs-root", "hostPath": {"path": FLASH_TMPFS_ROOT, "type": "DirectoryOrCreate"}}],
    }
    if model.gpu_count > 0:
        pod_spec["tolerations"] = [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": f"{model.name}-tmpfs-cleanup", "namespace": model.namespace, "labels": dict(labels)},
        "spec": {
            "backoffLimit": 1,
            "ttlSecondsAfterFinished": CLEANUP_TTL_S,
            "template": {
                # Not the model's selector labels: the Service must never select this pod.
                "metadata": {"labels": {MANAGED_BY_LABEL: MANAGED_BY, TMPFS_CLEANUP_LABEL: model.name}},
                "spec": pod_spec,
            },
        },
    }


def _cleanup_container(model: Model) -> Json:
    return {
        "name": "cleanup",
        "image": CLEANUP_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["rm", "-rf", flash_tmpfs_host_dir(model)],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "32Mi"}},
        "volumeMounts": [{"name": "flash-tmpfs-root", "mountPath": FLASH_TMPFS_ROOT}],
        "securityContext": {"allowPrivilegeEscalation": False},
        **TERMINATION_MESSAGE,
    }
