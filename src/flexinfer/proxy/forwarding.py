"""The upstream call: send a request to a model server and relay its response without buffering.

Chunks are written to the client as they arrive (an answer whose body arrived with its head is written with it,
head and body in one send); no compression is added or removed. The HTTP client is
``upstream_http.UpstreamPool`` (pooled keep-alive connections, one write per request). A client that goes
away cancels the handler, which closes the upstream connection so the model server sees the disconnect. A
model server that fails before answering is a 502 ``bad_gateway``; one that answers an error status (>= 400)
becomes an OpenAI error with that status and its message, internals removed (``upstream_errors.py``); one
that fails mid-body is reported through ``Reply.fail`` (an SSE error event on streams), and so is one whose
event stream ends without a single event (llama.cpp's Python server, failing after its ``200`` head, ends the
stream cleanly and empty): a ``502`` when nothing was sent yet, else an SSE error event. Used by
``handler.py``; ``app.py`` starts and closes the ``Forwarder``.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from urllib.parse import urlsplit

from multidict import CIMultiDict
from yarl import URL

from flexinfer.core.errors import UpstreamError
from flexinfer.proxy.hooks import RequestTrace
from flexinfer.proxy.request_ids import REQUEST_ID_HEADER
from flexinfer.proxy.streaming import EventWatch, Reply, event_stream
from flexinfer.proxy.upstream_errors import MAX_ERROR_BODY, UpstreamStatusError, upstream_error
from flexinfer.proxy.upstream_http import UpstreamBodyError, UpstreamConnectionError, UpstreamResponse
from flexinfer.proxy.upstream_pool import UpstreamPool

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
    "transfer-encoding", "upgrade", "host", "content-length",
})
_NOT_MIRRORED = HOP_BY_HOP | {"date", "server", REQUEST_ID_HEADER.lower()}
"""Not copied from the model server's answer: hop-by-hop, the proxy's own, and the request id (the proxy
sets it on every reply; a server that echoes it must not make it appear twice)."""
_MAX_ORIGINS = 64
"""Parsed base URLs kept by a ``Forwarder``: a few per model in use. Each start of a local model server listens
on a new port, so a swap storm never asks for most base URLs again; past the bound the oldest one leaves."""
_PLAIN_TARGET = re.compile(r"/[A-Za-z0-9/_.~:@!$&'()*+,;=?-]*")


def upstream_headers(incoming: Mapping[str, str], drop: frozenset[str] = HOP_BY_HOP) -> CIMultiDict[str]:
    """The client's headers minus ``drop`` (lower-case names: ``HOP_BY_HOP``, with any others added to it)."""
    return CIMultiDict([(k, v) for k, v in incoming.items() if k.lower() not in drop])


def request_target(path_and_query: str) -> str:
    """The request line's target: the (decoded) path and query percent-encoded as an HTTP client would
    (``yarl`` requoting); plain ASCII targets, the usual case, are used as they are."""
    if _PLAIN_TARGET.fullmatch(path_and_query):
        return path_and_query
    return URL(path_and_query).raw_path_qs


