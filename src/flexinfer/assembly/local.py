"""Composition root of ``flexinfer serve`` (the local engine, the embedded default).

Manifests → ``LocalEngine`` (flash-loader staging injected; which models are staged, and how, is resolved as in
the cluster from the ``DEFAULT_FLASH_LOADER_*`` environment, the ModelCache manifests loaded with the Models and
each Model's ``spec.cache.flashLoader``: ``flexinfer.local.flash_settings``) → ``Dispatcher`` (the single
writer) → the proxy application with the admin API routes, one Prometheus registry for proxy + lifecycle metrics
on ``/metrics``, and opt-in tracing. On start it reaps model servers a killed ``serve`` left behind.
SIGTERM/SIGINT shut down gracefully (waiting requests get 503, in-flight ones finish, every model server is
stopped); a second signal shuts down now (in-flight requests end with a ``shutting down`` error, model servers
get SIGTERM and, after the close grace, SIGKILL) and ``serve`` exits within ``HURRY_BOUND`` seconds whatever
happens; a third SIGKILLs the model servers at once. SIGHUP, and a change of the manifest files (polled unless
``watch_interval`` is ``None``), reload the manifests (``flexinfer.local.reloading``): models are added, changed
(only that model restarts, after draining) and removed without touching the others. Groups given a memory budget
(``FLEXINFER_GROUP_MEMORY``, ``--group-memory``: ``flexinfer.local.memory_budget``, resolved once at start) pack
their members by memory; the dispatcher gets the engine's estimate of their needs (``flexinfer.local.memory_estimate``:
a GGUF header for llama.cpp, vLLM's own rule for vLLM).
The admin API also takes a pushed manifest text (checked and applied as a reload) and lists the cold starts and
swaps (``flexinfer.local.lifecycle_events``); ``FLEXINFER_ADMIN_TOKEN``/``--admin-token-file`` guard it apart from the
API's auth. Called by ``flexinfer.cli.serve`` and the integration tests.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry

from flexinfer.api import Manifest, Model
from flexinfer.api.errors import FieldProblem
from flexinfer.api.loading import load_manifest_texts, read_manifest_files
from flexinfer.api.modelcache import ModelCache
from flexinfer.api.units import parse_quantity
from flexinfer.assembly import event_loop
from flexinfer.assembly.process_age import process_age
from flexinfer.core.errors import ConfigError, InsufficientSpaceError
from flexinfer.core.flashloader_settings import FlashLoaderConfig, staging_variables
from flexinfer.core.manifest_revision import manifest_revision
from flexinfer.flashloader.config import StageSettings, settings_from_env
from flexinfer.flashloader.staging import stage, statvfs_free, within_limit
from flexinfer.local.admin import AdminApi
from flexinfer.local.catalog import ManifestCatalog
from flexinfer.local.config import local_config, resolve_admin_token, state_dir
from flexinfer.local.engine import LocalEngine
from flexinfer.local.flash_settings import FlashSettings
from flexinfer.local.gpu_discovery import GpuInventory
from flexinfer.local.lifecycle_events import LifecycleEvents
from flexinfer.local.memory_budget import parse_entries, resolve_budgets
from flexinfer.local.memory_estimate import MemoryEstimator, discovery_reader
from flexinfer.local.profiles import SystemAvailability
from flexinfer.local.reloading import DEFAULT_WATCH_INTERVAL, ManifestReloader
from flexinfer.local.validation import check_manifests
from flexinfer.observability.lifecycle_log import LifecycleLog
from flexinfer.observability.memory_metrics import MemoryMetrics
from flexinfer.observability.metrics import LifecycleMetrics, ProxyMetrics
from flexinfer.observability.tracing.config import tracing_settings
from flexinfer.observability.tracing.lifecycle import TracingObserver
from flexinfer.observability.tracing.provider import Tracing, init_tracing
from flexinfer.observability.tracing.proxy import proxy_tracer
from flexinfer.proxy.app import ProxyServer, create_app
from flexinfer.proxy.auth import BearerAuth
from flexinfer.proxy.config import ProxyConfig, proxy_config
from flexinfer.proxy.status_page import StatusPage, install
from flexinfer.runtime.activity import ActivityLog
from flexinfer.runtime.background import Background
from flexinfer.runtime.dispatcher import Dispatcher
from flexinfer.runtime.observer import LifecycleObserver, ObserverGroup
from flexinfer.settings import Environment, environment, warn

log = logging.getLogger("flexinfer.serve")
HURRY_SLACK = 3.0
"""Seconds allowed on top of the close grace for a hurried shutdown before ``serve`` gives up waiting."""


@dataclass(frozen=True)
class LocalStaging:
    """How ``serve`` stages one model: the flash-loader library's settings, and the tmpfs size limit."""

    settings: StageSettings
    tmpfs_size_limit: str | None


