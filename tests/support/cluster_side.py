"""A started ``ClusterSide`` (the in-cluster proxy's Kubernetes half) over the fake model API, for unit tests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from flexinfer.assembly.cluster_proxy import ClusterProxySettings, ClusterSide
from support.fake_model_api import FakeModelApi


@contextlib.asynccontextmanager
async def cluster_side(api: FakeModelApi, **settings: Any) -> AsyncIterator[ClusterSide]:
    """Start a ``ClusterSide`` (default identity ``proxy-a``) synced with ``api``; closed on exit."""
    settings.setdefault("identity", "proxy-a")
    cluster = ClusterSide(api, ClusterProxySettings(**settings))
    await cluster.start(sync_timeout=5)
    try:
        yield cluster
    finally:
        await cluster.close()
