"""Pod volumes of a model server and the flash-loader init containers (spec §1.4, §2.3, §2.4).

Volumes: ``model`` (weights, by cache strategy), ``shm`` (``/dev/shm`` memory emptyDir), ``flash-tmpfs``
(RAM copy of the weights: hostPath under ``/dev/shm/flexinfer`` for shared models so it survives swaps,
memory emptyDir otherwise) and ``compile-cache``. The flash-loader sees only the model's own weights under
``/src`` (the ``pvc://`` sub path, or a ``file:///models/…`` source's file and the other parts of a split
GGUF), never the rest of the volume; a shared model's hostPath, which the kubelet creates root-owned, is first
handed to the loader's user by the ``flash-tmpfs-owner`` init container (root with ``CAP_CHOWN`` only). Pure;
used by ``flexinfer.core.manifests.deployment``.
"""

from __future__ import annotations

import re
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
SPLIT_GGUF = re.compile(r"(.+)-(\d{5})-of-(\d{5})\.gguf")
"""A part of a split GGUF (llama.cpp's ``gguf-split`` names): the server finds the other parts beside it."""
LOADER_UID = 65532
"""The flash-loader's user and group (the FlexInfer image's ``USER``); it owns what it stages."""
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


def staged_sub_paths(model: Model) -> list[str]:
    """The parts of the ``model`` volume that hold this model's weights (``[]``: all of it): a ``pvc://``
    source's sub path (what the server mounts), or a ``file://`` source's path below ``/models`` (the mount of a
    ``SharedPVC``/``Local`` cache) with the other parts of a split GGUF (``x-00001-of-00003.gguf``)."""
    if is_pvc_source(model):
        sub_path = pvc_source_parts(model)[1]
        return [sub_path] if sub_path else []
    scheme, _, rest = model.spec.source.partition("://")
    path = "/" + rest.strip("/")
    if scheme.lower() != "file" or not path.startswith(MODEL_MOUNT + "/"):
        return []
    sub_path = path[len(MODEL_MOUNT) + 1:]
    split = SPLIT_GGUF.fullmatch(sub_path)
    if split is None:
        return [sub_path]
    prefix, count = split.group(1), int(split.group(3))
    return [f"{prefix}-{part:05d}-of-{count:05d}.gguf" for part in range(1, count + 1)]


def flash_loader_container(model: Model, config: FlashLoaderConfig) -> Json:
    """The ``flash-loader`` init container copying ``/src`` (read-only: the model's own weights, at the same path
    below ``/src`` as below the volume's root) into the tmpfs at ``/models``."""
    container: Json = {"name": "flash-loader", "image": config.image}
    if config.image.split("@", 1)[0].rsplit(":", 1)[0] == FLEXINFER_IMAGE_REPOSITORY:
        container["command"] = ["flexinfer", "flash-load"]
    sources = [{"name": "model", "mountPath": f"{FLASH_SRC_MOUNT}/{sub}", "subPath": sub, "readOnly": True}
               for sub in staged_sub_paths(model)]
    sources = sources or [{"name": "model", "mountPath": FLASH_SRC_MOUNT, "readOnly": True}]
    container.update({
        "imagePullPolicy": "IfNotPresent",
        "env": _flash_env(model, config),
        "volumeMounts": [*sources, {"name": "flash-tmpfs", "mountPath": MODEL_MOUNT}],
        "securityContext": {"allowPrivilegeEscalation": False, "runAsUser": LOADER_UID, "runAsGroup": LOADER_UID,
                            "runAsNonRoot": True},
        **TERMINATION_MESSAGE,
    })
    return container


def flash_tmpfs_owner_container(config: FlashLoaderConfig) -> Json:
    """Before the flash-loader of a shared model: give the node's ``/dev/shm/flexinfer/<ns>/<model>`` (created
    root-owned, mode 755, by the kubelet) to the loader's user. A pod's ``fsGroup`` does not apply to a hostPath."""
    owner = f"{LOADER_UID}:{LOADER_UID}"
    return {
        "name": "flash-tmpfs-owner", "image": config.image, "imagePullPolicy": "IfNotPresent",
        "command": ["chown", owner, MODEL_MOUNT],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
        "volumeMounts": [{"name": "flash-tmpfs", "mountPath": MODEL_MOUNT}],
        "securityContext": {"runAsUser": 0, "runAsNonRoot": False, "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]}},
        **TERMINATION_MESSAGE,
    }


def flash_init_containers(model: Model, config: FlashLoaderConfig) -> list[Json]:
    """The init containers of a staged model: the owner step (shared models' hostPath only), then the loader."""
    loader = flash_loader_container(model, config)
    return [flash_tmpfs_owner_container(config), loader] if model.group is not None else [loader]


def _flash_env(model: Model, config: FlashLoaderConfig) -> list[Json]:
    paths = {conventions.FLASH_SRC: FLASH_SRC_MOUNT, conventions.FLASH_DST: MODEL_MOUNT}
    return [{"name": name, "value": value} for name, value in {**paths, **staging_variables(model, config)}.items()]
