"""A lean HTTP/1.1 client for the proxy's upstream calls, the connection half: one write per request (head and
body together), responses parsed by ``httptools`` (llhttp) in an asyncio protocol and handed to the relay chunk by
chunk as they arrive. The pool of keep-alive connections per model server is ``upstream_pool``.

Why not ``aiohttp.ClientSession``: its per-request machinery (request/response objects, cookie jar, auto
headers, timers, connector bookkeeping) was the largest Python cost on the proxy's hot path. This client
does only what a reverse proxy needs: no redirects, no cookies, no decompression, no auto headers beyond
``Host`` and ``Content-Length``. A connection is reused only after a complete response that allows it; a
reused connection that the server closed before answering is retried once on a new connection (the request
never reached the model). Reading is paused when the relay falls behind (``HIGH_WATER`` bytes buffered).
With ``max_per_server``, at most that many connections to one model server exist at once: a request beyond
it waits (within the connect timeout) for a connection another request hands back, or for a closed one's
place. A burst (thousands of requests granted together when a cold model becomes Ready) then reuses a bounded
set of keep-alive connections instead of opening one each, which overflows the server's accept queue (the
kernel drops the excess SYNs and the client retries them only after a second or more).

``UpstreamPool.request`` (``upstream_pool``) returns an ``UpstreamResponse`` (status, reason, headers,
``content_length``, ``read()``, ``complete``, ``release()``/``close()``); failures raise
``UpstreamConnectionError`` (before an answer) or ``UpstreamBodyError`` (mid-body). Used by ``upstream_pool.py``
and ``forwarding.py``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

HIGH_WATER = 256 * 1024
"""Buffered response bytes above which the socket stops being read until the relay catches up."""


class UpstreamConnectionError(OSError):
    """The request could not be sent or no answer came (connect failure, reset, malformed answer)."""


class UpstreamBodyError(OSError):
    """The answer's body ended early or was malformed."""


class Connection(asyncio.Protocol):
    """One keep-alive connection; carries one exchange at a time."""

    def __init__(self, pool_key: tuple[str, int], on_lost: Callable[[Connection], None]) -> None:
        self.pool_key, self._on_lost = pool_key, on_lost
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.used = False
        self.holds_place = False
        """Counted against the pool's limit: its loss frees the place (set once the connect succeeded)."""
        self._response: UpstreamResponse | None = None
        self._parser: httptools.HttpResponseParser | None = None
        """While connected (``connection_made`` to ``connection_lost``): the parser holds this protocol's
        callbacks, a reference cycle that would keep a closed connection (its transport, its parser) in memory
        until the cyclic collector runs, which a server's garbage collector settings make rare."""
        self._paused = False
        self._drained: asyncio.Future[None] | None = None

    # ---- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not registered subclasses
        self._parser = httptools.HttpResponseParser(self)

    def data_received(self, data: bytes) -> None:
        response, parser = self._response, self._parser
        if response is None or parser is None:  # bytes nobody asked for: the connection cannot be trusted any more
            self.close()
            return
        response.received = True
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as exc:
            response.fail(exc)
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._parser = None
        self._on_lost(self)
        if self._response is not None:
            self._response.connection_lost()
        if self._drained is not None and not self._drained.done():
            self._drained.set_exception(ConnectionResetError("upstream connection lost"))

    def pause_writing(self) -> None:
        self._drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._drained = None

    # ---- httptools callbacks
    def on_status(self, reason: bytes) -> None:
        assert self._response is not None
        self._response.reason += reason.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self._response is not None
        self._response.raw_headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        response, parser = self._response, self._parser
        assert response is not None and parser is not None
        status = parser.get_status_code()
        if 100 <= status < 200 and status != 101:  # an interim answer: wait for the real one
            response.reason, response.raw_headers = "", []
            return
        response.headers_complete(status, parser.should_keep_alive())

    def on_body(self, body: bytes) -> None:
        assert self._response is not None
        if self._response.head_done:
            self._response.feed(body)

    def on_message_complete(self) -> None:
        response = self._response
        if response is not None and response.head_done:
            response.finish()

    # ---- used by the pool and the response
    def start(self, response: UpstreamResponse) -> None:
        self._response, self.used = response, True

    async def send(self, parts: Iterable[bytes]) -> None:
        assert self.transport is not None
        self.transport.writelines(parts)
        if self._drained is not None:
            await self._drained

    def pause(self) -> None:
        if not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self.transport is not None and not self.lost:
            self._paused = False
            self.transport.resume_reading()

    def detach(self) -> None:
        self._response = None

    def close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()


