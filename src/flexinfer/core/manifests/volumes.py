"""Pod volumes of a model server and the flash-loader init container (spec §1.4, §2.3, §2.4).

Volumes: ``model`` (weights, by cache strategy), ``shm`` (``/dev/shm`` memory emptyDir), ``flash-tmpfs``
(RAM copy of the weights: hostPath under ``/dev/shm/flexinfer`` for shared models so it survives swaps,
memory emptyDir otherwise) and ``compile-cache``. Pure; used by ``flexinfer.core.manifests.deployment``.
"""

from __future__ import annotations

from typing import Any

from flexinfer.api import conventions
from flexinfer.api.model import Model
from flexinfer.core.cache_strategy import (
    cache_pvc_name,
    effective_cache_strategy,
    is_pvc_source,
    local_cache_dir,
    pvc_source_parts,
)
from flexinfer.core.controller_defaults import FLEXINFER_IMAGE_REPOSITORY
from flexinfer.core.flashloader_settings import FlashLoaderConfig, staging_variables
from flexinfer.core.profiles import COMPILE_CACHE_MOUNT

MODEL_MOUNT = "/models"
FLASH_SRC_MOUNT = "/src"
SHM_MOUNT = "/dev/shm"
FLASH_TMPFS_ROOT = "/dev/shm/flexinfer"
TERMINATION_MESSAGE = {"terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}

Json = dict[str, Any]


def flash_tmpfs_host_dir(model: Model) -> str:
    """Persistent tmpfs directory of a shared model on its node: ``/dev/shm/flexinfer/<ns>/<model>``."""
    return f"{FLASH_TMPFS_ROOT}/{model.namespace}/{model.name}"


def model_volume(model: Model) -> Json:
    """The ``model`` volume: the source PVC, or the cache chosen by the effective strategy."""
    if is_pvc_source(model):
        claim, _ = pvc_source_parts(model)
        return {"name": "model", "persistentVolumeClaim": {"claimName": claim}}
    strategy = effective_cache_strategy(model)
    if strategy == "Memory":
        return {"name": "model", "emptyDir": {"medium": "Memory"}}
    if strategy == "Local":
        return {"name": "model", "hostPath": {"path": local_cache_dir(model), "type": "DirectoryOrCreate"}}
    if strategy == "None":
        return {"name": "model", "emptyDir": {}}
    return {"name": "model", "persistentVolumeClaim": {"claimName": cache_pvc_name(model)}}


def model_mount(model: Model) -> Json:
    """The main container's ``model`` mount at ``/models`` (``subPath`` from a ``pvc://`` source)."""
    mount: Json = {"name": "model", "mountPath": MODEL_MOUNT}
    if is_pvc_source(model):
        _, sub_path = pvc_source_parts(model)
        if sub_path:
            mount["subPath"] = sub_path
    return mount


def shm_volume(size_limit: str) -> Json:
    """``/dev/shm`` for the model server (PyTorch/NCCL/RCCL need more than the 64 MiB default)."""
    return {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": size_limit}}


def flash_tmpfs_volume(model: Model, config: FlashLoaderConfig) -> Json:
    """Shared models: hostPath on the node's ``/dev/shm`` (no size limit); others: memory emptyDir."""
    if model.group is not None:
        return {"name": "flash-tmpfs", "hostPath": {"path": flash_tmpfs_host_dir(model), "type": "DirectoryOrCreate"}}
    empty_dir: Json = {"medium": "Memory"}
    if config.tmpfs_size_limit:
        empty_dir["sizeLimit"] = config.tmpfs_size_limit
    return {"name": "flash-tmpfs", "emptyDir": empty_dir}


def compile_cache_volume(host_dir: str) -> Json:
    """Persistent MIOpen/Triton kernel caches on the node."""
    return {"name": "compile-cache", "hostPath": {"path": host_dir, "type": "DirectoryOrCreate"}}


def compile_cache_mount() -> Json:
    return {"name": "compile-cache", "mountPath": COMPILE_CACHE_MOUNT}


def to_flash_tmpfs(mount: Json) -> Json:
    """The main container reads weights from RAM: its ``model`` mount becomes ``flash-tmpfs``."""
    return {**mount, "name": "flash-tmpfs"} if mount["name"] == "model" else mount


def flash_loader_container(model: Model, config: FlashLoaderConfig) -> Json:
    """The ``flash-loader`` init container copying ``/src`` (read-only) into the tmpfs at ``/models``."""
    container: Json = {"name": "flash-loader", "image": config.image}
    if config.image.split("@", 1)[0].rsplit(":", 1)[0] == FLEXINFER_IMAGE_REPOSITORY:
        container["command"] = ["flexinfer", "flash-load"]
    container.update({
        "imagePullPolicy": "IfNotPresent",
        "env": _flash_env(model, config),
        "volumeMounts": [
            {"name": "model", "mountPath": FLASH_SRC_MOUNT, "readOnly": True},
            {"name": "flash-tmpfs", "mountPath": MODEL_MOUNT},
        ],
        "securityContext": {"allowPrivilegeEscalation": False},
        **TERMINATION_MESSAGE,
    })
    return container


def _flash_env(model: Model, config: FlashLoaderConfig) -> list[Json]:
    paths = {conventions.FLASH_SRC: FLASH_SRC_MOUNT, conventions.FLASH_DST: MODEL_MOUNT}
    return [{"name": name, "value": value} for name, value in {**paths, **staging_variables(model, config)}.items()]
