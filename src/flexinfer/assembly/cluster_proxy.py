"""The Kubernetes half of ``flexinfer proxy``, composed: settings, the dispatcher's policy, and ``ClusterSide``.

In the cluster the manager elects shared-group members and owns scaling, so the proxy's dispatcher runs
every Model as its own group and leaves scaling to the manager (``proxy_policy``: ``owns_scaling`` off); its
job is the per-model request queue, the cold-start budget and in-flight accounting. ``ClusterSide`` builds
the pieces of ``flexinfer.cluster_proxy`` in dependency order, each from the ones it calls, with no
callback assigned after construction (``A → B``: A calls B):

    ModelWatcher → ModelStore              the watch cache; its listeners: DispatcherSync, WaitMarker,
                                           DemandActivator (each subscribes itself)
    WatchCatalog → ModelStore              request names → Model keys
    DemandActivator → DispatcherSync → Dispatcher → KubeEngine → DemandSignal → DemandReport
                    → InflightReporter → DemandReport (+ a fresh GET of the Model)
                    → WaitMarker → DemandReport

Everything the proxy tells the manager goes into this replica's ``ModelDemand`` reports; it never writes
Models. ``flexinfer.assembly.proxy.start_proxy`` is the only production caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from flexinfer.cluster_proxy.catalog import WatchCatalog
from flexinfer.cluster_proxy.demand import STALL_AFTER, DemandSignal, KubeEngine
from flexinfer.cluster_proxy.demand_activator import DemandActivator
from flexinfer.cluster_proxy.demand_report import DemandReport, PodOwner
from flexinfer.cluster_proxy.dispatch_sync import DispatcherSync
from flexinfer.cluster_proxy.inflight_report import InflightReporter, proxy_identity
from flexinfer.cluster_proxy.model_api import ModelApi
from flexinfer.cluster_proxy.model_watch import ModelStore, ModelWatcher
from flexinfer.cluster_proxy.wait_marker import WaitMarker
from flexinfer.core.arbiter.policy import ArbiterPolicy
from flexinfer.core.envvalues import EnvReader, EnvVar, Kind, Policy
from flexinfer.core.errors import ConfigError
from flexinfer.core.swap_knobs import check_bound_fits, swap_knobs
from flexinfer.runtime.dispatcher import Dispatcher
from flexinfer.runtime.observer import LifecycleObserver

log = logging.getLogger(__name__)


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
    max_concurrency: int = 0
    """``PROXY_MAX_CONCURRENCY_PER_MODEL``: the cap on top of each model's own parallel capacity."""
    pod_namespace: str = ""
    """The proxy pod's own namespace (``POD_NAMESPACE``), also in all-namespaces mode."""
    pod_uid: str = ""
    """The proxy pod's UID (``POD_UID``): its reports in ``pod_namespace`` are owned by the pod, so the
    garbage collector deletes them with it; empty = no owner reference."""
    stall_after: float = STALL_AFTER
    """``PROXY_STALL_TIMEOUT``: a weights load without progress for this long is stalled (``KubeEngine``)."""


def cluster_proxy_settings(env: Mapping[str, str], *, cold_start_timeout: float = 60.0,
                           queue_limit: int = 100, stall_after: float = STALL_AFTER,
                           max_concurrency: int = 0) -> ClusterProxySettings:
    """``POD_NAMESPACE`` (default ``default``, with a warning), ``FLEXINFER_PROXY_ALL_NAMESPACES`` and the
    test-only ``FLEXINFER_PROXY_ENDPOINT_OVERRIDE`` (both default false), ``POD_NAME`` (the identity in
    in-flight reports; hostname and pid when unset). Both flags guard access (which Models are served, where
    traffic goes): an unparsable value is a ``ConfigError`` naming it. The manager's starvation bound
    (``FLEXINFER_SWAP_MAX_WAIT``, rendered into both by the chart) must fit inside ``cold_start_timeout``, the
    budget of a waiting request: else a ``ConfigError`` naming both settings."""
    read = EnvReader(env)
    check_bound_fits(swap_knobs(env).max_wait, cold_start_timeout)
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
                                stall_after=stall_after, max_concurrency=max_concurrency)


def proxy_policy(settings: ClusterProxySettings) -> ArbiterPolicy:
    """Queue limit, concurrency cap and cold-start budget from the proxy settings; the manager owns scaling
    (``minReplicas``, idle scale-down), so the dispatcher neither starts a model without a request nor stops an
    idle one; no restart backoff (a failed activation is retried by the next request, as the manager may have
    fixed the cause)."""
    return ArbiterPolicy(cold_start_timeout=settings.cold_start_timeout, queue_limit=settings.queue_limit,
                         max_concurrency=settings.max_concurrency, restart_backoff=0.0, restart_backoff_max=0.0,
                         owns_scaling=False)


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
        self.sync = DispatcherSync(self.store, self.dispatcher, settings.endpoint_override)
        self.reporter = InflightReporter(self.report, api, self.store)
        self.marker = WaitMarker(self.report, self.store)
        self.activator = DemandActivator(self.sync, self.store, demand=self.demand, reporter=self.reporter,
                                         override=settings.endpoint_override, marker=self.marker)
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
