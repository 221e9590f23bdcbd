"""The slice of the Kubernetes API the in-cluster proxy needs, as a small Protocol and its lightkube adapter.

``ModelApi``: list Models (with the list's resourceVersion), watch them from a resourceVersion, read one
Model afresh (a quorum read: the in-flight report's check that the model is still Ready), and write this
proxy replica's own ``ModelDemand`` reports (create, merge patch, JSON patch, delete). The proxy never
writes Models.
``LightkubeModelApi`` implements it over ``lightkube.AsyncClient``; unit tests implement it with an
in-memory fake for fault injection (410 Gone, conflicts, dropped watches).
Failures surface as ``KubeApiError`` (``status`` = HTTP code, ``None`` for transport errors);
``WatchExpiredError`` (410 Gone) tells the watcher to list again. Used by ``model_watch`` (the cache),
``demand_report`` (the reports) and built by ``flexinfer.assembly.run_proxy`` through ``connect`` (with
the kubeconfig from ``flexinfer.manager.connection.load_kubeconfig``, shared with the manager).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx2
from lightkube import ALL_NS, ApiError, AsyncClient, KubeConfig
from lightkube.generic_resource import create_namespaced_resource
from lightkube.types import PatchType

from flexinfer.api.model import KIND
from flexinfer.api.modeldemand import KIND as DEMAND_KIND
from flexinfer.api.modeldemand import PLURAL as DEMAND_PLURAL
from flexinfer.core.errors import EngineError
from flexinfer.runtime.kube_connections import kube_client

MODEL_GROUP, MODEL_VERSION, MODEL_PLURAL = "ai.flexinfer", "v1alpha2", "models"
ModelResource = create_namespaced_resource(MODEL_GROUP, MODEL_VERSION, KIND, MODEL_PLURAL)
"""The lightkube class for ``models.ai.flexinfer`` (generic: objects are plain dicts)."""
DemandResource = create_namespaced_resource(MODEL_GROUP, "v1alpha1", DEMAND_KIND, DEMAND_PLURAL)
"""The lightkube class for ``modeldemands.ai.flexinfer``."""


class KubeApiError(EngineError):
    """A Kubernetes API call failed; ``status`` is the HTTP status (``None``: no answer at all)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def retriable(self) -> bool:
        """Conflicts, throttling, server errors and transport failures are worth another try."""
        return self.status is None or self.status in (409, 429) or self.status >= 500

    @property
    def refused(self) -> bool:
        """422 Unprocessable Entity: for a JSON patch, a ``test`` failed or a path did not exist."""
        return self.status == 422


class WatchExpiredError(KubeApiError):
    """410 Gone: the watch's resourceVersion is too old; list again."""

    def __init__(self, message: str = "resourceVersion too old") -> None:
        super().__init__(message, 410)


@dataclass(frozen=True)
class ModelList:
    """A consistent snapshot: the Model documents and the resourceVersion to watch from."""

    items: list[dict[str, Any]]
    resource_version: str


@dataclass(frozen=True)
class WatchEvent:
    """One watch event: ``ADDED``, ``MODIFIED`` or ``DELETED`` with the Model document."""

    type: str
    object: dict[str, Any]


class ModelApi(Protocol):
    """What the proxy side calls on the API server. ``namespace=None`` means all namespaces."""

    async def list_models(self, namespace: str | None) -> ModelList: ...

    def watch_models(self, namespace: str | None, resource_version: str) -> AsyncIterator[WatchEvent]: ...

    async def get_model(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Model as stored now (``None`` when absent)."""

    async def create_demand(self, namespace: str, body: Mapping[str, Any]) -> None:
        """Create a ``ModelDemand`` (409 when it exists)."""

    async def patch_demand(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """Merge-patch a ``ModelDemand`` (404 when absent)."""

    async def replace_demand_spec(self, namespace: str, name: str, spec: Mapping[str, Any]) -> None:
        """Replace a ``ModelDemand``'s whole ``spec`` (a JSON patch; 404 when absent)."""

    async def delete_demand(self, namespace: str, name: str) -> None:
        """Delete a ``ModelDemand`` (404 when absent)."""


class LightkubeModelApi:
    """``ModelApi`` over one ``lightkube.AsyncClient`` (call ``aclose`` when done)."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    @classmethod
    def connect(cls, config: KubeConfig, field_manager: str = "flexinfer-proxy") -> LightkubeModelApi:
        return cls(kube_client(config, field_manager=field_manager))

    async def list_models(self, namespace: str | None) -> ModelList:
        try:
            listing = self._client.list(ModelResource, namespace=namespace or ALL_NS)
            items = [_plain(obj) async for obj in listing]
            return ModelList(items, listing.resourceVersion)
        except httpx2.HTTPError as exc:
            raise _api_error("list models", exc) from None

    async def watch_models(self, namespace: str | None, resource_version: str) -> AsyncIterator[WatchEvent]:
        stream = self._client.watch(ModelResource, namespace=namespace or ALL_NS, resource_version=resource_version)
        try:
            async for kind, obj in stream:
                yield WatchEvent(kind, _plain(obj))
        except httpx2.HTTPError as exc:
            raise _api_error("watch models", exc) from None
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    async def get_model(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return _plain(await self._client.get(ModelResource, name, namespace=namespace))
        except httpx2.HTTPError as exc:
            error = _api_error(f"get model {namespace}/{name}", exc)
            if error.status == 404:
                return None
            raise error from None

    async def create_demand(self, namespace: str, body: Mapping[str, Any]) -> None:
        try:
            await self._client.create(DemandResource.from_dict(dict(body)))
        except httpx2.HTTPError as exc:
            raise _api_error(f"create modeldemand in {namespace}", exc) from None

    async def patch_demand(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        try:
            await self._client.patch(DemandResource, name, dict(patch), namespace=namespace,
                                     patch_type=PatchType.MERGE)
        except httpx2.HTTPError as exc:
            raise _api_error(f"patch modeldemand {namespace}/{name}", exc) from None

    async def replace_demand_spec(self, namespace: str, name: str, spec: Mapping[str, Any]) -> None:
        try:
            await self._client.patch(DemandResource, name, [{"op": "add", "path": "/spec", "value": dict(spec)}],
                                     namespace=namespace, patch_type=PatchType.JSON)
        except httpx2.HTTPError as exc:
            raise _api_error(f"replace modeldemand {namespace}/{name}", exc) from None

    async def delete_demand(self, namespace: str, name: str) -> None:
        try:
            await self._client.delete(DemandResource, name, namespace=namespace)
        except httpx2.HTTPError as exc:
            raise _api_error(f"delete modeldemand {namespace}/{name}", exc) from None

    async def aclose(self) -> None:
        await self._client.close()


def _plain(obj: Any) -> dict[str, Any]:
    return dict(obj.to_dict()) if hasattr(obj, "to_dict") else dict(obj)


def _api_error(action: str, exc: httpx2.HTTPError) -> KubeApiError:
    if isinstance(exc, ApiError):
        code = exc.status.code
        if code == 410:
            return WatchExpiredError(exc.status.message or "resourceVersion too old")
        return KubeApiError(f"{action}: {code} {exc.status.reason or ''} {exc.status.message or ''}".strip(), code)
    if isinstance(exc, httpx2.HTTPStatusError):
        return KubeApiError(f"{action}: HTTP {exc.response.status_code}", exc.response.status_code)
    return KubeApiError(f"{action}: {type(exc).__name__}: {exc}")
