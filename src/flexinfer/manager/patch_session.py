"""The manager's frequent writes — server-side applies of Deployments and Services, Model status patches — sent
over one aiohttp session instead of lightkube's httpx client.

Every pass of every Model makes these writes; through lightkube each costs about 1.1 ms of the manager's CPU
(httpx, its TLS streams, then a typed object turned back into a dict), over aiohttp about 0.4 ms
(docs/performance.md, "Reconcile scale"). The request itself is still built by lightkube (``prepare_request``:
path, query, content type), so both clients write the same thing. Credentials are kopf's
(``flexinfer.manager.connection.connection_info``, the same kubeconfig source): on a 401 the session is rebuilt
with credentials read afresh (a rotated service-account token) and the write is sent once more. An error answer is
raised as lightkube's ``ApiError`` carrying the API server's ``Status``, as lightkube would raise it, so the
reconciler and the retry rules see no difference. Used by ``flexinfer.manager.client``; built and closed by
``flexinfer.manager.program``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, cast

import aiohttp
import kopf
from lightkube import ApiError
from lightkube.core.generic_client import BasicRequest
from lightkube.models.meta_v1 import Status

from flexinfer.runtime.kube_connections import kube_connector

Body = dict[str, Any]
UNAUTHORIZED = 401
CONNECTIONS = 16
"""Connections kept at most: the reconcile workers write one object at a time each."""
TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=30)


def api_error(code: int, reason: str, content: bytes) -> ApiError:
    """An error answer as lightkube's ``ApiError``: the API server's ``Status`` when the body is one, else a
    ``Status`` with the HTTP code and the start of the body."""
    try:
        data = json.loads(content)
    except ValueError:
        data = None
    if isinstance(data, dict) and data.get("kind") == "Status":
        return ApiError(status=cast(Status, Status.from_dict(data)))
    text = content[:200].decode("utf-8", "replace").strip()
    return ApiError(status=Status(code=code, reason=reason, status="Failure", message=f"{code} {reason}: {text}"))


class PatchSession:
    """Sends lightkube-built write requests over aiohttp (see the module docstring). ``credentials`` is called
    for the first write and after every 401; the session lives on the event loop of its first write."""

    def __init__(self, credentials: Callable[[], kopf.ConnectionInfo], connections: int = CONNECTIONS) -> None:
        self._credentials, self._connections = credentials, connections
        self._session: aiohttp.ClientSession | None = None
        self._server = ""

    def _open(self) -> aiohttp.ClientSession:
        info = self._credentials()
        self._server = info.server.rstrip("/")
        self._session = aiohttp.ClientSession(
            connector=kube_connector(info.as_ssl_context(), limit=self._connections),
            headers=info.as_http_headers(), proxy=info.proxy_url, trust_env=info.trust_env, timeout=TIMEOUT)
        return self._session

    async def send(self, request: BasicRequest) -> Body:
        """Send ``request``; the answer's JSON, or ``ApiError``."""
        payload = json.dumps(request.data, separators=(",", ":")).encode()
        session = self._session or self._open()
        code, reason, content = await self._exchange(session, request, payload)
        if code == UNAUTHORIZED:
            if session is self._session:  # not yet replaced by another write's 401
                await self.close()
            code, reason, content = await self._exchange(self._session or self._open(), request, payload)
        if code >= 400:
            raise api_error(code, reason, content)
        return cast(Body, json.loads(content))

    async def _exchange(self, session: aiohttp.ClientSession, request: BasicRequest,
                        payload: bytes) -> tuple[int, str, bytes]:
        async with session.request(request.method, f"{self._server}/{request.url}", params=request.params,
                                   data=payload, headers=request.headers) as response:
            return response.status, response.reason or "", await response.read()

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
