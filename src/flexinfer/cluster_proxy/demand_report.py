"""This proxy replica's ``ModelDemand`` reports: the only objects the in-cluster proxy writes.

One ``ModelDemand`` per namespace this replica serves Models in, named after the replica (``object_name``)
and living in that namespace, holds per Model name what ``DemandSignal`` (``lastActiveTime``), the
``WaitMarker`` (``waitingSince``) and the ``InflightReporter`` (``inFlightAt``) report to the manager
(``flexinfer.api.modeldemand``). ``write`` merge-patches one Model's fields together with ``renewTime``
(the replica's heartbeat). One patch per object is in flight at a time: fields written meanwhile, for any Model of
the namespace, go together in the next one (an activation's ``lastActiveTime`` and ``waitingSince`` land in one
write instead of two concurrent patches of one object, which the API server serialises by retrying one of them:
13 ms instead of 4 on the real node), each caller returning once the patch that carried its fields landed; a
later value of a field still waiting replaces the earlier one. The first write of this process to a namespace
creates the object, or resets the ``spec`` of one left by an earlier run of the same pod (so no old wait or
in-flight report revives). ``renew`` (every ``RENEW_INTERVAL``, from ``run``; through the same one writer) keeps
``renewTime`` fresh while a report holds a wait or requests in flight, so the manager can tell a live replica from a
dead one. ``delete_all`` removes the objects at shutdown; the report in the pod's own namespace is also owned by the
pod (``PodOwner``), so the garbage collector deletes it when the pod goes (owner references cannot cross
namespaces: a report in another namespace outlives a crashed pod, inert once its ``renewTime`` is stale).
A missing CRD is reported as such. Built by ``flexinfer.assembly.cluster_proxy``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from flexinfer.api.base import GROUP
from flexinfer.api.conventions import PROXY_LABEL
from flexinfer.api.modeldemand import API_VERSION, KIND, PLURAL
from flexinfer.cluster_proxy.demand import rfc3339, utc_now
from flexinfer.cluster_proxy.model_api import KubeApiError, ModelApi

log = logging.getLogger(__name__)

RENEW_INTERVAL = 10.0
"""``renewTime`` refresh period while a wait or requests in flight are reported (the manager's TTL is 30 s)."""
LIVE_FIELDS = ("waitingSince", "inFlightAt")
"""Fields that only count while ``renewTime`` is fresh."""


@dataclass(frozen=True)
class PodOwner:
    """The proxy pod, owner of its report in its own namespace."""

    namespace: str
    name: str
    uid: str

    def reference(self) -> dict[str, str]:
        return {"apiVersion": "v1", "kind": "Pod", "name": self.name, "uid": self.uid}


def object_name(identity: str) -> str:
    """A valid object name (DNS label) for this replica's reports."""
    cleaned = re.sub(r"[^a-z0-9-]", "-", identity.lower())[:63].strip("-")
    return cleaned or "flexinfer-proxy"


@dataclass
class _Batch:
    """Fields waiting for the next patch of one report object, and the writers waiting for it to land."""

    models: dict[str, dict[str, str | None]] = field(default_factory=dict)
    waiters: list[asyncio.Future[None]] = field(default_factory=list)


class DemandReport:
    """See the module docstring. ``write`` raises ``KubeApiError``; ``renew``/``delete_all`` only log."""

    def __init__(self, api: ModelApi, identity: str, *, owner: PodOwner | None = None,
                 now: Callable[[], datetime] = utc_now, clock: Callable[[], float] = time.monotonic,
                 renew_interval: float = RENEW_INTERVAL) -> None:
        self._api, self._identity, self._owner, self._now, self._clock = api, identity, owner, now, clock
        self._renew_interval = renew_interval
        self.name = object_name(identity)
        self._ready: set[str] = set()
        self._locks: dict[str, asyncio.Lock] = {}
        self._live: dict[str, set[tuple[str, str]]] = {}
        """namespace → (model, field) reported with a value among ``LIVE_FIELDS``."""
        self._renewed: dict[str, float] = {}
        self._pending: dict[str, _Batch] = {}
        self._senders: dict[str, asyncio.Task[None]] = {}
        self.writes = 0
        """Patches that landed (each may carry several writes)."""

    async def write(self, namespace: str, model: str, fields: Mapping[str, str | None]) -> None:
        """Merge ``fields`` into this replica's report on ``model`` (``None`` removes a field); returns once the
        patch carrying them landed, raises what it failed with."""
        await self._submit(namespace, {model: fields})

    async def _submit(self, namespace: str, models: Mapping[str, Mapping[str, str | None]]) -> None:
        """Add ``models``' fields to the namespace's next patch (none: only ``renewTime``) and wait for it."""
        batch = self._pending.setdefault(namespace, _Batch())
        for model, fields in models.items():
            batch.models.setdefault(model, {}).update(fields)
        landed = asyncio.get_running_loop().create_future()
        batch.waiters.append(landed)
        if namespace not in self._senders:
            self._senders[namespace] = asyncio.create_task(self._send(namespace), name=f"demand-report-{namespace}")
        await landed

    async def _send(self, namespace: str) -> None:
        """Patch the namespace's report until no fields wait (one patch in flight; see the module docstring)."""
        try:
            while (batch := self._pending.pop(namespace, None)) is not None:
                try:
                    await self._patch(namespace, batch.models)
                except Exception as exc:  # every writer of the batch gets the failure
                    _settle(batch.waiters, exc)
                except BaseException:
                    _settle(batch.waiters, None, cancelled=True)
                    raise
                else:
                    _settle(batch.waiters, None)
        finally:
            self._senders.pop(namespace, None)  # cancelled (shutdown): ``delete_all`` ends the writes still queued

    async def _patch(self, namespace: str, models: Mapping[str, Mapping[str, str | None]]) -> None:
        for attempt in (1, 2):
            await self._ensure(namespace)
            stamp = self._clock()
            patch = {"spec": {"renewTime": rfc3339(self._now()), "models": {m: dict(f) for m, f in models.items()}}}
            try:
                await self._api.patch_demand(namespace, self.name, patch)
            except KubeApiError as exc:
                if exc.status == 404 and attempt == 1:  # deleted behind our back: create it again
                    self._ready.discard(namespace)
                    continue
                raise
            self.writes += 1
            self._renewed[namespace] = stamp
            for model, fields in models.items():
                self._track(namespace, model, fields)
            return

    def _track(self, namespace: str, model: str, fields: Mapping[str, str | None]) -> None:
        live = self._live.setdefault(namespace, set())
        for name, value in fields.items():
            if name in LIVE_FIELDS:
                (live.add if value is not None else live.discard)((model, name))

    async def _ensure(self, namespace: str) -> None:
        if namespace in self._ready:
            return
        async with self._locks.setdefault(namespace, asyncio.Lock()):
            if namespace in self._ready:
                return
            spec: dict[str, Any] = {"proxy": self._identity, "models": {}}
            metadata: dict[str, Any] = {"name": self.name, "namespace": namespace, "labels": {PROXY_LABEL: self.name}}
            if self._owner is not None and self._owner.namespace == namespace:
                metadata["ownerReferences"] = [self._owner.reference()]
            try:
                await self._api.create_demand(namespace, {"apiVersion": API_VERSION, "kind": KIND,
                                                          "metadata": metadata, "spec": spec})
            except KubeApiError as exc:
                if exc.status == 404:
                    raise KubeApiError(f"the ModelDemand CRD ({PLURAL}.{GROUP}) is not installed: {exc}", 404) from None
                if exc.status != 409:
                    raise
                await self._api.replace_demand_spec(namespace, self.name, spec)
            self._ready.add(namespace)

    async def renew(self) -> None:
        """Refresh ``renewTime`` where a wait or requests in flight are reported and it is due."""
        for namespace, live in list(self._live.items()):
            if not live or self._clock() - self._renewed.get(namespace, float("-inf")) < self._renew_interval:
                continue
            try:
                await self._submit(namespace, {})  # the one writer: never a patch concurrent with another
            except KubeApiError as exc:
                log.warning("cannot renew the demand report %s/%s: %s", namespace, self.name, exc)

    async def run(self, interval: float = RENEW_INTERVAL / 2) -> None:
        """Forever: ``renew`` every ``interval`` seconds."""
        while True:
            await asyncio.sleep(interval)
            await self.renew()

    async def delete_all(self) -> None:
        """Delete this replica's reports (shutdown; writes not sent yet are dropped); failures are logged."""
        senders = list(self._senders.values())
        for sender in senders:
            sender.cancel()
        await asyncio.gather(*senders, return_exceptions=True)
        self._senders.clear()  # a sender cancelled before it first ran never reached its ``finally``
        for batch in self._pending.values():
            _settle(batch.waiters, None, cancelled=True)
        self._pending.clear()
        for namespace in sorted(self._ready):
            try:
                await self._api.delete_demand(namespace, self.name)
            except KubeApiError as exc:
                if exc.status != 404:
                    log.warning("cannot delete the demand report %s/%s: %s", namespace, self.name, exc)
        self._ready.clear()
        self._live.clear()


def _settle(waiters: list[asyncio.Future[None]], error: Exception | None, *, cancelled: bool = False) -> None:
    """Wake the writers of one batch (a writer that was cancelled meanwhile already has its answer)."""
    for waiter in waiters:
        if waiter.done():
            continue
        if cancelled:
            waiter.cancel()
        elif error is not None:
            waiter.set_exception(error)
        else:
            waiter.set_result(None)
