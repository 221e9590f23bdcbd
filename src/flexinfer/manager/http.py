"""The manager's HTTP endpoints: ``/metrics`` (Prometheus text from an injected ``Exposition``, written chunk by
chunk so that reconciles run between chunks of a large scrape) on the metrics address, ``/healthz`` and
``/readyz`` on the health-probe address. An address ``0`` disables a server.

``/healthz`` answers 200 while the process serves; ``/readyz`` asks a callback (the manager: operator
running as leader, or a standby that can reach the API server). Used by ``flexinfer.manager.program``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from flexinfer.core.errors import ConfigError
from flexinfer.manager.ports import Exposition


def parse_bind_address(text: str, flag: str) -> tuple[str, int] | None:
    """``:8080`` → all interfaces, ``127.0.0.1:0`` → an ephemeral port, ``0`` → disabled."""
    value = text.strip()
    if value == "0":
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{flag}: expected [HOST]:PORT or 0, got {text!r}")
    return (host.strip("[]") or "0.0.0.0"), int(port)


class HttpServer:
    """One aiohttp site; ``port`` is the bound port after ``start``."""

    def __init__(self, app: web.Application, address: tuple[str, int]) -> None:
        self._runner = web.AppRunner(app, access_log=None)
        self._address = address
        self.port = 0

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._address[0], self._address[1])
        try:
            await site.start()
        except OSError as error:
            await self._runner.cleanup()
            raise ConfigError(f"cannot listen on {self._address[0]}:{self._address[1]}: {error.strerror}") from None
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else self._address[1]

    async def stop(self) -> None:
        await self._runner.cleanup()


def metrics_app(exposition: Exposition) -> web.Application:
    async def metrics(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE_LATEST})
        await response.prepare(request)
        for chunk in exposition():
            await response.write(chunk)
            await asyncio.sleep(0)  # the reconciles' turn between chunks
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


def health_app(ready: Callable[[], bool]) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="ok") if ready() else web.Response(status=503, text="not ready")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app
