"""One client connection to the front server: ``httptools`` (llhttp) parses the requests, and each request is
answered by its own task, one at a time in arrival order (pipelined requests wait their turn, with reading
paused).

Bytes are read into the server's one read buffer (``asyncio.BufferedProtocol``) and parsed at once, so a large
body arrives as pieces below the allocator's mmap threshold: the pieces come from reused heap memory instead of
fresh pages (a 1 MB prompt read 256 KB at a time cost over a thousand page faults).

The task starts when a request's head has arrived (the body follows through ``FrontRequest.read``). A client
that goes away cancels its request's task; the server's idle sweep closes a connection that sat without a
request (or with a half-sent head) past the keep-alive timeout. A request that cannot be parsed gets the
OpenAI error envelope (JSON, ``invalid_request_error``) and one WARNING line, then the connection is closed:
malformed HTTP (llhttp's strict parsing: a garbage request line, bare CR/LF, NUL, ``Content-Length`` with
chunked, a negative ``Content-Length``…) and an HTTP version other than 1.0/1.1 (HTTP/0.9's version-less
request line included) are ``400``, a request target over ``MAX_LINE`` bytes ``414``, a head over ``MAX_HEAD``
bytes or ``MAX_HEADERS`` fields ``431`` (a head still incomplete past ``MAX_HEAD`` bytes is not buffered
further). After that answer the connection lingers for up to ``LINGER`` seconds, reading and dropping what the
client still sends (a 1 MB header arrives in many reads): closing with unread bytes would reset the connection
and could destroy the answer before the client reads it. Built by ``server.FrontServer``.
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
from flexinfer.proxy.errors import InternalError, MalformedHttpError, error_payload
from flexinfer.proxy.front.message import FrontRequest, Link, ResponseWriter, closing_answer
from flexinfer.proxy.streaming import Reply

log = logging.getLogger("flexinfer.proxy.http")
MAX_LINE = 8190
"""Longest request target or header line, as aiohttp's parser allows."""
MAX_HEAD = 65536
"""Longest request head (request line and all headers)."""
MAX_HEADERS = 256
"""Most header fields in one request (clients send a dozen or two)."""
LINGER = 2.0
"""Seconds a rejected client's further bytes are read and dropped after its answer was sent."""
_VERSIONS = frozenset(("1.0", "1.1"))
_TEXT = "surrogateescape"
"""Head bytes (target, headers) that are not UTF-8 are kept as they came."""


class _Rejection(Exception):
    """Raised in a parser callback: the request gets ``error`` (llhttp wraps it, as the context of its
    ``HttpParserCallbackError``)."""

    def __init__(self, error: MalformedHttpError) -> None:
        super().__init__(str(error))
        self.error = error


def _unsupported_version(version: str) -> MalformedHttpError:
    """HTTP/0.9 (a request line without a version), HTTP/2 over this port's HTTP/1 syntax…"""
    said = "no version in the request line" if version == "0.9" else f"HTTP/{version}"
    return MalformedHttpError(f"Unsupported HTTP version ({said}): send HTTP/1.1 or HTTP/1.0",
                              code="unsupported_http_version")


def versionless_request_line(data: memoryview | bytes, method: bytes, target: bytes) -> bool:
    """Whether ``data`` holds the pending request line ending right after its target (HTTP/0.9's ``GET /path``),
    which llhttp reports only once a blank line follows; checked while a head has a target and no header yet
    (rare: heads arrive whole). The line must start a line of its own, so a header value that llhttp has not
    reported yet (it waits for the next line) is never taken for it."""
    read = bytes(data)
    line = method + b" " + target
    at = read.rfind(line)
    return (at >= 0 and (at == 0 or read[at - 1] == 0x0A)
            and read.startswith((b"\r\n", b"\n"), at + len(line)))


def _head_too_large(what: str) -> MalformedHttpError:
    return MalformedHttpError(f"Request header fields too large: {what}", 431, "request_header_fields_too_large")


class Exchanges(Protocol):
    """What a connection needs from its server."""

    max_body: int
    read_buffer: memoryview
    """Shared by all connections: each read is parsed before the next one starts."""

    def serve(self, request: FrontRequest, writer: ResponseWriter) -> Awaitable[None]: ...

    def closed(self, connection: FrontConnection) -> None: ...


