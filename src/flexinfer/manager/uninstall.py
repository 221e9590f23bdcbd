"""``flexinfer uninstall``: stop everything the manager runs before the manager itself is removed.

The Helm chart runs it as a pre-delete hook, so ``helm uninstall`` leaves no model pod holding a GPU, no
Model that cannot be deleted and no cleanup Job behind. In this order:

1. the manager is stopped (its Deployment scaled to zero, then its pods gone), so nothing recreates what
   the next steps remove;
2. every Model, in every namespace, is cleaned up as a deletion would (``flexinfer.manager.cleanup``: its
   Deployment and Service deleted, and its group pod's in group-pod mode; the tmpfs cleanup Job created on the
   node its pod ran on), and the
   finalizer ``flexinfer.ai/model-cleanup`` is removed. The Model objects themselves stay, like the CRDs: a
   later install runs them again; ``kubectl delete mdl`` now deletes them at once;
3. the tmpfs cleanup Jobs are waited for, then deleted with their pods (finished or not);
4. the model pods and the cleanup Jobs' pods are waited for until they are gone.

Each wait is bounded by one deadline; what is still there at the end (or an API error) is named in the log and
the exit code is 1 (the hook then fails, and ``helm uninstall`` with it, so the operator sees it). Built by
``flexinfer.cli.uninstall``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx2
from lightkube import ApiError, AsyncClient, operators
from lightkube.core.generic_client import ALL_NS
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Pod
from lightkube.types import CascadeType, PatchType

from flexinfer.api.conventions import FINALIZER, MANAGED_BY, MANAGED_BY_LABEL, TMPFS_CLEANUP_LABEL
from flexinfer.core.controller_defaults import ControllerDefaults
from flexinfer.manager.cleanup import cleanup_model
from flexinfer.manager.client import FIELD_MANAGER, KubeApi, ModelResource

log = logging.getLogger("flexinfer.manager")
Body = dict[str, Any]
POLL_S = 1.0
MANAGED_PODS: dict[str, Any] = {MANAGED_BY_LABEL: MANAGED_BY}
"""Model pods and cleanup Job pods."""
CLEANUP_JOBS: dict[str, Any] = {MANAGED_BY_LABEL: MANAGED_BY, TMPFS_CLEANUP_LABEL: operators.exists()}


@dataclass(frozen=True)
class UninstallPlan:
    """Where the manager runs (its Deployment), the namespaces of its Models (empty: all, as the chart's manager
    watches) and how long the whole run may take."""

    namespace: str
    manager: str
    timeout: float
    defaults: ControllerDefaults
    model_namespaces: tuple[str, ...] = ()


class Uninstall:
    """One run over one cluster (see the module docstring)."""

    def __init__(self, client: AsyncClient, plan: UninstallPlan) -> None:
        self.client, self.plan = client, plan
        self.api = KubeApi(client)
        self.deadline = time.monotonic() + plan.timeout
        self.scopes = list(plan.model_namespaces) or [ALL_NS]

    async def run(self) -> int:
        """0 when everything is stopped and cleaned up, 1 when something was left or the API failed (logged in
        one line: the hook's log is what the operator reads)."""
        try:
            return await self._run()
        except ApiError as error:
            log.error("the Kubernetes API refused a request (%s): %s", error.status.code, error.status.message)
        except (httpx2.HTTPError, OSError) as error:
            log.error("cannot reach the Kubernetes API: %s", error or type(error).__name__)
        return 1

    async def _run(self) -> int:
        if not await self.stop_manager():
            return 1
        models = [_plain(m) for m in await self._list(ModelResource)]
        for body in models:
            await self.release(body)
        log.info("%d Models stopped and released (kept: delete them with kubectl delete mdl, or install again)",
                 len(models))
        jobs_left = await self.finish_cleanup_jobs()
        pods_left = await self.wait(self.managed_pods, "model and cleanup pods to stop")
        if pods_left:
            log.error("pods still running: %s", ", ".join(pods_left))
        return 1 if jobs_left or pods_left else 0

    async def stop_manager(self) -> bool:
        """Scale the manager's Deployment to zero and wait until its pods are gone (False: still running)."""
        namespace, name = self.plan.namespace, self.plan.manager
        try:
            deployment = await self.client.get(Deployment, name, namespace=namespace)
        except ApiError as error:
            if error.status.code != 404:
                raise
            log.info("the manager %s/%s is not installed", namespace, name)
            return True
        await self.client.patch(Deployment, name, {"spec": {"replicas": 0}}, namespace=namespace,
                                patch_type=PatchType.MERGE, field_manager=FIELD_MANAGER)
        selector = dict((deployment.spec.selector.matchLabels or {}) if deployment.spec else {})

        async def manager_pods() -> list[str]:
            return [f"{namespace}/{p.metadata.name}" async for p in self.client.list(
                Pod, namespace=namespace, labels=selector) if p.metadata is not None]

        left = await self.wait(manager_pods, "the manager to stop")
        if left:
            log.error("the manager did not stop: %s still running", ", ".join(left))
            return False
        log.info("the manager %s/%s is stopped", namespace, name)
        return True

    async def release(self, body: Body) -> None:
        """Clean the Model up as its deletion would, then remove its finalizer."""
        await cleanup_model(self.api, body, self.plan.defaults, group_pod=True)
        meta = body.get("metadata") or {}
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        for _ in range(5):  # a concurrent edit moves the finalizer: read again and retry
            finalizers = list(meta.get("finalizers") or [])
            if FINALIZER not in finalizers:
                return
            at = finalizers.index(FINALIZER)
            patch = [{"op": "test", "path": f"/metadata/finalizers/{at}", "value": FINALIZER},
                     {"op": "remove", "path": f"/metadata/finalizers/{at}"}]
            try:
                await self.client.patch(ModelResource, name, patch, namespace=namespace, patch_type=PatchType.JSON)
                return
            except ApiError as error:
                if error.status.code == 404:
                    return
                if error.status.code not in (409, 422):
                    raise
            meta = _plain(await self.client.get(ModelResource, name, namespace=namespace)).get("metadata") or {}
        log.error("model %s/%s: cannot remove the finalizer %s", namespace, name, FINALIZER)

    async def finish_cleanup_jobs(self) -> list[str]:
        """Wait for the cleanup Jobs to finish, then delete them all; returns those that never finished."""
        unfinished = await self.wait(self.running_jobs, "the tmpfs cleanup Jobs to finish")
        for job in await self._list(Job, CLEANUP_JOBS):
            meta = job.metadata
            if meta is not None and meta.name:
                await self._delete_job(meta.name, str(meta.namespace))
        if unfinished:
            log.error("tmpfs cleanup Jobs that did not finish (deleted; empty /dev/shm/flexinfer/<namespace>/<model> "
                      "on their node by hand): %s", ", ".join(unfinished))
        return unfinished

    async def _delete_job(self, name: str, namespace: str) -> None:
        try:
            await self.client.delete(Job, name, namespace=namespace, cascade=CascadeType.BACKGROUND)
        except ApiError as error:
            if error.status.code != 404:
                raise

    async def running_jobs(self) -> list[str]:
        """Cleanup Jobs without a Complete or Failed condition."""
        running = []
        for job in await self._list(Job, CLEANUP_JOBS):
            conditions = (job.status.conditions or []) if job.status else []
            if not any(c.type in ("Complete", "Failed") and c.status == "True" for c in conditions):
                running.append(f"{job.metadata.namespace}/{job.metadata.name}" if job.metadata else "?")
        return running

    async def managed_pods(self) -> list[str]:
        return [f"{p.metadata.namespace}/{p.metadata.name}" for p in await self._list(Pod, MANAGED_PODS)
                if p.metadata is not None]

    async def _list(self, resource: Any, labels: dict[str, Any] | None = None) -> list[Any]:
        """Every object of ``resource`` (matching ``labels``) in the Models' namespaces."""
        return [item for scope in self.scopes
                async for item in self.client.list(resource, namespace=scope, labels=labels)]

    async def wait(self, left: Callable[[], Awaitable[list[str]]], what: str) -> list[str]:
        """Poll ``left`` until it is empty or the deadline passes; returns what was left (logged when it changes)."""
        shown: list[str] = []
        while True:
            remaining = await left()
            if not remaining or time.monotonic() >= self.deadline:
                return remaining
            if remaining != shown:
                log.info("waiting for %s: %s", what, ", ".join(remaining[:5]) + (" …" if len(remaining) > 5 else ""))
                shown = remaining
            await asyncio.sleep(POLL_S)


def _plain(obj: Any) -> Body:
    return obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)
