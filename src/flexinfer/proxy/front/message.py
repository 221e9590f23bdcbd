"""One HTTP exchange on the front server: the parsed request (``FrontRequest``) and the response written back
(``ResponseWriter``).

The request's body is read with ``await request.read()``, as it arrives after the head: ``Expect:
100-continue`` is answered when the body is first asked for, and a body over the limit ends in
``PayloadTooLargeError`` (413). The writer frames the answer for the client's HTTP version:
``Content-Length`` when the length is known, chunked otherwise (HTTP/1.1), or the end of the connection
(HTTP/1.0); writes wait while the client is slower than the answer (transport flow control), and a write to a
client that went away raises ``ConnectionResetError``. ``closing_answer`` frames the answer to a request that
never got this far (the connection rejects it while parsing). Built by ``connection.py``; read by the proxy's
handler and ``streaming.Reply``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from email.utils import formatdate
from http import HTTPStatus

from multidict import CIMultiDictProxy

from flexinfer.core.errors import PayloadTooLargeError

_REASONS = {status.value: status.phrase for status in HTTPStatus}
_NO_BODY = frozenset({204, 304})
_date_cache: list[object] = [0, b""]


def http_date() -> bytes:
    """The ``Date`` header value, formatted once per second."""
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache[0], _date_cache[1] = now, formatdate(now, usegmt=True).encode()
    return _date_cache[1]  # type: ignore[return-value]


def closing_answer(status: int, headers: Iterable[tuple[str, str]], body: bytes) -> bytes:
    """A complete answer, head and body, after which the connection ends (``Connection: close``): for a request
    rejected while it was parsed, which has no writer."""
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n", *(f"{n}: {v}\r\n" for n, v in headers),
             f"Content-Length: {len(body)}\r\nConnection: close\r\n"]
    return "".join(lines).encode("latin-1") + b"Date: " + http_date() + b"\r\n\r\n" + body


class Link:
    """What a request and its writer share with their connection: the transport, whether the client is
    still there, and the flow-control waiter."""

    __slots__ = ("_drained", "lost", "transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.lost = False
        self._drained: asyncio.Future[None] | None = None

    def pause(self) -> None:
        if self._drained is None:
            self._drained = asyncio.get_running_loop().create_future()

    def resume(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._drained = None

    def gone(self) -> None:
        self.lost = True
        if self._drained is not None and not self._drained.done():
            self._drained.set_exception(ConnectionResetError("client went away"))
            self._drained.exception()  # read: nobody may be waiting on it
        self._drained = None

    @property
    def settled(self) -> bool:
        """Nothing to wait for and nobody gone: ``drain`` would return at once (the common case costs no
        coroutine)."""
        return self._drained is None and not self.lost

    async def drain(self) -> None:
        if self._drained is not None:
            await self._drained
        if self.lost:
            raise ConnectionResetError("client went away")


class FrontRequest:
    """A request whose head has arrived; the body follows through ``read()``."""

    __slots__ = ("_body", "_continue", "_error", "_limit", "_link", "_size", "_waiter", "complete", "headers",
                 "keep_alive", "method", "path", "query_string", "target", "version")

    def __init__(self, link: Link, method: str, target: str, *, path: str, query_string: str,
                 headers: CIMultiDictProxy[str], version: str, keep_alive: bool, expect_continue: bool,
                 limit: int) -> None:
        self._link, self.method, self.target, self.path, self.query_string = link, method, target, path, query_string
        self.headers, self.version, self.keep_alive, self._limit = headers, version, keep_alive, limit
        self._continue = expect_continue
        self._body: list[bytes] = []
        self._size = 0
        self.complete = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("Content-Length")
        return int(value) if value is not None and value.isdigit() else None

    # ---- fed by the connection
    def feed(self, data: bytes) -> None:
        self._size += len(data)
        if self._size > self._limit:
            self._body.clear()
            self.fail(PayloadTooLargeError(f"Request body exceeds the limit of {self._limit} bytes"))
        elif self._error is None:
            self._body.append(data)

    def finish(self) -> None:
        self.complete = True
        self._wake()

    def fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # ---- read by the handler
    async def read(self) -> bytes:
        """The whole body (``PayloadTooLargeError`` past the limit; ``ConnectionResetError`` when the client
        went away before sending it)."""
        while not self.complete and self._error is None:
            if self._continue:
                self._continue = False
                self._link.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self._error is not None:
            raise self._error
        body = self._body
        return body[0] if len(body) == 1 else b"".join(body)


class ResponseWriter:
    """The response to one request: a head, then the body in one or more writes, then ``write_eof``."""

    __slots__ = ("_chunked", "_head_only", "_http10", "_link", "bytes_sent", "done", "keep_alive", "status")

    def __init__(self, link: Link, *, http10: bool, keep_alive: bool, head_only: bool) -> None:
        self._link, self._http10, self.keep_alive, self._head_only = link, http10, keep_alive, head_only
        self.status = 0
        self.bytes_sent = 0
        self._chunked = False
        self.done = False

    @property
    def started(self) -> bool:
        return self.status != 0

    def _head(self, status: int, reason: str | None, headers: Iterable[tuple[str, str]],
              length: int | None) -> bytes:
        self.status = status
        lines = [f"HTTP/1.1 {status} {reason or _REASONS.get(status, 'Unknown')}\r\n"]
        lines += [f"{name}: {value}\r\n" for name, value in headers]
        if status in _NO_BODY or status < 200:
            pass
        elif length is not None:
            lines.append(f"Content-Length: {length}\r\n")
        elif self._http10 or self._head_only:
            self.keep_alive = self.keep_alive and self._head_only
        else:
            self._chunked = True
            lines.append("Transfer-Encoding: chunked\r\n")
        if not self.keep_alive:
            lines.append("Connection: close\r\n")
        elif self._http10:
            lines.append("Connection: keep-alive\r\n")
        return "".join(lines).encode("utf-8", "surrogateescape") + b"Date: " + http_date() + b"\r\n\r\n"

    async def start(self, status: int, reason: str | None, headers: Iterable[tuple[str, str]],
                    length: int | None = None) -> None:
        """Send the head now (a stream: the client sees it before the first piece of the body)."""
        self._send((self._head(status, reason, headers, length),))
        if not self._link.settled:
            await self._link.drain()

    async def whole(self, status: int, reason: str | None, headers: Iterable[tuple[str, str]], body: bytes) -> None:
        """Send a complete answer (head and body in one send) and end it."""
        head = self._head(status, reason, headers, None if status in _NO_BODY else len(body))
        self._send((head,) if self._head_only or not body or status in _NO_BODY else (head, body))
        self.bytes_sent, self.done = len(body), True
        if not self._link.settled:
            await self._link.drain()

    async def write(self, data: bytes) -> None:
        """Send one piece of the body."""
        if not data or self._head_only:
            return
        self.bytes_sent += len(data)
        self._send((b"%x\r\n" % len(data), data, b"\r\n") if self._chunked else (data,))
        if not self._link.settled:
            await self._link.drain()

    async def write_eof(self) -> None:
        """End the body."""
        if self.done:
            return
        self.done = True
        if self._chunked:
            self._send((b"0\r\n\r\n",))
        if not self._link.settled:
            await self._link.drain()

    def _send(self, parts: tuple[bytes, ...]) -> None:
        transport = self._link.transport
        if self._link.lost or transport.is_closing():
            raise ConnectionResetError("client went away")
        transport.writelines(parts)

    def abort(self) -> None:
        """Cut the connection (an answer that cannot be completed must not look complete)."""
        self.keep_alive = False
        self._link.transport.close()
