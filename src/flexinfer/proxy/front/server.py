"""The front server: listens for clients, answers the proxied OpenAI routes itself and relays every other
request (``/healthz``, ``/readyz``, ``/metrics``, ``/v1/models``, the status page, the admin API…) to the
aiohttp control application on a loopback port.

Routes served here (the route template is the request span's ``http.route``): the well-known OpenAI
operations (``POST`` only: another method is a 405), any other ``/v1/…`` path except the model list, and
``/model/<name>/…``. Shutdown: ``stop_accepting`` closes the listener, ``closing`` makes every later answer
end its connection and closes idle ones, ``close_all`` cuts what is left. Built by ``app.ProxyServer``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Awaitable, Callable

from flexinfer.core.errors import RequestError
from flexinfer.proxy.errors import MethodNotAllowedError
from flexinfer.proxy.forwarding import Forwarder, upstream_headers
from flexinfer.proxy.front.connection import FrontConnection
from flexinfer.proxy.front.message import FrontRequest, ResponseWriter
from flexinfer.proxy.hooks import NullSpan
from flexinfer.proxy.streaming import Reply

OPENAI_ROUTES = frozenset((
    "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/rerank",
    "/v1/moderations", "/v1/audio/speech", "/v1/audio/transcriptions", "/v1/audio/translations",
    "/v1/images/generations",
))
"""The well-known OpenAI paths; any other ``/v1/...`` path is proxied too, under the route ``/v1/{tail}``."""
_MODEL_PREFIX = re.compile(r"/model/[^{}/]+/")
READ_BUFFER = 65536
"""Bytes read from a client at a time."""
KEEPALIVE_TIMEOUT = 75.0
"""Seconds an idle client connection stays open (aiohttp's default, which the control port keeps)."""
ProxiedHandler = Callable[[FrontRequest, ResponseWriter, str], Awaitable[None]]


def proxied_route(path: str) -> str | None:
    """The route template of a proxied path, ``None`` for a path the control application answers."""
    if path in OPENAI_ROUTES:
        return path
    if path.startswith("/v1/"):
        return None if path == "/v1/models" or (path.startswith("/v1/models/") and len(path) > 11) else "/v1/{tail}"
    if path.startswith("/model/") and _MODEL_PREFIX.match(path):
        return "/model/{name}/{tail}"
    return None


class FrontServer:
    """Client connections, the proxied handler and the relay to the control application."""

    def __init__(self, handler: ProxiedHandler, forwarder: Forwarder, control_url: str, max_body: int) -> None:
        self._handler, self._forwarder, self._control_url = handler, forwarder, control_url
        self.max_body = max_body
        self.read_buffer = memoryview(bytearray(READ_BUFFER))
        self._connections: set[FrontConnection] = set()
        self._server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._closing = False

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0 = a free port); return the bound port."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: FrontConnection(self, self._connections.add), host, port,
                                                backlog=1024, reuse_address=True)
        self._sweeper = loop.create_task(self._sweep())
        return int(self._server.sockets[0].getsockname()[1])

    # ---- called by connections
    def serve(self, request: FrontRequest, writer: ResponseWriter) -> Awaitable[None]:
        """Answer one request (the handler's own coroutine: no frame of this one stays while it waits)."""
        if self._closing:
            writer.keep_alive = False
        route = proxied_route(request.path)
        if route is None:
            return self._relay_control(request, writer)
        if route in OPENAI_ROUTES and request.method != "POST":
            return Reply(writer, {}).fail(MethodNotAllowedError(request.method, request.path, ["POST"]))
        return self._handler(request, writer, route)

    def closed(self, connection: FrontConnection) -> None:
        self._connections.discard(connection)

    async def _relay_control(self, request: FrontRequest, writer: ResponseWriter) -> None:
        reply = Reply(writer, {})
        try:
            body = await request.read()
            await self._forwarder.relay(reply, method=request.method, base_url=self._control_url,
                                        path=request.target, headers=upstream_headers(request.headers),
                                        body=body, trace=NullSpan(), verbatim=True)
            await reply.finish()
        except RequestError as error:
            await reply.fail(error)
        except ConnectionError:
            writer.abort()

    # ---- idle connections and shutdown
    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(KEEPALIVE_TIMEOUT / 8)
            deadline = time.monotonic() - KEEPALIVE_TIMEOUT
            for connection in [c for c in self._connections if c.idle and c.last_active < deadline]:
                connection.close()

    def stop_accepting(self) -> None:
        """Close the listener; connections stay."""
        if self._server is not None:
            self._server.close()

    def closing(self) -> None:
        """From now on every answer ends its connection; idle connections are closed now."""
        self._closing = True
        for connection in [c for c in self._connections if c.idle]:
            connection.close()

    async def close_all(self) -> None:
        """Cut every connection (their requests' tasks are cancelled) and stop."""
        for connection in list(self._connections):
            connection.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
