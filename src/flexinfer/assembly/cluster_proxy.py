"""The Kubernetes half of ``flexinfer proxy``: watch cache, catalog, demand engine and the proxy's dispatcher.

In the cluster the manager elects shared-group members and scales idle models down, so the proxy's
dispatcher runs every Model as its own group and never stops one on idle (``dispatch_model``); its job is
the per-model request queue, the cold-start budget and in-flight accounting. ``DispatcherSync`` mirrors
the watch cache into it: spec changes redeclare the model set, and a model that leaves Ready in the cluster
(preempted, scaled down, deleted) is marked stopped so the next request activates it again.
``DemandActivator`` wraps the dispatcher's ``Activator``: it reports in-flight requests to the manager
(``inflight_report``, the swap drain gate) and keeps demand alive while requests are served; when the first
report is refused (the API server has the model no longer Ready although our watch still does) the request
is not forwarded but waits for the model to be activated again. Everything the proxy tells the manager
goes into this replica's ``ModelDemand`` reports (``demand_report``); it never writes Models. Requests that
wait for an activation are counted by the ``WaitMarker`` (``flexinfer.cluster_proxy.wait_marker``), which
publishes the oldest wait for the manager's starvation bound.
``ClusterSide`` builds and runs all of it; ``flexinfer.assembly.run_proxy`` is its only production caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from flexinfer.api.base import ObjectMeta
from flexinfer.api.key import ModelKey
from flexinfer.api.model import Model, ServerlessSpec
from flexinfer.cluster_proxy.catalog import WatchCatalog
from flexinfer.cluster_proxy.demand import STALL_AFTER, DemandSignal, KubeEngine, endpoint_of
from flexinfer.cluster_proxy.demand_report import DemandReport, PodOwner
from flexinfer.cluster_proxy.inflight_report import InflightReporter, proxy_identity
from flexinfer.cluster_proxy.model_api import ModelApi
from flexinfer.cluster_proxy.model_watch import ModelStore, ModelWatcher
from flexinfer.cluster_proxy.wait_marker import WaitMarker, WaitTicket
from flexinfer.core.arbiter import events as ev
from flexinfer.core.arbiter.policy import ArbiterPolicy
from flexinfer.core.envvalues import EnvReader, EnvVar, Kind, Policy
from flexinfer.core.errors import ColdStartTimeoutError, ConfigError
from flexinfer.runtime.dispatcher import Dispatcher
from flexinfer.runtime.observer import LifecycleObserver
from flexinfer.runtime.ports import Activator, Grant

log = logging.getLogger(__name__)

NEVER = "876000h"
"""The proxy-side idle timeout (100 years): only the manager scales models down."""
HEARTBEAT_INTERVAL = 5.0
"""How often in-flight reports are refreshed (each at most every 10 s) and models with requests in flight
are offered to ``DemandSignal.keep_alive`` (throttled to 1 m)."""
REFUSAL_WAIT = 5.0
"""After a refused first in-flight report: the longest wait for the watch cache to show the Model's newer
version before the model is marked stopped anyway (paces retries while the watch lags)."""


@dataclass(frozen=True)
class ClusterProxySettings:
    """The proxy's Kubernetes settings (``cluster_proxy_settings`` parses them from the environment)."""

    namespace: str | None = "default"
    """Watched namespace; ``None`` = all namespaces."""
    endpoint_override: bool = False
    identity: str = "flexinfer-proxy"
    """This replica's name in in-flight reports (``POD_NAME``)."""
    cold_start_timeout: float = 60.0
    queue_limit: int = 100
    pod_namespace: str = ""
    """The proxy pod's own namespace (``POD_NAMESPACE``), also in all-namespaces mode."""
    pod_uid: str = ""
    """The proxy pod's UID (``POD_UID``): its reports in ``pod_namespace`` are owned by the pod, so the
    garbage collector deletes them with it; empty = no owner reference."""
    stall_after: float = STALL_AFTER
    """``PROXY_STALL_TIMEOUT``: a weights load without progress for this long is stalled (``KubeEngine``)."""


