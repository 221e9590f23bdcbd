"""The proxy: its aiohttp control application, the proxied handler, and the server that runs both.

``create_app(config, activator, catalog, registry=…, metrics=…, tracer=…)`` builds the control application
(``/healthz``, ``/readyz``, ``/metrics``, ``/v1/models``; the assemblies add the status page and the admin
API) and the proxied handler it carries. ``ProxyServer`` serves the proxied routes itself on the front
server (``front/``: an asyncio protocol with ``httptools``, handler cancellation on client disconnect) and
relays every other request to the control application on a loopback port; it drains on shutdown.
``run(...)`` serves until a stop event is set. Called by ``flexinfer.assembly`` (run_local, run_proxy), the
proxy tests and ``bench/proxy_overhead.py``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from flexinfer.core.errors import ModelNotFoundError, RequestError
from flexinfer.proxy.config import ProxyConfig
from flexinfer.proxy.draining import DrainState
from flexinfer.proxy.errors import InternalError, MethodNotAllowedError, RouteNotFoundError, error_response
from flexinfer.proxy.forwarding import Forwarder
from flexinfer.proxy.front.server import FrontServer
from flexinfer.proxy.handler import ProxyHandler
from flexinfer.proxy.hooks import NullMetrics, NullTracer, ProxyMetrics, ProxyTracer
from flexinfer.proxy.models import model_entry_for, model_list
from flexinfer.runtime.ports import Activator, Catalog

log = logging.getLogger(__name__)

DRAIN = web.AppKey("flexinfer_proxy_drain", DrainState)
METRICS = web.AppKey("flexinfer_proxy_metrics", ProxyMetrics)
PROXIED = web.AppKey("flexinfer_proxy_handler", ProxyHandler)
FORWARDER = web.AppKey("flexinfer_proxy_forwarder", Forwarder)
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def error_middleware(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """Turn every error outside the proxied flow into the OpenAI envelope (never a traceback)."""
    try:
        return await handler(request)
    except RequestError as error:
        return error_response(error)
    except web.HTTPMethodNotAllowed as exc:
        return error_response(MethodNotAllowedError(request.method, request.path, exc.allowed_methods))
    except web.HTTPNotFound:
        return error_response(RouteNotFoundError(f"Unknown path {request.path}"))
    except web.HTTPException:
        raise
    except Exception:
        log.exception("unexpected error on %s %s", request.method, request.path)
        return error_response(InternalError())


def create_app(config: ProxyConfig, activator: Activator, catalog: Catalog, *,
               registry: CollectorRegistry | None = None, metrics: ProxyMetrics | None = None,
               tracer: ProxyTracer | None = None) -> web.Application:
    """The control application and the proxied handler (``app[PROXIED]``). ``registry`` is rendered on
    ``/metrics`` (404 when ``None``)."""
    app = web.Application(client_max_size=config.max_body_bytes, middlewares=[error_middleware])
    drain, forwarder = DrainState(), Forwarder(config.upstream_connect_timeout,
                                                 config.upstream_max_connections)
    app[DRAIN], app[METRICS], app[FORWARDER] = drain, metrics or NullMetrics(), forwarder
    tracing = tracer or NullTracer()
    proxied = app[PROXIED] = ProxyHandler(config, activator=activator, catalog=catalog, forwarder=forwarder,
                                          metrics=app[METRICS], tracer=tracing, drain=drain)

    async def list_models(request: web.Request) -> web.Response:
        span, status = tracing.start_list_models(request.method, request.headers), 500
        try:
            allow_only(request, "GET")
            proxied.auth.check(request.headers.get("Authorization"))
            listed = model_list(catalog.models())
            data = listed["data"]
            span.set_attribute("flexinfer.models", len(data) if isinstance(data, list) else 0)
            status = 200
            return web.json_response(listed)
        except RequestError as error:
            status = error.status
            raise
        finally:
            span.end(status)

    async def retrieve_model(request: web.Request) -> web.Response:
        allow_only(request, "GET")
        proxied.auth.check(request.headers.get("Authorization"))
        model_id = request.match_info["id"]
        entry = model_entry_for(model_id, catalog)
        if entry is None:
            raise ModelNotFoundError(model_id)
        return web.json_response(entry)

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="draining", status=503) if drain.draining else web.Response(text="ok")

    async def metrics_page(_: web.Request) -> web.Response:
        if registry is None:
            raise RouteNotFoundError("metrics are not enabled")
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_page)
    app.router.add_route("*", "/v1/models", list_models)
    app.router.add_route("*", "/v1/models/{id:.+}", retrieve_model)
    app.on_startup.append(lambda _: forwarder.start())
    app.on_cleanup.append(lambda _: forwarder.close())
    return app


def allow_only(request: web.Request, method: str) -> None:
    """``405`` with ``Allow: method`` unless the request uses ``method`` (``HEAD`` goes with ``GET``)."""
    if request.method != method and not (method == "GET" and request.method == "HEAD"):
        raise MethodNotAllowedError(request.method, request.path, [method])


async def _healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok")


class ProxyServer:
    """Serves one proxy on a TCP port (the front server, with the control application behind it on a
    loopback port) and shuts it down gracefully."""

    def __init__(self, app: web.Application, config: ProxyConfig) -> None:
        self._app, self._config = app, config
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
        self._front: FrontServer | None = None
        self.port = 0
        self.closed = False

    @property
    def state(self) -> DrainState:
        """Readiness, accepting and in-flight state (for operators and tests)."""
        return self._app[DRAIN]

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen on ``host:port`` (0 = a free port); return the bound port."""
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, "127.0.0.1", 0).start()
            control = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
            self._front = FrontServer(self._app[PROXIED].handle, self._app[FORWARDER], control,
                                      self._config.max_body_bytes)
            self.port = await self._front.start(host, port)
        except BaseException:
            if self._front is not None:
                await self._front.close_all()
                self._front = None
            await self._runner.cleanup()  # closes the upstream client the start-up hooks opened
            raise
        return self.port

    async def shutdown(self) -> str:
        """Drain: /readyz → 503, wait the drain delay, stop accepting, wait for in-flight requests
        (bounded by the graceful timeout), then close. Returns ``completed`` or ``timeout``."""
        drain, metrics = self._app[DRAIN], self._app[METRICS]
        if drain.draining:
            return "completed"
        started = time.monotonic()
        drain.draining = True
        metrics.shutdown("started", 0.0)
        await asyncio.sleep(self._config.shutdown_drain_delay)
        front = self._front
        if front is not None:
            front.stop_accepting()
        drain.accepting = False
        if front is not None:
            front.closing()
        idle = await drain.wait_idle(self._config.graceful_shutdown_timeout)
        if front is not None:
            await front.close_all()
        self._app[PROXIED].access.write()
        await self._runner.cleanup()
        self.closed = True
        result = "completed" if idle else "timeout"
        metrics.shutdown(result, time.monotonic() - started)
        return result


async def run(app: web.Application, config: ProxyConfig, *, host: str, port: int, stop: asyncio.Event,
              on_ready: Callable[[int], None] | None = None) -> str:
    """Serve until ``stop`` is set, then shut down gracefully; returns the shutdown result."""
    server = ProxyServer(app, config)
    bound = await server.start(host, port)
    log.info("proxy listening on http://%s:%d", host, bound)
    if on_ready is not None:
        on_ready(bound)
    await stop.wait()
    return await server.shutdown()
