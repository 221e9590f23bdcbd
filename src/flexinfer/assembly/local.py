"""Composition root of ``flexinfer serve`` (the local engine, the embedded default).

Manifests → ``LocalEngine`` (flash-loader staging injected) → ``Dispatcher`` (the single writer) → the proxy
application with the admin API routes, one Prometheus registry for proxy + lifecycle metrics on ``/metrics``,
and opt-in tracing. SIGTERM/SIGINT shut down gracefully (waiting requests get 503, in-flight ones finish,
every model server is stopped); a second signal kills the model servers at once. Called by
``flexinfer.cli.serve`` and the integration tests.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry

from flexinfer.api import Manifest, Model, load_manifests
from flexinfer.api.errors import FieldProblem
from flexinfer.core.errors import ConfigError
from flexinfer.flashloader.config import StageSettings
from flexinfer.flashloader.staging import stage
from flexinfer.local.admin import AdminApi
from flexinfer.local.catalog import ManifestCatalog
from flexinfer.local.config import local_config
from flexinfer.local.engine import LocalEngine
from flexinfer.local.profiles import SystemAvailability
from flexinfer.local.validation import check_manifests
from flexinfer.observability.lifecycle_log import LifecycleLog
from flexinfer.observability.metrics import LifecycleMetrics, ProxyMetrics
from flexinfer.observability.tracing import (
    Tracing,
    TracingObserver,
    init_tracing,
    proxy_tracer,
    tracing_settings,
)
from flexinfer.proxy.app import ProxyServer, create_app
from flexinfer.proxy.config import ProxyConfig, proxy_config
from flexinfer.runtime.dispatcher import Dispatcher
from flexinfer.runtime.observer import LifecycleObserver, ObserverGroup
from flexinfer.settings import Environment, environment

log = logging.getLogger("flexinfer.serve")


async def flash_stage(model: Model, src: Path, dst: Path) -> None:
    """The local engine's ``Stager``: the flash-loader library with the model's ``spec.cache.flashLoader``."""
    block = model.spec.cache.flash_loader if model.spec.cache else None
    settings = StageSettings()
    if block is not None:
        settings = replace(settings, concurrency=block.concurrency or settings.concurrency,
                           buffer_kb=block.buffer_size_kb or settings.buffer_kb,
                           verify=bool(block.verify_integrity))
    report = await stage(src, dst, settings)
    report.raise_for_failures()
    log.info("model %s: staged %s into %s (%s)", model.key, src, dst, report.summary())


def load_models(paths: Sequence[str | Path]) -> list[Manifest]:
    """The Model manifests under ``paths``; ``ConfigError`` when there are none. Objects of other API groups
    (a ConfigMap beside the manifests) are left out with a warning naming file:line and kind."""
    skipped: list[FieldProblem] = []
    manifests = [m for m in load_manifests(paths, skipped) if isinstance(m.resource, Model)]
    for problem in skipped:
        log.warning("skipped %s", problem)
    if not manifests:
        raise ConfigError(f"no Model manifests found in {', '.join(str(p) for p in paths)}")
    return manifests


SERVE_PROXY_DEFAULTS: Mapping[str, str] = {"PROXY_SHUTDOWN_DRAIN_DELAY": "0s"}
"""``PROXY_*`` defaults that differ under ``serve``: no load balancer to drain locally (the configuration
reference shows these too)."""


def local_proxy_config(env: Mapping[str, str]) -> ProxyConfig:
    """``PROXY_*`` settings, with ``SERVE_PROXY_DEFAULTS`` for the variables that are unset or blank."""
    unset = {name: value for name, value in SERVE_PROXY_DEFAULTS.items() if not env.get(name, "").strip()}
    return proxy_config({**env, **unset}).validate()


@dataclass
class LocalServer:
    """A running ``flexinfer serve``; ``close`` shuts it down in order."""

    url: str
    engine: LocalEngine
    dispatcher: Dispatcher
    proxy: ProxyServer
    tracing: Tracing

    async def close(self) -> None:
        """Reject waiting requests, let in-flight ones finish, stop every server, flush traces."""
        started = time.monotonic()
        try:
            await asyncio.gather(self.proxy.shutdown(), self.dispatcher.shutdown())
        finally:
            await self.engine.aclose()
            self.tracing.shutdown()
            log.info("stopped in %.1fs", time.monotonic() - started)


def _observer(registry: CollectorRegistry, tracing: Tracing, lifecycle_log: LifecycleLog) -> LifecycleObserver:
    observers: list[LifecycleObserver] = [LifecycleMetrics(registry), lifecycle_log]
    if tracing.enabled:
        observers.append(TracingObserver(tracing))
    return ObserverGroup(observers)


def _proxy_app(config: ProxyConfig, models: list[Model], dispatcher: Dispatcher, engine: LocalEngine, *,
               registry: CollectorRegistry, tracing: Tracing) -> web.Application:
    """The proxy application over the dispatcher, plus the admin API routes."""
    catalog = ManifestCatalog(models, lambda: {s.key: s.phase for s in dispatcher.snapshot()})
    app = create_app(config, dispatcher, catalog, registry=registry,
                     metrics=ProxyMetrics(registry, [m.key for m in models]),
                     tracer=proxy_tracer(tracing))
    admin = AdminApi(dispatcher, catalog, engine.logs, engine.pid,
                     token=config.auth_token if config.auth_enabled else "")
    app.router.add_routes(admin.routes())
    return app


async def start_local(paths: Sequence[str | Path], *, host: str = "127.0.0.1", port: int = 8080,
                      env: Environment | None = None, base_dir: Path | None = None) -> LocalServer:
    """Load the manifests and start everything; returns once the proxy listens (models start on demand)."""
    env = env if env is not None else environment()
    manifests = load_models(paths)
    models = [m.resource for m in manifests if isinstance(m.resource, Model)]
    proxy_cfg = local_proxy_config(env)
    local = local_config(env, base_dir or Path.cwd(), cold_start_timeout=proxy_cfg.cold_start_timeout,
                         queue_limit=proxy_cfg.max_queue_size)
    problems = check_manifests(manifests, SystemAvailability(path=env.get("PATH")), local.engine.base_dir,
                               every_source=True)
    if problems:
        log.warning("%d manifest problem(s) (`flexinfer validate` reports the same); the models concerned fail "
                    "when activated, the others are served:", len(problems))
    for problem in problems:
        log.warning("%s", problem)
    registry, tracing = CollectorRegistry(), init_tracing("flexinfer", tracing_settings(env))
    engine = LocalEngine(local.engine, stager=flash_stage)
    lifecycle_log = LifecycleLog(lambda key: dispatcher.state(key))  # noqa: PLW0108 (dispatcher is built next)
    dispatcher = Dispatcher(engine, models, policy=local.policy,
                            observer=_observer(registry, tracing, lifecycle_log))
    engine.on_exit = dispatcher.model_exited
    app = _proxy_app(proxy_cfg, models, dispatcher, engine, registry=registry, tracing=tracing)
    proxy = ProxyServer(app, proxy_cfg)
    dispatcher.start()
    try:
        bound = await proxy.start(host, port)
    except OSError as exc:
        await dispatcher.shutdown()
        await engine.aclose()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    shown = f"[{host}]" if ":" in host else host
    return LocalServer(f"http://{shown}:{bound}", engine, dispatcher, proxy, tracing)


async def serve_local(paths: Sequence[str | Path], *, host: str, port: int, env: Environment | None = None,
                      stop: asyncio.Event, on_ready: Callable[[LocalServer], None] | None = None) -> None:
    """``start_local``, serve until ``stop`` is set, then ``close`` (also when cancelled)."""
    server = await start_local(paths, host=host, port=port, env=env)
    try:
        if on_ready is not None:
            on_ready(server)
        await stop.wait()
    finally:
        try:
            await asyncio.shield(server.close())
        finally:
            server.engine.kill_all()


def _announce(server: LocalServer) -> None:
    print(f"flexinfer serve: listening on {server.url} (OpenAI API at {server.url}/v1, metrics at "
          f"{server.url}/metrics); Ctrl-C stops", flush=True)


async def _serve_until_signalled(paths: Sequence[str | Path], host: str, port: int, env: Environment) -> None:
    loop, stop = asyncio.get_running_loop(), asyncio.Event()
    main = asyncio.current_task()
    servers: list[LocalServer] = []

    def on_signal() -> None:
        if not stop.is_set():
            log.info("shutting down (signal again to kill model servers now)")
            stop.set()
            return
        for server in servers:
            server.engine.kill_all()
        if main is not None:
            main.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)

    def ready(server: LocalServer) -> None:
        servers.append(server)
        _announce(server)

    await serve_local(paths, host=host, port=port, env=env, stop=stop, on_ready=ready)


def run_local(paths: Sequence[str | Path], host: str = "127.0.0.1", port: int = 8080,
              env: Environment | None = None) -> int:
    """``flexinfer serve``: serve until SIGTERM/SIGINT; returns the exit code."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(_serve_until_signalled(paths, host, port, env if env is not None else environment()))
    except asyncio.CancelledError:
        return 130
    return 0
