"""A lean HTTP/1.1 client for the proxy's upstream calls: pooled keep-alive connections per model server,
one write per request (head and body together), responses parsed by ``httptools`` (llhttp) in an asyncio
protocol and handed to the relay chunk by chunk as they arrive.

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

``UpstreamPool.request`` returns an ``UpstreamResponse`` (status, reason, headers, ``content_length``,
``read()``, ``complete``, ``release()``/``close()``); failures raise ``UpstreamConnectionError`` (before an
answer) or ``UpstreamBodyError`` (mid-body). Used by ``forwarding.py``.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Callable, Iterable

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

HIGH_WATER = 256 * 1024
"""Buffered response bytes above which the socket stops being read until the relay catches up."""
_CHUNK_ENCODING = "utf-8"


class UpstreamConnectionError(OSError):
    """The request could not be sent or no answer came (connect failure, reset, malformed answer)."""


class UpstreamBodyError(OSError):
    """The answer's body ended early or was malformed."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection; carries one exchange at a time."""

    def __init__(self, pool_key: tuple[str, int], on_lost: Callable[[_Connection], None]) -> None:
        self.pool_key, self._on_lost = pool_key, on_lost
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.used = False
        self.holds_place = False
        """Counted against the pool's limit: its loss frees the place (set once the connect succeeded)."""
        self._response: UpstreamResponse | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._paused = False
        self._drained: asyncio.Future[None] | None = None

    # ---- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not registered subclasses

    def data_received(self, data: bytes) -> None:
        response = self._response
        if response is None:  # bytes nobody asked for: the connection cannot be trusted any more
            self.close()
            return
        response.received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            response.fail(exc)
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
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
        response = self._response
        assert response is not None
        status = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:  # an interim answer: wait for the real one
            response.reason, response.raw_headers = "", []
            return
        response.headers_complete(status, self._parser.should_keep_alive())

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

    __slots__ = ("_chunks", "_complete", "_conn", "_error", "_keep_alive", "_pool", "_waiter", "buffered",
                 "head_done", "head_only", "raw_headers", "reason", "received", "status")

    def __init__(self, pool: UpstreamPool, conn: _Connection, head_only: bool) -> None:
        self._pool, self._conn, self.head_only = pool, conn, head_only
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
            self._pool.put_back(conn)
        else:
            conn.close()

    def close(self) -> None:
        """Abandon the exchange and the connection (the model server sees the disconnect)."""
        self._conn.detach()
        self._conn.close()