def local_staging(model: Model, config: FlashLoaderConfig) -> LocalStaging:
    """The resolved settings as the local engine applies them: parsed from the ``FLASH_*`` variables the
    cluster's init container gets; a non-shared model's ``tmpfsSizeLimit`` caps its staged copy (in the cluster
    it is the sizeLimit of its tmpfs; a shared model's tmpfs has none)."""
    return LocalStaging(settings_from_env(staging_variables(model, config)),
                        config.tmpfs_size_limit if model.group is None else None)


async def flash_stage(model: Model, src: Path, dst: Path, config: FlashLoaderConfig) -> None:
    """The local engine's ``Stager``: the flash-loader library with the model's resolved settings."""
    how = local_staging(model, config)
    limit = how.tmpfs_size_limit
    free_space = statvfs_free if limit is None else within_limit(int(parse_quantity(limit)), statvfs_free)
    try:
        report = await stage(src, dst, how.settings, free_space=free_space)
    except InsufficientSpaceError as exc:
        if limit is None:
            raise
        raise InsufficientSpaceError(exc.needed, exc.available, f"{exc.path} (tmpfsSizeLimit {limit})") from None
    report.raise_for_failures()
    log.info("model %s: staged %s into %s with concurrency %d, buffer %d KiB, verify %s, tmpfs limit %s (%s)",
             model.key, src, dst, how.settings.concurrency, how.settings.buffer_kb,
             "on" if how.settings.verify else "off", limit or "none", report.summary())


def load_models(paths: Sequence[str | Path]) -> tuple[list[Manifest], str]:
    """The Model and ModelCache manifests under ``paths`` and the revision of their bytes; ``ConfigError`` when
    there is no Model. Objects of other API groups (a ConfigMap beside the manifests) are left out with a warning
    naming file:line:column and kind."""
    skipped: list[FieldProblem] = []
    texts = read_manifest_files(paths)
    manifests = [m for m in load_manifest_texts(texts, skipped) if isinstance(m.resource, Model | ModelCache)]
    for problem in skipped:
        log.warning("skipped %s", problem)
    if not any(isinstance(m.resource, Model) for m in manifests):
        raise ConfigError(f"no Model manifests found in {', '.join(str(p) for p in paths)}")
    return manifests, manifest_revision(b"".join(t.data for t in texts))


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
    reloader: ManifestReloader | None = None
    _hurrying: asyncio.Future[None] | None = None
    _reloads: Background = field(default_factory=Background)
    _closing: bool = False

    def reload(self, trigger: str) -> None:
        """Reload the manifests in the background (SIGHUP); ignored once ``close`` began."""
        if self.reloader is None or self._closing:
            return
        self._reloads.spawn(self.reloader.reload(trigger))

    def watch(self) -> None:
        """Start polling the manifest files for changes (see ``flexinfer.local.reloading``)."""
        if self.reloader is not None:
            self._reloads.spawn(self.reloader.watch())

    async def close(self) -> None:
        """Reject waiting requests, let in-flight ones finish, stop every server, flush traces."""
        started = time.monotonic()
        self._closing = True
        self._reloads.cancel()
        try:
            await asyncio.gather(self.proxy.shutdown(), self.dispatcher.shutdown())
        finally:
            await self.engine.aclose()
            self.tracing.shutdown()
            log.info("stopped in %.1fs", time.monotonic() - started)

    def hurry(self) -> None:
        """Make a running (or not yet started) ``close`` finish now: end in-flight requests with an error,
        skip the model drain, SIGTERM every model server (SIGKILL after the close grace)."""
        aborted = self.proxy.state.abort()
        log.info("shutting down now: %d request(s) in flight stopped, model servers terminated", aborted)
        self.engine.hurry()
        self._hurrying = asyncio.ensure_future(self.dispatcher.shutdown(drain_timeout=0.0))

    @property
    def hurry_bound(self) -> float:
        """How long a hurried ``close`` may take before ``serve`` stops waiting for it."""
        return self.engine.settings.close_grace + HURRY_SLACK


def _observer(registry: CollectorRegistry, tracing: Tracing, activity: ActivityLog,
              lifecycle_log: LifecycleLog, events: LifecycleEvents) -> LifecycleObserver:
    observers: list[LifecycleObserver] = [LifecycleMetrics(registry), activity, lifecycle_log, events]
    if tracing.enabled:
        observers.append(TracingObserver(tracing))
    return ObserverGroup(observers)


