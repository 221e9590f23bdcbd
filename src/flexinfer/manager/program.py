"""``flexinfer manager``: the Kubernetes engine put together and run until stopped.

``Manager.run(stop)``: start ``/metrics`` and ``/healthz``/``/readyz``; with leader election wait for the
Lease (standbys report ready while they reach the API server); as leader, load a snapshot of the cluster
(``flexinfer.manager.sync``), start the reconcile workers and kopf (in its own thread), reconcile every
unit once, then follow watch events. It returns 0 when ``stop`` is set and 1 when leadership is lost or
kopf dies (the pod restarts and competes again). Built by ``flexinfer.assembly.run_manager``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from lightkube import KubeConfig

from flexinfer.manager.cleanup import cleanup_model, parsed_model
from flexinfer.manager.client import FIELD_MANAGER, KubeApi
from flexinfer.manager.config import ManagerConfig
from flexinfer.manager.connection import connection_info
from flexinfer.manager.http import HttpServer, health_app, metrics_app, parse_bind_address
from flexinfer.manager.leader import LeaderElector
from flexinfer.manager.operator import OperatorThread, build_registry, operator_settings
from flexinfer.manager.own_writes import counting
from flexinfer.manager.patch_session import PatchSession
from flexinfer.manager.ports import Exposition, ReconcileScope
from flexinfer.manager.queue import ReconcileQueue
from flexinfer.manager.reconciler import Reconciler
from flexinfer.manager.store import Store, Unit
from flexinfer.manager.sync import initial_sync
from flexinfer.runtime.kube_connections import kube_client
from flexinfer.runtime.observer import LifecycleObserver

log = logging.getLogger("flexinfer.manager")
Body = dict[str, Any]
KOPF_START_TIMEOUT_S = 60.0
LIVE_EVENTS = frozenset({"ADDED", "MODIFIED"})
"""Watch event types that report a change as it happens (kopf's listings have type ``None``)."""


@dataclass
class Endpoints:
    """Bound ports once the manager serves (0 when a server is disabled)."""

    metrics_port: int = 0
    health_port: int = 0


class Manager:
    """See the module docstring."""

    def __init__(self, config: ManagerConfig, kubeconfig: KubeConfig, exposition: Exposition,
                 sink: LifecycleObserver, scope: ReconcileScope) -> None:
        self.config, self._kubeconfig, self._exposition = config, kubeconfig, exposition
        self.client = kube_client(kubeconfig, field_manager=FIELD_MANAGER)
        self.patches = PatchSession(lambda: connection_info(kubeconfig))
        self.api = KubeApi(self.client, self.patches)
        self.store = Store()
        self.queue: ReconcileQueue[Unit] = ReconcileQueue(self._reconcile, workers=config.workers)
        self.reconciler = Reconciler(self.api, self.store, config.defaults, config.policy, sink=sink, scope=scope,
                                     wake=self._wake)
        self.elector = LeaderElector(self.api, config.pod_namespace, config.identity,
                                     duration=config.lease_duration, renew_every=config.renew_every)
        self.endpoints = Endpoints()
        self._operator: OperatorThread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._failed = asyncio.Event()
        self.leading = False

    # ---------------------------------------------------------------- readiness

    def ready(self) -> bool:
        """Leader: kopf runs. Standby (leader election on): the API server answers lease reads."""
        if self._operator is not None:
            return self._operator.running
        return self.config.leader_elect and self.elector.healthy

    # ---------------------------------------------------------------- bridge (kopf thread → this loop)

    def event(self, kind: str, type_: str | None, body: Body) -> None:
        """Thread-safe: hand a watch event to the manager's loop, with the moment the watch delivered it (taken
        here, in kopf's thread, so a busy loop does not delay it). kopf's listings (type ``None``: the start and
        every re-list) carry no such moment: what they show was not seen happening."""
        seen = datetime.now(UTC) if type_ in LIVE_EVENTS else None
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._apply_event, kind, type_, body, seen)

    def _apply_event(self, kind: str, type_: str | None, body: Body, seen: datetime | None = None) -> None:
        units = self.store.remove(kind, body) if type_ == "DELETED" else self.store.put(kind, body, seen)
        for unit in units:
            self.queue.add(unit)

    async def deleting(self, body: Body) -> None:
        """The Model is being deleted: clean up, forget it, let its group re-elect."""
        await cleanup_model(self.api, body, self.config.defaults)
        meta = body.get("metadata") or {}
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        self.reconciler.forget(parsed_model(body), namespace, name)
        for unit in self.store.remove("Model", body):
            self.queue.add(unit)

    # ---------------------------------------------------------------- reconcile plumbing

    async def _reconcile(self, unit: Unit) -> bool:
        """One pass; whether it wrote (the queue then runs it once more)."""
        return await counting(self.reconciler.reconcile(unit)) > 0

    def _wake(self, unit: Unit, when: datetime) -> None:
        loop = asyncio.get_running_loop()
        delay = max((when - datetime.now(UTC)).total_seconds(), 0.0)
        self.queue.wake_at(unit, loop.time() + delay)

    # ---------------------------------------------------------------- lifecycle

    async def run(self, stop: asyncio.Event, on_serving: Callable[[Manager], None] | None = None) -> int:
        """Serve until ``stop`` (0) or until leadership/kopf is lost (1)."""
        self._loop = asyncio.get_running_loop()
        servers = await self._start_http()
        try:
            if on_serving is not None:
                on_serving(self)
            if self.config.leader_elect and not await self._until_leader(stop):
                return 0
            return await self._lead(stop)
        finally:
            await self._shutdown(servers)

    async def _start_http(self) -> list[HttpServer]:
        servers: list[HttpServer] = []
        for flag, text, app in (
                ("--metrics-bind-address", self.config.metrics_bind_address, metrics_app(self._exposition)),
                ("--health-probe-bind-address", self.config.health_probe_bind_address, health_app(self.ready))):
            address = parse_bind_address(text, flag)
            if address is None:
                continue
            server = HttpServer(app, address)
            await server.start()
            servers.append(server)
            if flag.startswith("--metrics"):
                self.endpoints.metrics_port = server.port
            else:
                self.endpoints.health_port = server.port
        return servers

    async def _until_leader(self, stop: asyncio.Event) -> bool:
        acquire = asyncio.create_task(self.elector.acquire())
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({acquire, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not acquire.done():
            acquire.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await acquire
            return False
        self.leading = True
        return True

    async def _lead(self, stop: asyncio.Event) -> int:
        count = await initial_sync(self.client, self.store, self.config.namespaces)
        log.info("manager %s leading; %d models in the cluster", self.config.identity, count)
        self.queue.start()
        operator = self._start_operator()
        if not await operator.wait_ready(KOPF_START_TIMEOUT_S):
            log.error("the kopf operator did not start: %s", operator.error)
            return 1
        for unit in self.store.units():
            self.queue.add(unit)
        waits: set[asyncio.Task[Any]] = {asyncio.create_task(stop.wait()),
                                         asyncio.create_task(self._failed.wait())}
        if self.config.leader_elect:
            waits.add(asyncio.create_task(self.elector.hold()))
        _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        return 0 if stop.is_set() else 1

    def _start_operator(self) -> OperatorThread:
        assert self._loop is not None
        settings = operator_settings()
        registry = build_registry(self, lambda: connection_info(self._kubeconfig), self._loop,
                                  namespaces=len(self.config.namespaces))
        operator = OperatorThread(registry, settings, self.config.namespaces)
        loop = self._loop
        failed = self._failed

        def exited() -> None:
            loop.call_soon_threadsafe(failed.set)

        operator.on_exit = exited
        self._operator = operator
        operator.start()
        return operator

    async def _shutdown(self, servers: list[HttpServer]) -> None:
        if self._operator is not None:
            self._operator.on_exit = None
            await self._operator.stop()
        await self.queue.stop()
        await self.reconciler.prober.close()
        await self.reconciler.group_pods.close()
        if self.leading:
            await self.elector.release()
        for server in servers:
            await server.stop()
        await self.patches.close()
        await self.client.close()
