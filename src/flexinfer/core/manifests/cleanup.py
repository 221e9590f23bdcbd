"""The Job that empties a deleted shared model's persistent flash tmpfs on its node (spec §2.5).

Only shared models get one (their tmpfs is a hostPath that outlives the pod), and only for a node their pod ran
on (the caller says which: ``status.gpu.node`` or a live pod's ``spec.nodeName``; a model that never ran leaves
nothing to clean, and a node selector alone names no node). The Job is pinned to that node by name, runs the
flash-loader's image (already on the node: it staged what is removed), and ends on its own: it is failed after
``CLEANUP_DEADLINE_S`` when it cannot run (the node went away, the image cannot be pulled) and deleted
``CLEANUP_TTL_S`` after it finished either way. It has no owner reference so it outlives the Model. Pure;
wrapped by ``flexinfer.core.manifests.render.render_tmpfs_cleanup_job``, which the Kubernetes engine's delete
handler and ``flexinfer uninstall`` call.
"""

from __future__ import annotations

from typing import Any

from flexinfer.api.conventions import MANAGED_BY, MANAGED_BY_LABEL, TMPFS_CLEANUP_LABEL
from flexinfer.api.model import Model
from flexinfer.core.manifests.deployment import model_tolerations
from flexinfer.core.manifests.volumes import FLASH_TMPFS_ROOT, TERMINATION_MESSAGE, flash_tmpfs_host_dir

CLEANUP_TTL_S = 120
CLEANUP_DEADLINE_S = 120
"""A cleanup that has not finished after this long (not scheduled, image not pulled) is failed by the Job
controller, which then deletes its pod; ``CLEANUP_TTL_S`` later the Job is gone too."""

Json = dict[str, Any]


def tmpfs_cleanup_job(model: Model, labels: dict[str, str], node: str, image: str) -> Json | None:
    """``<model>-tmpfs-cleanup`` running ``rm -rf /dev/shm/flexinfer/<ns>/<model>`` on ``node`` with ``image``;
    ``None`` for a model that is not shared or when no node is known."""
    if model.group is None or not node:
        return None
    pod_spec: Json = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}},
        "containers": [_cleanup_container(model, image)],
        "volumes": [{"name": "flash-tmpfs-root", "hostPath": {"path": FLASH_TMPFS_ROOT, "type": "DirectoryOrCreate"}}],
    }
    tolerations = model_tolerations(model)
    if tolerations:
        pod_spec["tolerations"] = tolerations
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": f"{model.name}-tmpfs-cleanup", "namespace": model.namespace,
                     "labels": {**labels, TMPFS_CLEANUP_LABEL: model.name}},
        "spec": {
            "backoffLimit": 1,
            "activeDeadlineSeconds": CLEANUP_DEADLINE_S,
            "ttlSecondsAfterFinished": CLEANUP_TTL_S,
            "template": {
                # Not the model's selector labels: the Service must never select this pod.
                "metadata": {"labels": {MANAGED_BY_LABEL: MANAGED_BY, TMPFS_CLEANUP_LABEL: model.name}},
                "spec": pod_spec,
            },
        },
    }


def _cleanup_container(model: Model, image: str) -> Json:
    """Root, to unlink in the root-owned parent; ``CAP_DAC_OVERRIDE`` only, to empty the loader-owned directory."""
    return {
        "name": "cleanup",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["rm", "-rf", flash_tmpfs_host_dir(model)],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
        "volumeMounts": [{"name": "flash-tmpfs-root", "mountPath": FLASH_TMPFS_ROOT}],
        "securityContext": {"runAsUser": 0, "runAsNonRoot": False, "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"], "add": ["DAC_OVERRIDE"]}},
        **TERMINATION_MESSAGE,
    }