def _proxy_app(config: ProxyConfig, catalog: ManifestCatalog, metrics: ProxyMetrics, dispatcher: Dispatcher,
               engine: LocalEngine, *, reloader: ManifestReloader, registry: CollectorRegistry, tracing: Tracing,
               activity: ActivityLog, events: LifecycleEvents, admin_token: str) -> web.Application:
    """The proxy application over the dispatcher, plus the admin API routes (``admin_token`` guards them when
    set, else the proxy's token when its auth is on) and the status page."""
    app = create_app(config, dispatcher, catalog, registry=registry, metrics=metrics, tracer=proxy_tracer(tracing))
    admin = AdminApi(dispatcher, catalog, engine.logs, engine.pid,
                     token=admin_token or (config.auth_token if config.auth_enabled else ""),
                     config=reloader.status.as_json, memory=engine.memory, groups=dispatcher.memory_report,
                     push=reloader.push, lifecycle=events)
    app.router.add_routes(admin.routes())
    auth = BearerAuth(config.auth_token if config.auth_enabled else None)
    install(app, StatusPage(dispatcher.snapshot, activity, auth, "local", logs=engine.logs.tail,
                            memory=dispatcher.memory_report))
    return app


def _applier(dispatcher: Dispatcher, catalog: ManifestCatalog, metrics: ProxyMetrics,
             flash: FlashSettings, engine: LocalEngine) -> Callable[[list[Model], list[ModelCache]], Awaitable[None]]:
    """Apply a reloaded model set: the ModelCaches first (a model started from now on stages with them), the
    engine drops the prompt caches of removed models (and saves none when they stop), then the dispatcher
    declares the models (an added model is known before the catalog routes to it), then the proxy metrics and
    the catalog follow (a removed model answers 404 from then on)."""

    async def apply(models: list[Model], caches: list[ModelCache]) -> None:
        flash.replace_caches(caches)
        engine.prune({m.key for m in models})
        await dispatcher.replace_models(models)
        metrics.declare_models(m.key for m in models)
        catalog.replace(models)

    return apply


def _warn_problems(problems: Sequence[object]) -> None:
    """Manifest problems do not stop ``serve``: the models concerned fail when activated, the others serve."""
    if problems:
        log.warning("%d manifest problem(s) (`flexinfer validate` reports the same); the models concerned fail "
                    "when activated, the others are served:", len(problems))
    for problem in problems:
        log.warning("%s", problem)


async def start_local(paths: Sequence[str | Path], *, host: str = "127.0.0.1", port: int = 8080,
                      env: Environment | None = None, base_dir: Path | None = None,
                      watch_interval: float | None = DEFAULT_WATCH_INTERVAL,
                      group_memory: Sequence[str] = (), admin_token_file: Path | None = None) -> LocalServer:
    """Load the manifests and start everything; returns once the proxy listens (models start on demand).
    With ``watch_interval`` (seconds) the manifest files are polled and reloaded on change; ``group_memory``:
    the ``--group-memory`` entries (they win over ``FLEXINFER_GROUP_MEMORY`` for the groups they name);
    ``admin_token_file``: ``--admin-token-file`` (wins over ``FLEXINFER_ADMIN_TOKEN``)."""
    env = env if env is not None else environment()
    manifests, revision = load_models(paths)
    models = [m.resource for m in manifests if isinstance(m.resource, Model)]
    caches = [m.resource for m in manifests if isinstance(m.resource, ModelCache)]
    proxy_cfg = local_proxy_config(env)
    local = local_config(env, base_dir or Path.cwd(), cold_start_timeout=proxy_cfg.cold_start_timeout,
                         queue_limit=proxy_cfg.max_queue_size,
                         max_concurrency=proxy_cfg.max_concurrency_per_model, warn=warn)
    token = resolve_admin_token(local, admin_token_file)
    installed = SystemAvailability(path=env.get("PATH"))
    _warn_problems(check_manifests(manifests, installed, local.engine.base_dir, every_source=True))
    registry, tracing = CollectorRegistry(), init_tracing("flexinfer", tracing_settings(env))
    flash = FlashSettings(local.flash_loader, tuple(caches))
    gpus = GpuInventory(path=env.get("PATH"))
    budgets = await resolve_budgets({**local.group_memory, **parse_entries(group_memory, "--group-memory")},
                                    models, gpus)
    engine = LocalEngine(replace(local.engine, records_dir=state_dir(env) / "processes"), stager=flash_stage,
                         flash=flash, gpus=gpus)
    engine.reap_leftovers()
    engine.prune({m.key for m in models})
    activity, lifecycle_log, events = ActivityLog(), LifecycleLog(), LifecycleEvents()
    weights_dir = local.engine.base_dir
    dispatcher = Dispatcher(engine, models, policy=replace(local.policy, group_budgets=budgets),
                            observer=_observer(registry, tracing, activity, lifecycle_log, events),
                            estimate=MemoryEstimator(weights_dir, env=local.engine.env,
                                                     gpus=discovery_reader(gpus, asyncio.get_running_loop())))
    catalog = ManifestCatalog(models, dispatcher.phase)
    metrics = ProxyMetrics(registry, [m.key for m in models])
    MemoryMetrics(dispatcher.memory_report, dispatcher.snapshot).register(registry)
    reloader = ManifestReloader(paths, models, _applier(dispatcher, catalog, metrics, flash, engine), caches=caches,
                                installed=installed, base_dir=local.engine.base_dir,
                                interval=watch_interval or DEFAULT_WATCH_INTERVAL, revision=revision)
    app = _proxy_app(proxy_cfg, catalog, metrics, dispatcher, engine, reloader=reloader, registry=registry,
                     tracing=tracing, activity=activity, events=events, admin_token=token)
    proxy = ProxyServer(app, proxy_cfg)
    dispatcher.start()
    try:
        bound = await proxy.start(host, port)
    except OSError as exc:
        await dispatcher.shutdown()
        await engine.aclose()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    shown = f"[{host}]" if ":" in host else host
    server = LocalServer(f"http://{shown}:{bound}", engine, dispatcher, proxy, tracing, reloader)
    if watch_interval is not None:
        server.watch()
    return server