def cluster_proxy_settings(env: Mapping[str, str], *, cold_start_timeout: float = 60.0,
                           queue_limit: int = 100, stall_after: float = STALL_AFTER) -> ClusterProxySettings:
    """``POD_NAMESPACE`` (default ``default``, with a warning), ``FLEXINFER_PROXY_ALL_NAMESPACES`` and the
    test-only ``FLEXINFER_PROXY_ENDPOINT_OVERRIDE`` (both default false), ``POD_NAME`` (the identity in
    in-flight reports; hostname and pid when unset). Both flags guard access (which Models are served, where
    traffic goes): an unparsable value is a ``ConfigError`` naming it."""
    read = EnvReader(env)
    namespace = read.text("POD_NAMESPACE")
    if not namespace:
        log.warning("POD_NAMESPACE is not set; watching Models in namespace 'default'")
        namespace = "default"
    all_namespaces = read.flag("FLEXINFER_PROXY_ALL_NAMESPACES", False, Policy.GUARD)
    override = read.flag("FLEXINFER_PROXY_ENDPOINT_OVERRIDE", False, Policy.GUARD)
    if override:
        log.warning("FLEXINFER_PROXY_ENDPOINT_OVERRIDE is on: the flexinfer.ai/endpoint-override annotation "
                    "redirects traffic. This is for tests only; never enable it in production.")
    identity = proxy_identity(env.get("POD_NAME", ""), f"{socket.gethostname()}-{os.getpid()}")
    return ClusterProxySettings(None if all_namespaces else namespace, override, identity, cold_start_timeout,
                                queue_limit, pod_namespace=namespace, pod_uid=env.get("POD_UID", "").strip(),
                                stall_after=stall_after)


def dispatch_model(model: Model) -> Model:
    """The Model as the proxy's dispatcher sees it: no shared group, never pinned, never idle-stopped; the
    cold-start timeout kept. Status and server-side metadata are dropped (they change on every event)."""
    spec = model.spec
    gpu = spec.gpu.model_copy(update={"shared": None}) if spec.gpu is not None else None
    cold = spec.serverless.cold_start_timeout if spec.serverless is not None else None
    serverless = ServerlessSpec(enabled=True, min_replicas=0, idle_timeout=NEVER, cold_start_timeout=cold)
    return Model(metadata=ObjectMeta(name=model.name, namespace=model.namespace),
                 spec=spec.model_copy(update={"gpu": gpu, "serverless": serverless}))


def proxy_policy(settings: ClusterProxySettings) -> ArbiterPolicy:
    """Queue limit and cold-start budget from the proxy settings; no restart backoff (a failed activation is
    retried by the next request, as the manager may have fixed the cause)."""
    return ArbiterPolicy(cold_start_timeout=settings.cold_start_timeout, queue_limit=settings.queue_limit,
                         restart_backoff=0.0, restart_backoff_max=0.0)


class DispatcherSync:
    """Mirrors the watch cache into the proxy's dispatcher (see the module docstring)."""

    def __init__(self, store: ModelStore, dispatcher: Dispatcher, override: bool,
                 left_ready: Callable[[Model], None] = lambda _: None) -> None:
        self._dispatcher, self._override, self._left_ready_hook = dispatcher, override, left_ready
        self._declared: dict[str, Model] = {}
        self._dirty = False
        self._scheduled = False
        store.subscribe(self._changed)

    def _changed(self, old: Model | None, new: Model | None) -> None:
        current = new if new is not None else old
        if current is None:
            return
        key = current.key
        projected = dispatch_model(new) if new is not None else None
        if self._declared.get(key) != projected:
            if projected is None:
                self._declared.pop(key, None)
            else:
                self._declared[key] = projected
            self._mark_dirty()
        if old is not None and self._left_ready(old, new):
            self._stopped(old)

    def _mark_dirty(self) -> None:
        self._dirty = True
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Declare the current model set now (before a request is admitted, so it never races a new Model)."""
        self._scheduled = False
        if self._dirty:
            self._dirty = False
            self._dispatcher.post(ev.ModelsReplaced(tuple(self._declared.values())))

    def _left_ready(self, old: Model, new: Model | None) -> bool:
        if old.status.phase != "Ready":
            return False
        if new is None or new.status.phase != "Ready":
            return True
        return endpoint_of(old, self._override) != endpoint_of(new, self._override)

    def _stopped(self, model: Model) -> None:
        self.flush()
        self._left_ready_hook(model)
        if any(s.key == model.key and s.phase == "Ready" for s in self._dispatcher.snapshot()):
            log.info("model %s left Ready in the cluster; the next request activates it again", model.key)
            self.forget_endpoint(model)

    def forget_endpoint(self, model: Model) -> None:
        """Tell the dispatcher the model's server is gone (a stop, not a crash: no Failed phase)."""
        self._dispatcher.post(ev.ModelStopped(model.key))


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)


def _once(callback: Callable[[str], None] | None) -> Callable[[str], None] | None:
    """``callback`` called at most once (an admission may be retried after a refused report)."""
    if callback is None:
        return None
    called = False

    def call(model: str) -> None:
        nonlocal called
        if not called:
            called = True
            callback(model)

    return call


