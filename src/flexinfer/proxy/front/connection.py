"""One client connection to the front server: ``httptools`` (llhttp) parses the requests, and each request is
answered by its own task, one at a time in arrival order (pipelined requests wait their turn, with reading
paused).

Bytes are read into the server's one read buffer (``asyncio.BufferedProtocol``) and parsed at once, so a large
body arrives as pieces below the allocator's mmap threshold: the pieces come from reused heap memory instead of
fresh pages (a 1 MB prompt read 256 KB at a time cost over a thousand page faults).

The task starts when a request's head has arrived (the body follows through ``FrontRequest.read``). A client
that goes away cancels its request's task; the server's idle sweep closes a connection that sat without a
request (or with a half-sent head) past the keep-alive timeout. Malformed HTTP (llhttp's strict parsing: bare
CR/LF, NUL, ``Content-Length`` with chunked…) and over-long heads get ``400 Bad Request`` and one WARNING
line, then the connection is closed. Built by ``server.FrontServer``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Protocol

import httptools
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from flexinfer.core.errors import echo_safe
from flexinfer.proxy.errors import InternalError
from flexinfer.proxy.front.message import FrontRequest, Link, ResponseWriter
from flexinfer.proxy.streaming import Reply

log = logging.getLogger("flexinfer.proxy.http")
MAX_LINE = 8190
"""Longest request target or header line, as aiohttp's parser allows."""
MAX_HEAD = 65536
"""Longest request head (request line and all headers)."""
_TEXT = "surrogateescape"
"""Head bytes (target, headers) that are not UTF-8 are kept as they came."""
_BAD_REQUEST = (b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 11\r\n"
                b"Connection: close\r\n\r\nBad Request")


class Exchanges(Protocol):
    """What a connection needs from its server."""

    max_body: int
    read_buffer: memoryview
    """Shared by all connections: each read is parsed before the next one starts."""

    def serve(self, request: FrontRequest, writer: ResponseWriter) -> Awaitable[None]: ...

    def closed(self, connection: FrontConnection) -> None: ...


