"""What happens when a Model is deleted (spec §2.5), run by the kopf deletion handler before the
finalizer ``flexinfer.ai/model-cleanup`` is released, and by ``flexinfer uninstall`` for every Model.

Delete the model's Deployment and Service (already gone = fine), then, for a shared model whose pod ran on a
node (its newest bound pod's node, else ``status.gpu.node``: where it last ran), create the
``<model>-tmpfs-cleanup`` Job on that node (AlreadyExists = fine). A model that never ran gets no Job: there is
nothing to clean, and a Job pinned to a node that never held its tmpfs (or does not exist) would never run.
Every failure is logged and the deletion proceeds: a cleanup problem must never keep a Model stuck in
Terminating. Used by ``flexinfer.manager.program`` and ``flexinfer.manager.uninstall``.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx2
from lightkube import ApiError

from flexinfer.api.errors import InvalidResourceError
from flexinfer.api.loading import parse_stored
from flexinfer.api.model import Model
from flexinfer.core.controller_defaults import ControllerDefaults
from flexinfer.core.manifests.group_pod import group_pod_name
from flexinfer.core.manifests.render import render_tmpfs_cleanup_job
from flexinfer.manager.client import KubeApi

log = logging.getLogger("flexinfer.manager")
Body = dict[str, Any]


def parsed_model(body: Body) -> Model | None:
    try:
        resource = parse_stored(body).resource
    except InvalidResourceError:
        return None
    return resource if isinstance(resource, Model) else None


def last_node(body: Body) -> str:
    """``status.gpu.node`` as stored: the node the model's pod last ran on."""
    gpu = (body.get("status") or {}).get("gpu") or {}
    return str(gpu.get("node") or "")


async def cleanup_model(api: KubeApi, body: Body, defaults: ControllerDefaults, *,
                        group_pod: bool = False) -> list[str]:
    """Delete the Deployment and Service (with ``group_pod``, its group pod's too: every member is being
    released), create the tmpfs cleanup Job; returns what was done."""
    meta = body.get("metadata") or {}
    namespace, name = str(meta.get("namespace")), str(meta.get("name"))
    done: list[str] = []
    model = parsed_model(body)
    node = await _node(api, namespace, name, body) if model is not None and model.group is not None else ""
    names = [name]
    if group_pod and model is not None and model.group is not None:
        names.append(group_pod_name(model.group))
    for kind, named in ((kind, named) for named in names for kind in ("Deployment", "Service")):
        try:
            if await api.delete(kind, namespace, named):
                done.append(f"deleted {kind} {named}")
        except (ApiError, OSError) as error:
            log.warning("model %s/%s: cannot delete %s %s: %s (continuing)", namespace, name, kind, named, error)
    job = render_tmpfs_cleanup_job(model, node, defaults) if model is not None else None
    if job is not None:
        try:
            created = await api.create(job)
            done.append(f"{'created' if created else 'kept existing'} Job {job['metadata']['name']} on node {node}")
        except (ApiError, OSError) as error:
            log.warning("model %s/%s: cannot create the tmpfs cleanup Job: %s (continuing)", namespace, name, error)
    log.info("model %s/%s deleted: %s", namespace, name, ", ".join(done) or "nothing to clean up")
    return done


async def _node(api: KubeApi, namespace: str, name: str, body: Body) -> str:
    """Where the model's persistent tmpfs is: its newest bound pod's node, else the node it last ran on."""
    try:
        current = await api.model_pod_node(namespace, name)
    except (ApiError, httpx2.HTTPError, OSError) as error:
        log.warning("model %s/%s: cannot list its pods: %s (using status.gpu.node)", namespace, name, error)
        current = ""
    return current or last_node(body)