def _then(first: Callable[[str], None], second: Callable[[str], None] | None) -> Callable[[str], None]:
    def both(reason: str) -> None:
        first(reason)
        if second is not None:
            second(reason)
    return both


class DemandActivator:
    """An ``Activator`` that reports in-flight requests and keeps demand alive for the models it serves."""

    def __init__(self, inner: Activator, store: ModelStore, *, demand: DemandSignal, reporter: InflightReporter,
                 override: bool = False, marker: WaitMarker | None = None) -> None:
        self._inner, self._store, self._override = inner, store, override
        self._demand, self._reporter, self._marker = demand, reporter, marker
        self.before: Callable[[], None] = lambda: None
        """Called before each admission (``DispatcherSync.flush``)."""
        self.stale: Callable[[Model], None] = lambda _: None
        """Called with a model whose grant disagreed with the cluster (``DispatcherSync.forget_endpoint``)."""
        self.in_flight: dict[str, int] = {}

    async def acquire(self, model: ModelKey, timeout: float | None = None,
                      on_wait: Callable[[str], None] | None = None) -> Grant:
        """Admit, then report before forwarding; a refused first report (the model left Ready in the API
        server) releases the grant and waits for the model to be activated again (see ``_refused``). A wait
        for an activation is counted by the wait marker until this call returns or raises. ``model`` is the
        key the catalog resolved; the Model is read from the watch cache by that key, never by name."""
        ticket = WaitTicket(self._marker, lambda: self._store.get(model))
        try:
            return await self._acquire(model, timeout, _once(on_wait), ticket)
        finally:
            ticket.end()

    async def _acquire(self, model: ModelKey, timeout: float | None, on_wait: Callable[[str], None] | None,
                       ticket: WaitTicket) -> Grant:
        deadline = None if timeout is None else time.monotonic() + timeout
        waiting = _then(ticket.begin, on_wait)
        while True:
            grant, found = await self._admit(model, _remaining(deadline), waiting)
            if found is None:
                return grant
            try:
                accepted = await self._reporter.busy(found)
            except BaseException:
                grant.release()
                raise
            if accepted:
                return self._track(grant, found)
            grant.release()
            await self._refused(found, grant, deadline)

    async def _admit(self, model: ModelKey, timeout: float | None,
                     on_wait: Callable[[str], None] | None) -> tuple[Grant, Model | None]:
        self.before()
        grant = await self._inner.acquire(model, timeout, on_wait)
        found = self._store.get(grant.model)
        if found is not None and not self._current(found, grant):
            log.info("model %s: dispatcher endpoint is stale; activating again", found.key)
            grant.release()
            self.stale(found)
            grant = await self._inner.acquire(model, timeout, on_wait)
            found = self._store.get(grant.model)
        return grant, found

    async def _refused(self, seen: Model, grant: Grant, deadline: float | None) -> None:
        """The API server refused the first report: ``seen`` (Ready in our cache) is not Ready there. Wait,
        bounded by ``REFUSAL_WAIT``, for the watch to deliver a newer version (``DispatcherSync`` then marks
        the model stopped); if the cache still says Ready, mark it stopped ourselves. The next admission
        activates the model again (demand signal) and waits for the manager to make it Ready."""
        left = _remaining(deadline)
        if left is not None and left <= 0:
            raise ColdStartTimeoutError(f"model {seen.key} is not Ready in the cluster (in-flight report refused)")
        version = seen.metadata.resource_version
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(REFUSAL_WAIT if left is None else min(REFUSAL_WAIT, left)):
                await self._store.wait_until(
                    seen.key, lambda m: True if m is None or m.metadata.resource_version != version else None)
        cached = self._store.get(seen.key)
        if cached is not None and self._current(cached, grant):
            self.stale(cached)

    def _track(self, grant: Grant, model: Model) -> Grant:
        key, released = model.key, False
        self.in_flight[key] = self.in_flight.get(key, 0) + 1
        self._demand.keep_alive(model)

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            left = self.in_flight.get(key, 1) - 1
            if left > 0:
                self.in_flight[key] = left
            else:
                self.in_flight.pop(key, None)
                self._reporter.idle(model, ready=self._ready(key))
            grant.release()

        return dataclasses.replace(grant, release=release)

    def _current(self, model: Model, grant: Grant) -> bool:
        """The cluster (watch cache) agrees: the model is Ready at the granted endpoint."""
        return model.status.phase == "Ready" and endpoint_of(model, self._override) == grant.endpoint.base_url

    def left_ready(self, model: Model) -> None:
        """The model left Ready in the cluster: with nothing in flight, withdraw our report now (the swap that
        preempted it need not wait for the heartbeat)."""
        if model.key not in self.in_flight:
            self._reporter.idle(model, ready=False)

    def _ready(self, key: str) -> bool:
        cached = self._store.get(key)
        return cached is not None and cached.status.phase == "Ready"

    async def heartbeat(self, interval: float = HEARTBEAT_INTERVAL) -> None:
        """Forever: refresh in-flight reports and keep demand alive for models with requests in flight."""
        while True:
            await asyncio.sleep(interval)
            for key in list(self.in_flight):
                model = self._store.get(key)
                if model is not None:
                    self._demand.keep_alive(model)
            await self._reporter.refresh(set(self.in_flight))


