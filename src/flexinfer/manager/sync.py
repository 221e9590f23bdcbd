"""The start-up snapshot: one LIST per watched kind fills the store before the first reconcile.

Without it a shared group could be reconciled while kopf's initial listing has delivered only some of
its members, and a restarted manager might act on half a group. kopf's own list+watch then keeps the
store current (older resourceVersions are ignored). A missing ModelDemand CRD (a cluster upgraded without
applying the new CRD) is logged and skipped: the manager then honours only demand written on the Models,
and kopf picks the reports up once the CRD is installed. Used by ``flexinfer.manager.program``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import httpx2
from lightkube import AsyncClient
from lightkube.core.generic_client import ALL_NS
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Pod, Service

from flexinfer.api.conventions import MANAGED_BY, MANAGED_BY_LABEL
from flexinfer.manager.client import ModelDemandResource, ModelResource
from flexinfer.manager.store import Store

ModelCacheResource = create_namespaced_resource("ai.flexinfer", "v1alpha1", "ModelCache", "modelcaches")
GPULeaseResource = create_namespaced_resource("ai.flexinfer", "v1alpha2", "GPULease", "gpuleases")
log = logging.getLogger("flexinfer.manager")
OPTIONAL_KINDS = frozenset({"ModelDemand"})
"""Kinds whose CRD may be missing at start (installed later than the manager)."""
MANAGED_SELECTOR: dict[str, Any] = {MANAGED_BY_LABEL: MANAGED_BY}
KINDS: tuple[tuple[str, str, Any, dict[str, Any] | None], ...] = (
    ("ModelCache", "ai.flexinfer/v1alpha1", ModelCacheResource, None),
    ("GPULease", "ai.flexinfer/v1alpha2", GPULeaseResource, None),
    ("Deployment", "apps/v1", Deployment, MANAGED_SELECTOR),
    ("Service", "v1", Service, MANAGED_SELECTOR),
    ("Pod", "v1", Pod, MANAGED_SELECTOR),
    ("ModelDemand", "ai.flexinfer/v1alpha1", ModelDemandResource, None),
    ("Model", "ai.flexinfer/v1alpha2", ModelResource, None),
)


async def initial_sync(client: AsyncClient, store: Store, namespaces: Sequence[str] = ()) -> int:
    """Load every watched object into ``store``; returns the number of Models."""
    scopes = list(namespaces) or [ALL_NS]
    for kind, api_version, resource, labels in KINDS:
        for namespace in scopes:
            try:
                async for item in client.list(resource, namespace=namespace, labels=labels):
                    body = item.to_dict()
                    body.setdefault("apiVersion", api_version)
                    body.setdefault("kind", kind)
                    store.put(kind, body)
            except httpx2.HTTPStatusError as error:  # lightkube's ApiError, or a bare 404 for an unknown resource
                if kind not in OPTIONAL_KINDS or error.response.status_code != 404:
                    raise
                log.warning("the %s CRD (%s) is not installed: proxy reports are ignored until it is; "
                            "apply charts/flexinfer/crds/", kind, api_version)
                break
    return store.model_count()
