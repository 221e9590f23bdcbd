"""The upstream call: send a request to a model server and relay its response without buffering.

Chunks are written to the client as they arrive (``readany``); no compression is added or removed
(``auto_decompress=False``). A client that goes away cancels the handler, which closes the upstream
connection so the model server sees the disconnect. A model server that fails before answering is a 502
``bad_gateway``; one that answers an error status (>= 400) becomes an OpenAI error with that status and its
message, internals removed (``upstream_errors.py``); one that fails mid-body is reported through
``Reply.fail`` (an SSE error event on streams). Used by ``handler.py``; ``app.py`` starts and closes the
``Forwarder``'s client session.
"""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy

from flexinfer.core.errors import UpstreamError
from flexinfer.proxy.hooks import RequestTrace
from flexinfer.proxy.streaming import Reply
from flexinfer.proxy.upstream_errors import MAX_ERROR_BODY, UpstreamStatusError, upstream_error

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
    "transfer-encoding", "upgrade", "host", "content-length",
})
_NOT_MIRRORED = HOP_BY_HOP | {"date", "server"}


def upstream_headers(incoming: Mapping[str, str], drop: frozenset[str]) -> CIMultiDict[str]:
    """The client's headers minus hop-by-hop ones and ``drop`` (lower-case names)."""
    skipped = HOP_BY_HOP | drop
    return CIMultiDict((k, v) for k, v in incoming.items() if k.lower() not in skipped)


def _mirrored_headers(headers: CIMultiDictProxy[str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _NOT_MIRRORED}


class Forwarder:
    """One pooled HTTP client for all model servers."""

    def __init__(self, connect_timeout: float) -> None:
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout, sock_read=None)
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=60, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=self._timeout, auto_decompress=False,
            skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def relay(self, reply: Reply, *, method: str, url: str, headers: CIMultiDict[str], body: bytes,
                    trace: RequestTrace) -> None:
        """Send the request and stream the answer into ``reply``; raises ``UpstreamError`` on failure."""
        span = trace.upstream(method, url, headers)
        try:
            upstream = await self._open(method, url, headers, body)
        except UpstreamError as error:
            span.end(error=str(error))
            raise
        span.set_attribute("http.response.status_code", upstream.status)
        if upstream.status >= 400:
            relayed = await _relayed_error(upstream)
            span.end(upstream.status, relayed.code)
            raise relayed
        try:
            await self._copy(reply, upstream)
        except BaseException:
            upstream.close()
            span.end(upstream.status, "upstream body failed or client went away")
            raise
        upstream.release()
        span.end(upstream.status)

    async def _open(self, method: str, url: str, headers: CIMultiDict[str], body: bytes) -> aiohttp.ClientResponse:
        assert self._session is not None, "Forwarder.start() was not awaited"
        try:
            return await self._session.request(method, url, headers=headers, data=body or None,
                                               allow_redirects=False)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise UpstreamError(f"upstream unavailable ({type(exc).__name__})") from None

    async def _copy(self, reply: Reply, upstream: aiohttp.ClientResponse) -> None:
        if reply.started and upstream.status != 200:
            raise UpstreamError(f"model server answered {upstream.status} on a stream already started")
        response = await reply.start_mirror(
            upstream.status, upstream.reason, _mirrored_headers(upstream.headers), upstream.content_length,
        )
        reader = upstream.content
        while True:
            try:
                chunk = await reader.readany()
            except (aiohttp.ClientError, OSError):
                raise UpstreamError("model server failed mid-response") from None
            if not chunk:
                return
            await response.write(chunk)


async def _relayed_error(upstream: aiohttp.ClientResponse) -> UpstreamStatusError:
    """The OpenAI error for an upstream error answer (its body read up to ``MAX_ERROR_BODY`` bytes)."""
    body = bytearray()
    try:
        while len(body) < MAX_ERROR_BODY:
            chunk = await upstream.content.read(MAX_ERROR_BODY - len(body))
            if not chunk:
                break
            body += chunk
    except (aiohttp.ClientError, OSError):
        pass  # what arrived is enough for a message
    finally:
        upstream.close()
    headers = upstream.headers
    return upstream_error(upstream.status, bytes(body), content_type=headers.get("Content-Type", ""),
                          content_encoding=headers.get("Content-Encoding", ""),
                          retry_after=headers.get("Retry-After"))