async def serve_local(paths: Sequence[str | Path], *, host: str, port: int, env: Environment | None = None,
                      stop: asyncio.Event, on_ready: Callable[[LocalServer], None] | None = None,
                      watch_interval: float | None = DEFAULT_WATCH_INTERVAL, group_memory: Sequence[str] = (),
                      admin_token_file: Path | None = None) -> None:
    """``start_local``, serve until ``stop`` is set, then ``close`` (also when cancelled)."""
    server = await start_local(paths, host=host, port=port, env=env, watch_interval=watch_interval,
                               group_memory=group_memory, admin_token_file=admin_token_file)
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
    age = process_age()
    started = "" if age is None else f"; started in {age:.2f} s"
    print(f"flexinfer serve: listening on {server.url} (OpenAI API at {server.url}/v1, metrics at "
          f"{server.url}/metrics, status page at {server.url}/ui{started}); Ctrl-C stops", flush=True)


async def _serve_until_signalled(paths: Sequence[str | Path], host: str, port: int, env: Environment,
                                 watch_interval: float | None, *, group_memory: Sequence[str],
                                 admin_token_file: Path | None) -> None:
    loop, stop = asyncio.get_running_loop(), asyncio.Event()
    main = asyncio.current_task()
    servers: list[LocalServer] = []
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            log.info("shutting down (signal again to stop in-flight requests and model servers now)")
            stop.set()
            return
        if not servers and main is not None:  # still starting: nothing to drain
            main.cancel()
        for server in servers:
            if signals == 2:
                server.hurry()
                if main is not None:  # the last resort: nothing below may hold the exit past the bound
                    loop.call_later(server.hurry_bound, main.cancel)
            else:
                server.engine.kill_all()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)

    def on_hangup() -> None:
        if not servers:
            log.warning("SIGHUP while starting: the manifests just loaded are in force")
        for server in servers:
            log.info("SIGHUP: reloading the manifests")
            server.reload("signal")

    loop.add_signal_handler(signal.SIGHUP, on_hangup)

    def ready(server: LocalServer) -> None:
        servers.append(server)
        _announce(server)

    await serve_local(paths, host=host, port=port, env=env, stop=stop, on_ready=ready, watch_interval=watch_interval,
                      group_memory=group_memory, admin_token_file=admin_token_file)


def run_local(paths: Sequence[str | Path], host: str = "127.0.0.1", port: int = 8080,
              env: Environment | None = None, watch_interval: float | None = DEFAULT_WATCH_INTERVAL, *,
              group_memory: Sequence[str] = (), admin_token_file: Path | None = None) -> int:
    """``flexinfer serve``: serve until SIGTERM/SIGINT (SIGHUP reloads the manifests); returns the exit code.
    ``watch_interval`` ``None`` turns the polling of the manifest files off; ``group_memory``: the
    ``--group-memory`` entries; ``admin_token_file``: ``--admin-token-file``."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    environ = env if env is not None else environment()
    try:
        event_loop.run(_serve_until_signalled(paths, host, port, environ, watch_interval, group_memory=group_memory,
                                              admin_token_file=admin_token_file), environ)
    except asyncio.CancelledError:
        return 130
    return 0
