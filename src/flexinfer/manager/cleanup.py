"""What happens when a Model is deleted (spec §2.5), run by the kopf deletion handler before the
finalizer ``flexinfer.ai/model-cleanup`` is released.

Delete the model's Deployment and Service (already gone = fine), then create the ``<model>-tmpfs-cleanup``
Job for shared models pinned to a node (AlreadyExists = fine). Every failure is logged and the deletion
proceeds: a cleanup problem must never keep a Model stuck in Terminating. Used by ``flexinfer.manager.program``.
"""

from __future__ import annotations

import logging
from typing import Any

from lightkube import ApiError

from flexinfer.api.errors import InvalidResourceError
from flexinfer.api.loading import parse_stored
from flexinfer.api.model import Model
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


async def cleanup_model(api: KubeApi, body: Body) -> list[str]:
    """Delete the Deployment and Service, create the tmpfs cleanup Job; returns what was done."""
    meta = body.get("metadata") or {}
    namespace, name = str(meta.get("namespace")), str(meta.get("name"))
    done: list[str] = []
    for kind in ("Deployment", "Service"):
        try:
            if await api.delete(kind, namespace, name):
                done.append(f"deleted {kind} {name}")
        except (ApiError, OSError) as error:
            log.warning("model %s/%s: cannot delete %s: %s (continuing)", namespace, name, kind, error)
    model = parsed_model(body)
    job = render_tmpfs_cleanup_job(model) if model is not None else None
    if job is not None:
        try:
            created = await api.create_job(job)
            done.append(f"{'created' if created else 'kept existing'} Job {job['metadata']['name']}")
        except (ApiError, OSError) as error:
            log.warning("model %s/%s: cannot create the tmpfs cleanup Job: %s (continuing)", namespace, name, error)
    log.info("model %s/%s deleted: %s", namespace, name, ", ".join(done) or "nothing to clean up")
    return done
