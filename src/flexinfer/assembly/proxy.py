"""Composition root of ``flexinfer proxy`` (the in-cluster OpenAI-compatible proxy).

A watch-backed Model cache and demand signalling (``flexinfer.assembly.cluster_proxy``) behind the proxy
application, proxy metrics on ``/metrics``, the status page (with the memory of the groups that pack by memory, from
the Models' status), opt-in tracing; SIGTERM drains. Called by ``flexinfer.cli.proxy``
and the integration tests.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from flexinfer.api import Model
from flexinfer.assembly import event_loop
from flexinfer.assembly.cluster_proxy import ClusterSide, cluster_proxy_settings
from flexinfer.cluster_proxy.memory_groups import memory_groups
from flexinfer.cluster_proxy.model_api import LightkubeModelApi
from flexinfer.cluster_proxy.model_watch import ModelStore
from flexinfer.core.errors import ConfigError
from flexinfer.manager.connection import load_kubeconfig
from flexinfer.observability.lifecycle_log import LifecycleLog
from flexinfer.observability.metrics import ProxyMetrics
from flexinfer.observability.tracing.config import tracing_settings
from flexinfer.observability.tracing.lifecycle import TracingObserver
from flexinfer.observability.tracing.provider import Tracing, init_tracing
from flexinfer.observability.tracing.proxy import proxy_tracer
from flexinfer.proxy.app import ProxyServer, create_app
from flexinfer.proxy.auth import BearerAuth
from flexinfer.proxy.config import proxy_config
from flexinfer.proxy.status_page import StatusPage, catalog_states, install
from flexinfer.runtime.activity import ActivityLog
from flexinfer.runtime.observer import LifecycleObserver, ObserverGroup
from flexinfer.settings import Environment, environment

log = logging.getLogger("flexinfer.proxy")


@dataclass
class ClusterProxy:
    """A running ``flexinfer proxy``; ``close`` drains the HTTP side, then stops the Kubernetes side."""

    url: str
    side: ClusterSide
    proxy: ProxyServer
    tracing: Tracing
    api: LightkubeModelApi

    async def close(self) -> None:
        try:
            await self.proxy.shutdown()
            await self.side.close()
        finally:
            await self.api.aclose()
            self.tracing.shutdown()


def _declare_names(metrics: ProxyMetrics, store: ModelStore) -> Callable[[Model | None, Model | None], None]:
    """A store listener that keeps the proxy metrics' declared models equal to the cached Model keys."""

    def changed(old: Model | None, new: Model | None) -> None:
        if old is None or new is None:
            metrics.declare_models(m.key for m in store.all())

    return changed


async def start_proxy(*, host: str = "0.0.0.0", port: int = 8080, kubeconfig: str | None = None,
                      env: Environment | None = None) -> ClusterProxy:
    """Validate the settings, sync the Model cache, then listen; returns once the proxy serves."""
    env = env if env is not None else environment()
    proxy_cfg = proxy_config(env).validate()
    settings = cluster_proxy_settings(env, cold_start_timeout=proxy_cfg.cold_start_timeout,
                                      queue_limit=proxy_cfg.max_queue_size, stall_after=proxy_cfg.stall_timeout,
                                      max_concurrency=proxy_cfg.max_concurrency_per_model)
    trace_settings = tracing_settings(env)  # every setting is checked before anything connects
    api = LightkubeModelApi.connect(load_kubeconfig(kubeconfig, env))
    registry, tracing = CollectorRegistry(), init_tracing("flexinfer-proxy", trace_settings)
    activity = ActivityLog()
    observers: list[LifecycleObserver] = [activity, LifecycleLog(),
                                          *([TracingObserver(tracing)] if tracing.enabled else [])]
    side = ClusterSide(api, settings, observer=ObserverGroup(observers))
    try:
        await side.start()
        metrics = ProxyMetrics(registry, [m.key for m in side.store.all()])
        side.store.subscribe(_declare_names(metrics, side.store))
        app = create_app(proxy_cfg, side.activator, side.catalog, registry=registry, metrics=metrics,
                         tracer=proxy_tracer(tracing))
        install(app, StatusPage(catalog_states(side.catalog, side.dispatcher.snapshot), activity,
                                BearerAuth(proxy_cfg.auth_token if proxy_cfg.auth_enabled else None), "cluster",
                                memory=lambda: memory_groups(side.store.all())))
        proxy = ProxyServer(app, proxy_cfg)
        bound = await proxy.start(host, port)
    except BaseException as exc:
        await side.close()
        await api.aclose()
        tracing.shutdown()
        if isinstance(exc, OSError):
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        raise
    shown = f"[{host}]" if ":" in host else host
    log.info("proxy listening on http://%s:%d (Models in %s)", shown, bound, settings.namespace or "all namespaces")
    return ClusterProxy(f"http://{shown}:{bound}", side, proxy, tracing, api)


async def _proxy_until_signalled(host: str, port: int, kubeconfig: str | None, env: Environment) -> None:
    loop, stop = asyncio.get_running_loop(), asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = await start_proxy(host=host, port=port, kubeconfig=kubeconfig, env=env)
    print(f"flexinfer proxy: listening on {server.url}", flush=True)
    try:
        await stop.wait()
        log.info("shutting down")
    finally:
        await asyncio.shield(server.close())


def run_proxy(host: str = "0.0.0.0", port: int = 8080, kubeconfig: str | None = None,
              env: Environment | None = None) -> int:
    """``flexinfer proxy``: serve until SIGTERM/SIGINT (graceful drain); returns the exit code."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    environ = env if env is not None else environment()
    event_loop.run(_proxy_until_signalled(host, port, kubeconfig, environ), environ)
    return 0