class FrontConnection(asyncio.BufferedProtocol):
    """Parses one client's requests and runs them in order."""

    __slots__ = ("_current", "_head_size", "_link", "_on_open", "_parser", "_queue", "_raw_headers", "_server",
                 "_task", "_url", "last_active", "peer")

    def __init__(self, server: Exchanges, on_open: Callable[[FrontConnection], None]) -> None:
        self._server, self._on_open = server, on_open
        self._parser = httptools.HttpRequestParser(self)
        self._link: Link | None = None
        self._url = b""
        self._raw_headers: list[tuple[bytes, bytes]] = []
        self._head_size = 0
        self._current: FrontRequest | None = None
        """The request whose body is being parsed."""
        self._queue: deque[tuple[FrontRequest, ResponseWriter]] = deque()
        self._task: asyncio.Task[None] | None = None
        self.last_active = time.monotonic()
        self.peer = "unknown peer"

    @property
    def idle(self) -> bool:
        """No request in progress or waiting (a half-sent head counts as idle)."""
        return self._task is None and not self._queue and self._current is None

    # ---- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._link = Link(transport)  # type: ignore[arg-type]  # uvloop's transports are not registered subclasses
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.peer = f"{peer[0]}:{peer[1]}"
        self._on_open(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._server.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.last_active = time.monotonic()
        try:
            self._parser.feed_data(self._server.read_buffer[:nbytes])
        except httptools.HttpParserUpgrade:
            pass  # no protocol switch is offered: the request is answered over HTTP/1.1, then the connection ends
        except httptools.HttpParserError as exc:
            self._reject(str(exc))

    def connection_lost(self, exc: Exception | None) -> None:
        link = self._link
        if link is not None:
            link.gone()
        if self._current is not None:
            self._current.fail(ConnectionResetError("client went away"))
        if self._task is not None:
            self._task.cancel()
        self._queue.clear()
        self._server.closed(self)

    def pause_writing(self) -> None:
        assert self._link is not None
        self._link.pause()

    def resume_writing(self) -> None:
        assert self._link is not None
        self._link.resume()

    # ---- httptools callbacks
    def on_message_begin(self) -> None:
        self._url, self._raw_headers, self._head_size = b"", [], 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > MAX_LINE:
            raise httptools.HttpParserError(f"request target longer than {MAX_LINE} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        size = len(name) + len(value)
        self._head_size += size + 4
        if size > MAX_LINE or self._head_size > MAX_HEAD:
            raise httptools.HttpParserError(f"header line longer than {MAX_LINE} bytes or head over {MAX_HEAD}")
        self._raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self._link is not None
        parser = self._parser
        headers = CIMultiDictProxy(CIMultiDict([(n.decode("utf-8", _TEXT), v.decode("utf-8", _TEXT))
                                                for n, v in self._raw_headers]))
        target = self._url.decode("utf-8", _TEXT)
        self._url, self._raw_headers = b"", []  # not kept while the request waits
        path, query = _split_target(target)
        version = parser.get_http_version()
        keep_alive = parser.should_keep_alive() and not parser.should_upgrade()
        request = FrontRequest(
            self._link, parser.get_method().decode("ascii", "replace"), target, path=path, query_string=query,
            headers=headers, version=version, keep_alive=keep_alive, limit=self._server.max_body,
            expect_continue=headers.get("Expect", "").lower() == "100-continue" and version == "1.1")
        writer = ResponseWriter(self._link, http10=version == "1.0", keep_alive=keep_alive,
                                head_only=request.method == "HEAD")
        self._current = request
        self._queue.append((request, writer))
        if self._task is None:
            self._next()
        else:
            self._link.transport.pause_reading()

    def on_body(self, body: bytes) -> None:
        if self._current is not None:
            self._current.feed(body)

    def on_message_complete(self) -> None:
        if self._current is not None:
            self._current.finish()
            self._current = None

    # ---- running requests
    def _next(self) -> None:
        request, writer = self._queue.popleft()
        self._task = asyncio.get_running_loop().create_task(self._run(request, writer))

    async def _run(self, request: FrontRequest, writer: ResponseWriter) -> None:
        try:
            await self._server.serve(request, writer)
        except Exception:  # the handlers answer their own errors: this is a defect, never a traceback to the client
            log.exception("unexpected error on %s %s", request.method, echo_safe(request.path, 300))
            if not writer.started and not self._link_lost():
                await Reply(writer, {}).fail(InternalError())
        finally:
            self._task = None
            self._after(request, writer)

    def _after(self, request: FrontRequest, writer: ResponseWriter) -> None:
        link = self._link
        assert link is not None
        if link.lost:
            return
        if not writer.done or not writer.keep_alive or not request.complete:
            link.transport.close()  # an unfinished answer or an unread body: the connection cannot go on
            return
        self.last_active = time.monotonic()
        if self._queue:
            self._next()
            if len(self._queue) == 0:
                link.transport.resume_reading()

    def _reject(self, reason: str) -> None:
        log.warning("rejected a malformed request from %s: %s", self.peer, echo_safe(" ".join(reason.split()), 300))
        if self._current is not None:
            self._current.fail(ConnectionResetError("malformed request"))
        if self._link is not None and not self._link.lost:
            if self._task is None and not self._queue:
                self._link.transport.write(_BAD_REQUEST)
            self._link.transport.close()

    def _link_lost(self) -> bool:
        return self._link is None or self._link.lost

    def close(self) -> None:
        """Close the connection (idle sweep, shutdown)."""
        if self._link is not None:
            self._link.transport.close()


def _split_target(target: str) -> tuple[str, str]:
    """The decoded path and the query string of an origin-form request target (``/p%20q?x=1``), decoded
    the way aiohttp does (``yarl``); plain targets, the usual case, need no decoding."""
    path, _, query = target.partition("?")
    if "%" not in path and "/." not in path and path.startswith("/"):
        return path, query
    url = URL(target)
    return url.path, url.query_string