def _mirrored_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The answer's end-to-end headers (names compared case-insensitively: servers such as uvicorn send
    lower-case names)."""
    return [(k, v) for k, v in headers if k.lower() not in _NOT_MIRRORED]


class Forwarder:
    """One pooled HTTP client for all model servers."""

    def __init__(self, connect_timeout: float, max_per_server: int = 0) -> None:
        self._connect_timeout, self._max_per_server = connect_timeout, max_per_server
        self._pools: dict[bool, UpstreamPool] = {}
        self._origins: dict[str, tuple[bool, str, int, str]] = {}

    async def start(self) -> None:
        self._pools = {False: UpstreamPool(self._connect_timeout, max_per_server=self._max_per_server)}

    async def close(self) -> None:
        for pool in self._pools.values():
            await pool.close()
        self._pools = {}

    def origins(self) -> int:
        """How many parsed base URLs are kept (at most ``_MAX_ORIGINS``)."""
        return len(self._origins)

    async def relay(self, reply: Reply, *, method: str, base_url: str, path: str, headers: CIMultiDict[str],
                    body: bytes, trace: RequestTrace, verbatim: bool = False) -> None:
        """Send the request to ``base_url`` + ``path`` and stream the answer into ``reply``; raises
        ``UpstreamError`` on failure. An error status becomes an OpenAI error unless ``verbatim`` (the
        control application's answers are relayed as they are)."""
        origin = self._origin(base_url)
        span = trace.upstream(method, base_url.rstrip("/") + path, headers)
        try:
            upstream = await self._open(origin, method, request_target(origin[3] + path), headers=headers, body=body)
        except UpstreamError as error:
            span.end(error=str(error))
            raise
        span.set_attribute("http.response.status_code", upstream.status)
        if upstream.status >= 400 and not verbatim:
            relayed = await _relayed_error(upstream)
            span.end(upstream.status, relayed.code)
            raise relayed
        try:
            await self._copy(reply, upstream, watch_events=not verbatim)
        except BaseException:
            upstream.close()
            span.end(upstream.status, "upstream body failed or client went away")
            raise
        upstream.release()
        span.end(upstream.status)

    async def _open(self, origin: tuple[bool, str, int, str], method: str, target: str, *,
                    headers: CIMultiDict[str], body: bytes) -> UpstreamResponse:
        assert self._pools, "Forwarder.start() was not awaited"
        secure, host, port, _ = origin
        pool = self._pools.get(secure)
        if pool is None:
            pool = self._pools[secure] = UpstreamPool(self._connect_timeout, ssl.create_default_context(),
                                                      self._max_per_server)
        try:
            return await pool.request(method, host, port, target, headers=headers.items(), body=body)
        except UpstreamConnectionError as exc:
            raise UpstreamError(f"upstream unavailable ({exc})") from None

    def _origin(self, base_url: str) -> tuple[bool, str, int, str]:
        """``(https, host, port, path prefix)`` of a model server's base URL (parsed once per URL)."""
        cached = self._origins.get(base_url)
        if cached is None:
            parts = urlsplit(base_url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise UpstreamError(f"upstream unavailable (unsupported endpoint {base_url!r})")
            secure = parts.scheme == "https"
            cached = (secure, parts.hostname, parts.port or (443 if secure else 80), parts.path.rstrip("/"))
            if len(self._origins) >= _MAX_ORIGINS:
                del self._origins[next(iter(self._origins))]
            self._origins[base_url] = cached
        return cached

    async def _copy(self, reply: Reply, upstream: UpstreamResponse, *, watch_events: bool) -> None:
        """Relay the answer; with ``watch_events``, an event stream without a single event is an error."""
        if reply.started and upstream.status != 200:
            raise UpstreamError(f"model server answered {upstream.status} on a stream already started")
        headers = _mirrored_headers(upstream.raw_headers)
        watch_events = watch_events and upstream.status < 300 and not upstream.head_only and event_stream(headers)
        if upstream.complete and not reply.started and not upstream.head_only:  # a short answer, all here
            body = upstream.drain()
            if watch_events and not _holds_event(body):
                raise _silent_stream()
            await reply.start_whole(upstream.status, upstream.reason, headers, body)
            return
        response = await reply.start_mirror(upstream.status, upstream.reason, headers, upstream.content_length)
        watch = EventWatch() if watch_events else None  # dropped once an event passed
        while True:
            try:
                chunk = await upstream.read()
            except UpstreamBodyError:
                raise UpstreamError("model server failed mid-response") from None
            if not chunk:
                if watch is not None:
                    raise _silent_stream()
                return
            if watch is not None:
                watch.feed(chunk)
                watch = None if watch.seen else watch
            await response.write(chunk)


def _holds_event(body: bytes) -> bool:
    watch = EventWatch()
    watch.feed(body)
    return watch.seen


def _silent_stream() -> UpstreamError:
    return UpstreamError("model server ended the event stream without sending any event (no data, no [DONE])")


async def _relayed_error(upstream: UpstreamResponse) -> UpstreamStatusError:
    """The OpenAI error for an upstream error answer (its body read up to ``MAX_ERROR_BODY`` bytes)."""
    body = bytearray()
    try:
        while len(body) < MAX_ERROR_BODY:
            chunk = await upstream.read()
            if not chunk:
                break
            body += chunk
    except UpstreamBodyError:
        pass  # what arrived is enough for a message
    finally:
        upstream.close()
    headers = upstream.headers
    return upstream_error(upstream.status, bytes(body[:MAX_ERROR_BODY]),
                          content_type=headers.get("Content-Type", ""),
                          content_encoding=headers.get("Content-Encoding", ""),
                          retry_after=headers.get("Retry-After"))