class UpstreamResponse:
    """A model server's answer: status and headers at once, the body as it arrives."""

    __slots__ = ("_chunks", "_complete", "_conn", "_error", "_keep_alive", "_put_back", "_waiter", "buffered",
                 "head_done", "head_only", "raw_headers", "reason", "received", "status")

    def __init__(self, put_back: Callable[[Connection], None], conn: Connection, head_only: bool) -> None:
        self._put_back, self._conn, self.head_only = put_back, conn, head_only
        self.status, self.reason = 0, ""
        self.raw_headers: list[tuple[str, str]] = []
        self.head_done = self.received = self._complete = self._keep_alive = False
        self._chunks: deque[bytes] = deque()
        self.buffered = 0
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    # ---- fed by the connection
    def headers_complete(self, status: int, keep_alive: bool) -> None:
        self.status, self._keep_alive, self.head_done = status, keep_alive, True
        if self.head_only or status in (204, 304):
            self._keep_alive = False  # the parser cannot be told a HEAD answer has no body: never reuse
            self._complete = True
        self._wake()

    def feed(self, data: bytes) -> None:
        if self._complete:
            return
        self._chunks.append(data)
        self.buffered += len(data)
        if self.buffered > HIGH_WATER:
            self._conn.pause()
        self._wake()

    def finish(self) -> None:
        self._complete = True
        self._wake()

    def fail(self, error: BaseException) -> None:
        if not self._complete:
            self._error = error
        self._keep_alive = False
        self._wake()

    def connection_lost(self) -> None:
        self._keep_alive = False
        if self.head_done and not self._complete and self.content_length is None and not self._chunked():
            self._complete = True  # a body delimited by the end of the connection
        elif not self._complete:
            self._error = self._error or ConnectionResetError("upstream closed the connection")
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    # ---- read by the relay
    async def head(self) -> None:
        """Wait for the status line and headers (``UpstreamConnectionError`` when none come)."""
        while not self.head_done:
            if self._error is not None:
                raise UpstreamConnectionError(str(self._error) or type(self._error).__name__)
            await self._wait()

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        return CIMultiDictProxy(CIMultiDict(self.raw_headers))

    @property
    def content_length(self) -> int | None:
        for name, value in self.raw_headers:
            if name.lower() == "content-length":
                return int(value) if value.strip().isdigit() else None
        return None

    def _chunked(self) -> bool:
        return any(n.lower() == "transfer-encoding" and "chunked" in v.lower() for n, v in self.raw_headers)

    @property
    def complete(self) -> bool:
        """The whole body has arrived (``drain()`` then returns all of it)."""
        return self._complete and self._error is None

    def drain(self) -> bytes:
        """Everything buffered so far, at once."""
        data = b"".join(self._chunks) if len(self._chunks) != 1 else self._chunks[0]
        self._chunks.clear()
        self.buffered = 0
        self._conn.resume()
        return data

    async def read(self) -> bytes:
        """The next piece of the body as it arrived (several pieces joined if the relay fell behind);
        ``b""`` at the end; ``UpstreamBodyError`` when the body is cut or malformed."""
        while not self._chunks:
            if self._error is not None:
                raise UpstreamBodyError(str(self._error) or type(self._error).__name__)
            if self._complete:
                return b""
            await self._wait()
        return self.drain()

    def release(self) -> None:
        """The exchange is over: keep the connection for the next request when the answer allows it."""
        conn = self._conn
        conn.detach()
        if self._complete and self._error is None and self._keep_alive and not self._chunks and not conn.lost:
            self._put_back(conn)
        else:
            conn.close()

    def close(self) -> None:
        """Abandon the exchange and the connection (the model server sees the disconnect)."""
        self._conn.detach()
        self._conn.close()
