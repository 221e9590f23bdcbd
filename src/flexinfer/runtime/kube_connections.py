"""How FlexInfer's Kubernetes programs (the manager, the in-cluster proxy) keep their API server connections.

An idle connection is kept ``KEEPALIVE_S`` before it is closed, not the clients' defaults (httpx 5 s, aiohttp 15 s).
With the defaults a write after a quiet spell opened a new TCP and TLS connection first: the first writes of a swap
(the proxy's demand report, the manager's preemption and its fresh read of the reports) come after the holder's
hold (15 s by default), and the manager's lease renewal, every 5 s, found its 5 s old connection just expired each
time. A new connection costs about 3 ms more than a kept one on an idle host (more on a node busy starting a pod),
and each write on a swap's path waits for the one before it. ``KEEPALIVE_S`` stays below the kube-apiserver's own
idle timeout (90 s), so the server does not close a connection the client is about to reuse.

``kube_client`` is a ``lightkube.AsyncClient`` over such a pool; ``kube_connector`` an aiohttp connector for the
sessions that send writes or kopf's requests.
"""

from __future__ import annotations

import ssl

import aiohttp
import httpx2
from lightkube import AsyncClient, KubeConfig
from lightkube.config.client_adapter import verify_cluster
from lightkube.core.exceptions import ConfigError

KEEPALIVE_S = 60.0
"""Seconds an idle API server connection is kept (the kube-apiserver closes one after 90 s)."""


def kube_client(config: KubeConfig, *, field_manager: str) -> AsyncClient:
    """A ``lightkube.AsyncClient`` for ``config`` whose idle connections are kept ``KEEPALIVE_S``."""
    single = config.get()
    if single is None or single.user is None:  # what lightkube's own client would fail on
        raise ConfigError("the kubeconfig has no current context with a user")
    verify = verify_cluster(single.cluster, single.user, single.abs_file)
    limits = httpx2.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=KEEPALIVE_S)
    transport = httpx2.AsyncHTTPTransport(verify=verify, limits=limits)  # httpx's own limits but the expiry
    return AsyncClient(config, field_manager=field_manager, transport=transport)


def kube_connector(context: ssl.SSLContext, *, limit: int) -> aiohttp.TCPConnector:
    """An aiohttp connector to the API server (at most ``limit`` connections, idle ones kept ``KEEPALIVE_S``)."""
    return aiohttp.TCPConnector(limit=limit, ssl=context, keepalive_timeout=KEEPALIVE_S)