class UpstreamPool:
    """Keep-alive connections to model servers, keyed by ``(host, port)``; at most ``max_per_server`` open
    to one server at once (0: no limit)."""

    def __init__(self, connect_timeout: float, tls: ssl.SSLContext | None = None, max_per_server: int = 0) -> None:
        self._connect_timeout, self._tls, self._max = connect_timeout, tls, max_per_server
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._open: dict[tuple[str, int], int] = {}
        """Connections open or being opened per server (counted only with a limit)."""
        self._waiting: dict[tuple[str, int], deque[asyncio.Future[_Connection | None]]] = {}
        """Requests waiting for a connection: handed one that is free again, or ``None`` (a place to connect)."""
        self._closed = False

    async def request(self, method: str, host: str, port: int, target: str, *,
                      headers: Iterable[tuple[str, str]], body: bytes) -> UpstreamResponse:
        """Send one request and return once the answer's head has arrived."""
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        head = _request_head(method, authority, target, headers, len(body))
        parts = (head + body,) if len(body) < 16384 else (head, body)
        key = (host, port)
        conn = await self._checkout(key, reuse=True)
        if conn.used:
            response = await self._exchange(conn, parts, method)
            if response is not None:
                return response
            conn = await self._checkout(key, reuse=False)
        response = await self._exchange(conn, parts, method, retry=False)
        assert response is not None
        return response

    async def _checkout(self, key: tuple[str, int], reuse: bool) -> _Connection:
        """A connection for one exchange: an idle one (``reuse``), one handed back by another request, or a
        new one."""
        conn = self._take_idle(key) if reuse else None
        if conn is not None:
            return conn
        if self._closed:
            raise UpstreamConnectionError("the proxy is closing")
        if self._max:
            if self._open.get(key, 0) < self._max:
                self._open[key] = self._open.get(key, 0) + 1
            else:
                handed = await self._wait_turn(key)
                if handed is not None:
                    return handed
        try:
            conn = await self._connect(key)
        except BaseException:
            self._free_place(key)
            raise
        if self._max:
            if conn.lost:  # closed before this request could use it: its loss did not free the place
                self._free_place(key)
            else:
                conn.holds_place = True
        return conn

    async def _wait_turn(self, key: tuple[str, int]) -> _Connection | None:
        waiter: asyncio.Future[_Connection | None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, deque()).append(waiter)
        try:
            async with asyncio.timeout(self._connect_timeout):
                return await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():  # handed over just as the wait ended: pass it on
                handed = waiter.result()
                if handed is not None:
                    self.put_back(handed)
                else:
                    self._free_place(key)
            else:
                waiter.cancel()
            if isinstance(exc, TimeoutError):
                raise UpstreamConnectionError(
                    f"no free connection to the model server within {self._connect_timeout:g}s "
                    f"({self._max} in use)") from None
            raise

    def _next_waiter(self, key: tuple[str, int]) -> asyncio.Future[_Connection | None] | None:
        waiting = self._waiting.get(key)
        while waiting:
            waiter = waiting.popleft()
            if not waiter.done():
                return waiter
        return None

    def _free_place(self, key: tuple[str, int]) -> None:
        """A counted connection is gone (or was never made): its place goes to the next waiting request."""
        if not self._max:
            return
        waiter = self._next_waiter(key)
        if waiter is not None:
            waiter.set_result(None)
        else:
            self._open[key] -= 1

    def _lost(self, conn: _Connection) -> None:
        if conn.holds_place:
            conn.holds_place = False
            self._free_place(conn.pool_key)

    async def _exchange(self, conn: _Connection, parts: tuple[bytes, ...], method: str,
                        retry: bool = True) -> UpstreamResponse | None:
        """``None`` when a reused connection turned out closed before any answer (the caller retries)."""
        response = UpstreamResponse(self, conn, head_only=method == "HEAD")
        conn.start(response)
        try:
            await conn.send(parts)
            await response.head()
        except (UpstreamConnectionError, ConnectionError) as exc:
            response.close()
            if retry and not response.received:
                return None
            raise UpstreamConnectionError(str(exc)) from None
        except BaseException:
            response.close()
            raise
        return response

    def _take_idle(self, key: tuple[str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.lost and conn.transport is not None and not conn.transport.is_closing():
                return conn
        return None

    async def _connect(self, key: tuple[str, int]) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(lambda: _Connection(key, self._lost), key[0], key[1],
                                                       ssl=self._tls)
        except (OSError, TimeoutError) as exc:
            raise UpstreamConnectionError(f"{type(exc).__name__}: {exc}") from None
        return conn

    def put_back(self, conn: _Connection) -> None:
        """A connection is free again: to the oldest waiting request, else to the idle list."""
        if self._closed:
            conn.close()
            return
        waiter = self._next_waiter(conn.pool_key) if self._max else None
        if waiter is not None:
            waiter.set_result(conn)
        else:
            self._idle.setdefault(conn.pool_key, []).append(conn)

    async def close(self) -> None:
        """Close every idle connection (busy ones are closed by their exchanges)."""
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
        for waiting in self._waiting.values():
            for waiter in waiting:
                if not waiter.done():
                    waiter.set_exception(UpstreamConnectionError("the proxy is closing"))
        self._waiting.clear()


def _request_head(method: str, authority: str, target: str, headers: Iterable[tuple[str, str]],
                  length: int) -> bytes:
    lines = [f"{method} {target} HTTP/1.1\r\nHost: {authority}\r\n"]
    lines += [f"{name}: {value}\r\n" for name, value in headers]
    if length or method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
        lines.append(f"Content-Length: {length}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode(_CHUNK_ENCODING, "surrogateescape")