class ClusterSide:
    """Store + watcher + catalog + demand + engine + dispatcher for the in-cluster proxy."""

    def __init__(self, api: ModelApi, settings: ClusterProxySettings,
                 observer: LifecycleObserver | None = None) -> None:
        self.settings = settings
        self.store = ModelStore()
        self.watcher = ModelWatcher(api, self.store, settings.namespace)
        self.catalog = WatchCatalog(self.store)
        owner = PodOwner(settings.pod_namespace, settings.identity, settings.pod_uid) if settings.pod_uid else None
        self.report = DemandReport(api, settings.identity, owner=owner)
        self.demand = DemandSignal(self.report, self.store)
        self.engine = KubeEngine(self.store, self.demand, endpoint_override=settings.endpoint_override,
                                 cold_start_timeout=settings.cold_start_timeout, stall_after=settings.stall_after)
        self.dispatcher = Dispatcher(self.engine, policy=proxy_policy(settings), observer=observer)
        self.reporter = InflightReporter(self.report, api)
        self.marker = WaitMarker(self.report, self.store)
        self.activator = DemandActivator(self.dispatcher, self.store, demand=self.demand, reporter=self.reporter,
                                         override=settings.endpoint_override, marker=self.marker)
        self.sync = DispatcherSync(self.store, self.dispatcher, settings.endpoint_override,
                                   left_ready=self.activator.left_ready)
        self.activator.before, self.activator.stale = self.sync.flush, self.sync.forget_endpoint
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, sync_timeout: float = 30.0) -> None:
        """Start the watch, the dispatcher and the heartbeat; return once the first list is in the cache."""
        self.dispatcher.start()
        self._tasks = [asyncio.create_task(self.watcher.run(), name="flexinfer-model-watch"),
                       asyncio.create_task(self.activator.heartbeat(), name="flexinfer-demand-heartbeat"),
                       asyncio.create_task(self.report.run(), name="flexinfer-demand-renew")]
        try:
            async with asyncio.timeout(sync_timeout):
                await self.store.synced.wait()
        except TimeoutError:
            await self.close()
            where = self.settings.namespace or "all namespaces"
            raise ConfigError(f"cannot list Models ({where}) within {sync_timeout:.0f}s: "
                              f"{self.watcher.last_error or 'no answer from the API server'}") from None

    async def close(self) -> None:
        """Reject waiting requests, stop the dispatcher, the watch and background writes; delete the reports."""
        await self.dispatcher.shutdown(drain_timeout=0.0)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.reporter.aclose()
        await self.reporter.clear_all()
        await self.demand.aclose()
        await self.marker.aclose()
        await self.report.delete_all()


ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar("POD_NAMESPACE", "default", "Namespace whose Models the proxy serves (a warning when unset)."),
    EnvVar("FLEXINFER_PROXY_ALL_NAMESPACES", "false",
           "Serve Models of every namespace (a name used in several is addressed as `namespace/name`).",
           Kind.BOOL, Policy.GUARD),
    EnvVar("POD_NAME", "hostname-pid", "This replica's name: its ModelDemand reports are named after it."),
    EnvVar("POD_UID", "unset", "This pod's UID: its ModelDemand in its own namespace is deleted with the pod."),
    EnvVar("KUBECONFIG", "in-cluster service account", "Kubeconfig file (`--kubeconfig` wins)."),
    EnvVar("FLEXINFER_PROXY_ENDPOINT_OVERRIDE", "false",
           "TEST ONLY: route to the `flexinfer.ai/endpoint-override` annotation instead of status.endpoint.",
           Kind.BOOL, Policy.GUARD),
)
"""The environment ``cluster_proxy_settings`` reads (for ``flexinfer settings`` and the docs)."""
