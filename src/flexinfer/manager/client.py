"""The manager's writes to the API server, over a lightkube ``AsyncClient``; bodies are plain dicts.

- ``apply``: server-side apply (field manager ``flexinfer``, force) of a rendered Deployment/Service, so
  only the fields FlexInfer renders are owned (replicas included) and an unchanged apply is a no-op;
- ``patch_model_status``: merge patch on ``models/status``; these two, the writes of every pass, go through the
  manager's ``PatchSession`` (aiohttp, ``flexinfer.manager.patch_session``) when it is given one; each of them
  and each ``delete`` is counted as a write of the running pass (``flexinfer.manager.own_writes``);
- ``delete`` (404 = done), ``create`` (a cleanup Job, a group pod's token Secret; 409 AlreadyExists = done),
  ``post_event`` (core/v1 Event; ``record_event`` posts one in the background, for a caller on a swap's path,
  and ``close`` waits up to ``EVENT_FLUSH_S`` for those still being posted);
- ``secret_value``: a group pod's admin token (``flexinfer.manager.group_pods``);
- Lease get/create/replace for leader election (optimistic concurrency through ``resourceVersion``);
- ``list_demands``: the proxies' ``ModelDemand`` reports of a namespace, read from the API server (not a
  cache) when a preemption must know every in-flight report written before it;
- ``model_pod_node``: the node of a model's newest pod bound to one (the tmpfs cleanup's target);
- ``pod_log_tail``: the newest lines of a loading (or a crashed) model server's log (``pods/log``), empty when
  unreadable.

Used by ``flexinfer.manager.reconciler``, ``flexinfer.manager.cleanup`` and ``flexinfer.manager.leader``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import socket
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, cast

import httpx2
from lightkube import ApiError, AsyncClient
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.batch_v1 import Job
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import ConfigMap, Event, Pod, PodLog, Secret, Service
from lightkube.types import PatchType

from flexinfer.api.conventions import MODEL_LABEL
from flexinfer.api.model import API_VERSION, KIND
from flexinfer.manager.own_writes import count_write
from flexinfer.manager.patch_session import PatchSession
from flexinfer.runtime.background import Background

log = logging.getLogger("flexinfer.manager")
Body = dict[str, Any]
FIELD_MANAGER = "flexinfer"
COMPONENT = "flexinfer-manager"
EVENT_FLUSH_S = 5.0
"""At ``close``, the longest wait for events still being posted in the background."""
ModelResource = create_namespaced_resource("ai.flexinfer", "v1alpha2", "Model", "models")
ModelDemandResource = create_namespaced_resource("ai.flexinfer", "v1alpha1", "ModelDemand", "modeldemands")
_KINDS: dict[str, Any] = {"Deployment": Deployment, "Service": Service, "Job": Job, "Lease": Lease, "Pod": Pod,
                          "ConfigMap": ConfigMap, "Secret": Secret}


def _plain(obj: Any) -> Body:
    return obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)


class KubeApi:
    """Thin async wrapper returning plain dicts (see the module docstring)."""

    def __init__(self, client: AsyncClient, patches: PatchSession | None = None) -> None:
        self.client = client
        self._patches = patches
        self.host = socket.gethostname()
        self._events = Background()

    async def apply(self, body: Body) -> Body:
        """Server-side apply ``body`` (a Deployment or Service); returns the live object."""
        meta = body["metadata"]
        return await self._patch(_KINDS[body["kind"]], meta["namespace"], meta["name"], body, PatchType.APPLY)

    async def patch_model_status(self, namespace: str, name: str, patch: Body) -> Body:
        """Merge-patch ``status`` of a Model; returns the whole object as stored."""
        return await self._patch(ModelResource.Status, namespace, name, {"status": patch}, PatchType.MERGE)

    async def _patch(self, kind: Any, namespace: str, name: str, body: Body, patch_type: PatchType) -> Body:
        """A patch (an apply is forced), answered with the API server's JSON as a dict. The request is built by
        lightkube and sent by the ``PatchSession`` when there is one (the manager's), else by lightkube's own
        client, without the typed object its ``patch`` would build and ``to_dict`` turn back into this dict."""
        count_write()
        generic = self.client._client
        prepared = generic.prepare_request(
            "patch", kind, body, name, namespace, headers={"Content-Type": patch_type.value},
            params={"fieldManager": FIELD_MANAGER, "force": "true" if patch_type == PatchType.APPLY else None})
        if self._patches is not None:
            return await self._patches.send(prepared)
        response = await generic.send(generic.build_adapter_request(prepared))  # type: ignore[no-untyped-call]
        generic.raise_for_status(response)  # type: ignore[no-untyped-call]
        return cast(Body, json.loads(response.content))

    async def list_demands(self, namespace: str) -> list[Body] | None:
        """Every ``ModelDemand`` in ``namespace``, listed without a resourceVersion (a quorum read);
        ``None`` when the read fails (logged)."""
        try:
            return [_plain(item) async for item in self.client.list(ModelDemandResource, namespace=namespace)]
        except (ApiError, httpx2.HTTPError, OSError) as error:
            log.warning("cannot list the proxy reports in %s: %s", namespace, error)
            return None

    async def model_pod_node(self, namespace: str, model: str) -> str:
        """The node of the newest pod of ``model`` that is bound to one (``""``: none)."""
        pods = [_plain(p) async for p in self.client.list(Pod, namespace=namespace, labels={MODEL_LABEL: model})]
        bound = [p for p in pods if (p.get("spec") or {}).get("nodeName")]
        newest = max(bound, key=lambda p: str(p["metadata"].get("creationTimestamp") or ""), default=None)
        return str(newest["spec"]["nodeName"]) if newest is not None else ""

    async def delete(self, kind: str, namespace: str, name: str, *, grace_period: int | None = None) -> bool:
        """Delete an object (``grace_period`` 0: a pod whose containers have exited); ``False`` when it was already
        gone."""
        count_write()
        try:
            await self.client.delete(_KINDS[kind], name, namespace=namespace, grace_period=grace_period)
        except ApiError as error:
            if error.status.code == 404:
                return False
            raise
        return True

    async def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        """The text under ``key`` of a Secret (``None``: no such Secret or key)."""
        try:
            secret = await self.client.get(Secret, name, namespace=namespace)
        except ApiError as error:
            if error.status.code == 404:
                return None
            raise
        encoded = (secret.data or {}).get(key)
        return base64.b64decode(encoded).decode() if encoded else None

    async def create(self, body: Body) -> bool:
        """Create ``body`` (a Job, a Secret); ``False`` when an object of that name already exists."""
        kind = _KINDS[body["kind"]]
        try:
            await self.client.create(kind.from_dict(body), field_manager=FIELD_MANAGER)
        except ApiError as error:
            if error.status.code == 409:
                return False
            raise
        return True

    async def post_event(self, model: Body, type_: str, reason: str, message: str) -> None:
        """Record a core/v1 Event on a Model (or the object ``model`` is: its apiVersion/kind are used when given);
        failures are logged, never raised."""
        meta = model.get("metadata") or {}
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name')}.", "namespace": meta.get("namespace")},
            "involvedObject": {"apiVersion": model.get("apiVersion") or API_VERSION, "kind": model.get("kind") or KIND,
                               "name": meta.get("name"),
                               "namespace": meta.get("namespace"), "uid": meta.get("uid"),
                               "resourceVersion": meta.get("resourceVersion")},
            "type": type_, "reason": reason, "message": message[:1024],
            "source": {"component": COMPONENT, "host": self.host},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1, "reportingComponent": COMPONENT,
        }
        try:
            await self.client.create(cast(Event, Event.from_dict(event)))
        except (ApiError, OSError) as error:
            log.warning("cannot record event %s on %s/%s: %s", reason, meta.get("namespace"), meta.get("name"), error)

    def record_event(self, model: Body, type_: str, reason: str, message: str) -> None:
        """``post_event`` in the background: the caller goes on without waiting for the API server."""
        self._events.spawn(self.post_event(model, type_, reason, message))

    async def get_lease(self, namespace: str, name: str) -> Body | None:
        try:
            return _plain(await self.client.get(Lease, name, namespace=namespace))
        except ApiError as error:
            if error.status.code == 404:
                return None
            raise

    async def create_lease(self, body: Body) -> Body:
        return _plain(await self.client.create(cast(Lease, Lease.from_dict(body))))

    async def replace_lease(self, body: Body) -> Body:
        """Replace a Lease; raises ``ApiError`` 409 when ``metadata.resourceVersion`` is stale."""
        return _plain(await self.client.replace(cast(Lease, Lease.from_dict(body))))

    async def pod_log_tail(self, namespace: str, pod: str, container: str, lines: int, *,
                           timeout: float = 3.0, previous: bool = False) -> Sequence[str]:
        """The newest ``lines`` lines of ``container``'s log (``previous``: of its last run, which crashed);
        empty when the log cannot be read within ``timeout`` (pod not on a node yet, kubelet slow or unreachable,
        no ``pods/log`` permission): the status then says what the container state says, and the reconcile is
        never held up for long."""
        try:
            async with asyncio.timeout(timeout):
                if previous:
                    return await self._previous_log(namespace, pod, container, lines)
                return [line async for line in self.client.log(pod, namespace=namespace, container=container,
                                                                tail_lines=lines, newlines=False)]
        except (ApiError, httpx2.HTTPError, OSError, TimeoutError) as error:
            log.debug("cannot read the log of %s/%s (%s): %s", namespace, pod, container, error)
            return []

    async def _previous_log(self, namespace: str, pod: str, container: str, lines: int) -> list[str]:
        """``pods/log?previous=true``: lightkube's ``log`` has no ``previous`` parameter, so the request is built
        with its own request builder (the same path, auth and error handling)."""
        generic = self.client._client
        request = generic.build_adapter_request(generic.prepare_request(
            "get", PodLog, name=pod, namespace=namespace,
            params={"container": container, "tailLines": lines, "previous": "true"}))
        response = await generic.send(request)  # type: ignore[no-untyped-call]
        generic.raise_for_status(response)  # type: ignore[no-untyped-call]
        return str(response.text).splitlines()

    async def close(self) -> None:
        """Close the client once the events posted in the background are sent (those not sent within
        ``EVENT_FLUSH_S`` are dropped)."""
        await self._events.close(EVENT_FLUSH_S)
        await self.client.close()