class FrontConnection(asyncio.BufferedProtocol):
    """Parses one client's requests and runs them in order."""

    __slots__ = ("_current", "_head_bytes", "_head_size", "_lingering", "_link", "_on_open", "_parser", "_queue",
                 "_raw_headers", "_server", "_stopped", "_task", "_url", "last_active", "peer")

    def __init__(self, server: Exchanges, on_open: Callable[[FrontConnection], None]) -> None:
        self._server, self._on_open = server, on_open
        self._parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        """Dropped when the connection is lost: it holds this protocol's callbacks, a reference cycle that would
        keep a closed connection in memory until the cyclic collector runs (rarely, with a server's settings)."""
        self._link: Link | None = None
        self._url = b""
        self._raw_headers: list[tuple[bytes, bytes]] = []
        self._head_size = 0
        self._head_bytes = 0
        """Bytes read since the last complete head while none was complete (a bound on what llhttp buffers)."""
        self._current: FrontRequest | None = None
        """The request whose body is being parsed."""
        self._queue: deque[tuple[FrontRequest, ResponseWriter]] = deque()
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        """A request was rejected: nothing more is parsed (what the client still sends is dropped)."""
        self._lingering: asyncio.TimerHandle | None = None
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
        parser = self._parser
        if self._stopped or parser is None:
            return
        self.last_active = time.monotonic()
        if self._current is None:
            self._head_bytes += nbytes
        try:
            parser.feed_data(self._server.read_buffer[:nbytes])
        except httptools.HttpParserUpgrade:
            pass  # no protocol switch is offered: the request is answered over HTTP/1.1, then the connection ends
        except httptools.HttpParserError as exc:
            cause = exc.__context__
            self._reject(cause.error if isinstance(cause, _Rejection)
                         else MalformedHttpError(f"Malformed HTTP request: {exc}"))
            return
        if self._current is None:
            if self._head_bytes > MAX_HEAD:
                self._reject(_head_too_large(f"a request head over {MAX_HEAD} bytes"))
            elif self._url and not self._raw_headers and versionless_request_line(
                    self._server.read_buffer[:nbytes], parser.get_method(), self._url):
                self._reject(_unsupported_version("0.9"))

    def connection_lost(self, exc: Exception | None) -> None:
        if self._lingering is not None:
            self._lingering.cancel()
        link = self._link
        if link is not None:
            link.gone()
        if self._current is not None:
            self._current.fail(ConnectionResetError("client went away"))
        if self._task is not None:
            self._task.cancel()
        self._queue.clear()
        self._parser = None
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
            raise _Rejection(MalformedHttpError(f"Request target longer than {MAX_LINE} bytes", 414, "uri_too_long"))

    def on_header(self, name: bytes, value: bytes) -> None:
        size = len(name) + len(value)
        self._head_size += size + 4
        if size > MAX_LINE:
            raise _Rejection(_head_too_large(f"a header line over {MAX_LINE} bytes"))
        if self._head_size > MAX_HEAD:
            raise _Rejection(_head_too_large(f"a request head over {MAX_HEAD} bytes"))
        if len(self._raw_headers) >= MAX_HEADERS:
            raise _Rejection(_head_too_large(f"more than {MAX_HEADERS} header fields"))
        self._raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self._parser
        assert self._link is not None and parser is not None
        self._head_bytes = 0
        version = parser.get_http_version()
        if version not in _VERSIONS:
            raise _Rejection(_unsupported_version(version))
        headers = CIMultiDictProxy(CIMultiDict([(n.decode("utf-8", _TEXT), v.decode("utf-8", _TEXT))
                                                for n, v in self._raw_headers]))
        target = self._url.decode("utf-8", _TEXT)
        self._url, self._raw_headers = b"", []  # not kept while the request waits
        path, query = _split_target(target)
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

    def _reject(self, error: MalformedHttpError) -> None:
        """Answer ``error`` and end the connection. A malformed body of the request being answered (a bad chunk)
        is that request's error, answered by its handler; a request behind one still answering gets none."""
        log.warning("rejected a malformed request from %s: %s", self.peer,
                    echo_safe(" ".join(str(error).split()), 300))
        self._stopped = True
        current, link = self._current, self._link
        if current is not None and self._task is not None and not self._queue:
            current.fail(error)  # ``_after`` then closes the connection: the body was never complete
            return
        if current is not None:
            current.fail(ConnectionResetError("malformed request"))
        if link is not None and not link.lost and not link.transport.is_closing():
            if self._task is None and not self._queue:
                link.transport.write(closing_answer(*error_payload(error)))
                self._linger(link.transport)
            else:
                link.transport.close()

    def _linger(self, transport: asyncio.Transport) -> None:
        """End the answer (FIN) and drop what the client still sends, for at most ``LINGER`` seconds."""
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self._lingering = asyncio.get_running_loop().call_later(LINGER, transport.close)

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
