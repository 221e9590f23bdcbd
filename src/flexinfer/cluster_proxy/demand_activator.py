"""The in-cluster proxy's ``Activator``: admission through the dispatcher, with the manager told what it serves.

``DemandActivator`` admits each request through ``DispatcherSync`` (the dispatcher with the watch cache's
model set declared), checks the grant against the watch cache, reports the model busy to the manager before
the request is forwarded (``inflight_report``, the swap drain gate) and keeps its demand alive while
requests are served (``DemandSignal.keep_alive``). When the first report is refused (the API server has the
model no longer Ready although our watch still does) the request is not forwarded but waits for the model
to be activated again. A request that waits for an activation is counted by the ``WaitMarker``
(``wait_marker``), and has the report written while it waits (``InflightReporter.waiting``). The heartbeat
keeps the reports of models with requests in flight or being admitted. It also subscribes to the watch cache: a
model with nothing in flight that leaves Ready or turns Preempted has its report withdrawn at once, and so does a
model whose last waiting request gave up. Built by ``flexinfer.assembly.cluster_proxy``; the proxy handler
awaits it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable

from flexinfer.api.key import ModelKey
from flexinfer.api.model import Model
from flexinfer.cluster_proxy.demand import DemandSignal, forwarding_endpoint, preempted
from flexinfer.cluster_proxy.dispatch_sync import DispatcherSync, left_ready
from flexinfer.cluster_proxy.inflight_report import InflightReporter
from flexinfer.cluster_proxy.model_watch import ModelStore
from flexinfer.cluster_proxy.wait_marker import WaitMarker, WaitTicket
from flexinfer.core.errors import ColdStartTimeoutError
from flexinfer.runtime.ports import Grant

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL = 5.0
"""How often in-flight reports are refreshed (each at most every 10 s) and models with requests in flight
are offered to ``DemandSignal.keep_alive`` (throttled to 1 m)."""
REFUSAL_WAIT = 5.0
"""After a refused first in-flight report: the longest wait for the watch cache to show the Model's newer
version before the model is marked stopped anyway (paces retries while the watch lags)."""


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

    def __init__(self, sync: DispatcherSync, store: ModelStore, *, demand: DemandSignal,
                 reporter: InflightReporter, override: bool = False, marker: WaitMarker | None = None) -> None:
        self._sync, self._store, self._override = sync, store, override
        self._demand, self._reporter, self._marker = demand, reporter, marker
        self.in_flight: dict[str, int] = {}
        self.admitting: dict[str, int] = {}
        """Model key → requests inside ``acquire`` (waiting for the model, or being reported busy)."""
        store.subscribe(self._changed)

    async def acquire(self, model: ModelKey, timeout: float | None = None,
                      on_wait: Callable[[str], None] | None = None) -> Grant:
        """Admit, then report before forwarding; a refused first report (the model left Ready in the API
        server) releases the grant and waits for the model to be activated again (see ``_refused``). A wait
        for an activation is counted by the wait marker until this call returns or raises. ``model`` is the
        key the catalog resolved; the Model is read from the watch cache by that key, never by name."""
        ticket = WaitTicket(self._marker, lambda: self._store.get(model))
        self.admitting[model] = self.admitting.get(model, 0) + 1
        granted = False
        try:
            grant = await self._acquire(model, timeout, _once(_then(self._waiting(model), on_wait)), ticket)
            granted = True
            return grant
        finally:
            ticket.end()
            left = self.admitting.pop(model, 1) - 1
            if left > 0:
                self.admitting[model] = left
            elif not granted and model not in self.in_flight:  # the last waiting request gave up
                self._reporter.idle(model, ready=self._ready(model))

    def _waiting(self, key: ModelKey) -> Callable[[str], None]:
        """A request starts waiting for ``key``'s activation: its report is written while it waits."""
        def claim(_reason: str) -> None:
            found = self._store.get(key)
            if found is not None:
                self._reporter.waiting(found)
        return claim

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
        grant = await self._sync.acquire(model, timeout, on_wait)
        found = self._store.get(grant.model)
        if found is not None and not self._current(found, grant):
            log.info("model %s: dispatcher endpoint is stale; activating again", found.key)
            grant.release()
            self._sync.forget_endpoint(found)
            grant = await self._sync.acquire(model, timeout, on_wait)
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
            self._sync.forget_endpoint(cached)

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
                self._reporter.idle(key, ready=self._ready(key))
            grant.release()

        return dataclasses.replace(grant, release=release)

    def _current(self, model: Model, grant: Grant) -> bool:
        """The cluster (watch cache) agrees: the model is served at the granted endpoint (Ready there, or a group
        pod's member forwarded to its pod: ``forwarding_endpoint``, the rule the engine's readiness uses too)."""
        return forwarding_endpoint(model, self._override) == grant.endpoint.base_url

    def _changed(self, old: Model | None, new: Model | None) -> None:
        """A model with nothing in flight left Ready in the cluster, or turned Preempted (requests may still wait
        for it): withdraw our report now (the swap that preempted it need not wait for the heartbeat). One that
        requests wait for and that is no longer Preempted (its turn came back) gets its report written again."""
        if old is None or old.key in self.in_flight:
            return
        if left_ready(old, new, self._override) or (new is not None and preempted(new) and not preempted(old)):
            self._reporter.idle(old.key, ready=False)
        elif new is not None and preempted(old) and not preempted(new) and self.admitting.get(new.key):
            self._reporter.waiting(new)

    def _ready(self, key: str) -> bool:
        cached = self._store.get(key)
        return cached is not None and forwarding_endpoint(cached, self._override) is not None

    async def heartbeat(self, interval: float = HEARTBEAT_INTERVAL) -> None:
        """Forever: refresh in-flight reports and keep demand alive for models with requests in flight."""
        while True:
            await asyncio.sleep(interval)
            for key in list(self.in_flight):
                model = self._store.get(key)
                if model is not None:
                    self._demand.keep_alive(model)
            await self._reporter.refresh(set(self.in_flight) | set(self.admitting))
