"""The proxy's pool of keep-alive upstream connections, per model server (``upstream_http`` is one connection).

A connection is reused only after a complete response that allows it; a reused connection that the server closed
before answering is retried once on a new connection (the request never reached the model). With
``max_per_server``, at most that many connections to one model server exist at once: a request beyond it waits
(within the connect timeout) for a connection another request hands back, or for a closed one's place, so a
burst of granted requests reuses a bounded set of connections instead of overflowing the server's accept queue.
Used by ``forwarding.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from collections.abc import Iterable

from flexinfer.proxy.upstream_http import (
    Connection,
    UpstreamConnectionError,
    UpstreamResponse,
)

CONNECT_ATTEMPTS = (0.25, 0.5)
"""Lengths (seconds) of the first TCP connect attempts; the last attempt gets what is left of the timeout."""


class UpstreamPool:
    """Keep-alive connections to model servers, keyed by ``(host, port)``; at most ``max_per_server`` open
    to one server at once (0: no limit)."""

    def __init__(self, connect_timeout: float, tls: ssl.SSLContext | None = None, max_per_server: int = 0) -> None:
        self._connect_timeout, self._tls, self._max = connect_timeout, tls, max_per_server
        self._idle: dict[tuple[str, int], list[Connection]] = {}
        self._open: dict[tuple[str, int], int] = {}
        """Connections open or being opened per server (counted only with a limit)."""
        self._waiting: dict[tuple[str, int], deque[asyncio.Future[Connection | None]]] = {}
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

    async def _checkout(self, key: tuple[str, int], reuse: bool) -> Connection:
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

    async def _wait_turn(self, key: tuple[str, int]) -> Connection | None:
        waiter: asyncio.Future[Connection | None] = asyncio.get_running_loop().create_future()
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

    def _next_waiter(self, key: tuple[str, int]) -> asyncio.Future[Connection | None] | None:
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
            return
        self._open[key] -= 1
        if self._open[key] <= 0:
            del self._open[key]
            self._waiting.pop(key, None)  # empty: ``_next_waiter`` drained it

    def _lost(self, conn: Connection) -> None:
        """A connection closed: it leaves the idle list at once (a model server that stopped leaves nothing
        behind: each start listens on a new port, so its key is never used again)."""
        key = conn.pool_key
        idle = self._idle.get(key)
        if idle is not None:
            with contextlib.suppress(ValueError):
                idle.remove(conn)
            if not idle:
                del self._idle[key]
        if conn.holds_place:
            conn.holds_place = False
            self._free_place(key)

    async def _exchange(self, conn: Connection, parts: tuple[bytes, ...], method: str,
                        retry: bool = True) -> UpstreamResponse | None:
        """``None`` when a reused connection turned out closed before any answer (the caller retries)."""
        response = UpstreamResponse(self.put_back, conn, head_only=method == "HEAD")
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

    def _take_idle(self, key: tuple[str, int]) -> Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.lost and conn.transport is not None and not conn.transport.is_closing():
                if not idle:
                    del self._idle[key]
                return conn
        self._idle.pop(key, None)
        return None

    def held(self) -> int:
        """Idle connections kept, over every server (what the pool holds between requests)."""
        return sum(len(idle) for idle in self._idle.values())

    def servers(self) -> set[tuple[str, int]]:
        """The servers the pool keeps anything for (idle connections, counted places, waiting requests)."""
        return set(self._idle) | set(self._open) | set(self._waiting)

    async def _connect(self, key: tuple[str, int]) -> Connection:
        """Connect within the connect timeout, in attempts of growing length (plain TCP): a SYN that is dropped
        (a Service whose new endpoint kube-proxy has not programmed yet, a full accept queue) is sent again after
        ``CONNECT_ATTEMPTS`` seconds instead of the kernel's first retransmission a second later."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._connect_timeout
        for attempt in CONNECT_ATTEMPTS if self._tls is None else ():
            if deadline - loop.time() <= attempt:
                break
            with contextlib.suppress(TimeoutError):
                return await self._attempt(key, attempt)
        try:
            return await self._attempt(key, deadline - loop.time())
        except TimeoutError as exc:
            raise UpstreamConnectionError(f"TimeoutError: {exc}") from None

    async def _attempt(self, key: tuple[str, int], seconds: float) -> Connection:
        """One connect attempt; ``TimeoutError`` after ``seconds``, any other failure ``UpstreamConnectionError``."""
        try:
            async with asyncio.timeout(seconds):
                _, conn = await asyncio.get_running_loop().create_connection(
                    lambda: Connection(key, self._lost), key[0], key[1], ssl=self._tls)
        except TimeoutError:
            raise
        except OSError as exc:
            raise UpstreamConnectionError(f"{type(exc).__name__}: {exc}") from None
        return conn

    def put_back(self, conn: Connection) -> None:
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
    return "".join(lines).encode("utf-8", "surrogateescape")
