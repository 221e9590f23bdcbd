"""The in-cluster proxy's in-flight reports: how the manager knows not to cut a swap's outgoing model off.

While this proxy forwards requests to a model it keeps ``inFlightAt`` for the model in its ``ModelDemand``
report (``flexinfer.cluster_proxy.demand_report``) at the RFC 3339 time of its last refresh (the manager's drain
gate, ``flexinfer.core.model_status.plan``: a preempted model keeps its replica while a report younger
than 30 s exists, bounded by the swap drain timeout). A request may be forwarded under a report only once a read
of the Model that came after the report landed shows it served: the manager marks a model Preempted first and then
reads the reports afresh, so either the manager sees our report (and drains) or that read sees the model no
longer served (and we do not forward). Writes:

- ``waiting(model)`` when a request starts waiting for the model to be activated: the report is written then, in
  the same patch as the demand when they go together, and the Model is read once it landed (in the background:
  the request waits for the activation anyway). Read served: the report is confirmed. Read not served yet: the
  read's ``resourceVersion`` is kept, and once the watch (which delivers a Model's versions in order) has
  delivered that version, any later version it delivers was written after the read, so after the report landed:
  the first request forwarded after Ready needs no write and no read. A re-list of the watch forgets that order
  (a listing may be older than the read). A model that turns Preempted with nothing in flight has its report
  withdrawn at once (``DemandActivator``), so it never holds the drain of a model it was only waiting for;
- ``busy(model)`` before a request is forwarded. With a confirmed report (or an early one the watch has ordered)
  it returns at once. Otherwise (the first request after an idle period, or an early report the watch could not
  order; requests arriving meanwhile wait for the same write and read instead of each doing their own — 64 at once
  took 1.3 s against a busy API server) it writes the report when there is none, then reads the Model afresh: if
  it is no longer served there (Ready, or forwarded to its group pod), or the report was withdrawn meanwhile, the
  report is withdrawn and ``busy`` returns ``False`` (the caller must not forward the request; it re-activates).
  With a report of ours already confirmed, a due re-stamp (older than ``refresh``, 10 s) is a plain write in the
  background, one per model at a time: that report already holds the drain, so no request waits for the write (at
  c=64, every request in the window used to write and wait, a p99 of half a second);
- ``refresh(busy_keys)`` from the heartbeat: re-stamps the reports of models with requests in flight or waiting
  every ``refresh``, removes the others;
- ``idle(model, ready)`` when the last request ends (forwarded or not): removed at once if the model is no longer
  Ready in the cluster (a swap is waiting for it), else lazily by the next ``refresh`` (no write per request).
Other failures (403, 404, transport errors) are logged and never fail a request. Built by
``flexinfer.assembly.cluster_proxy``; used by ``DemandActivator`` (``flexinfer.cluster_proxy.demand_activator``).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Collection, Coroutine, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flexinfer.api.model import Model
from flexinfer.cluster_proxy.demand import forwarding_endpoint, preempted, rfc3339, utc_now
from flexinfer.cluster_proxy.demand_report import DemandReport
from flexinfer.cluster_proxy.model_api import KubeApiError, ModelApi
from flexinfer.cluster_proxy.model_watch import ModelStore
from flexinfer.core.phases import READY
from flexinfer.runtime.background import Background

log = logging.getLogger(__name__)

FIELD = "inFlightAt"
REFRESH_INTERVAL = 10.0
"""Re-stamp period: well inside the manager's 30 s staleness limit."""


def proxy_identity(pod_name: str, fallback: str) -> str:
    """A valid label-value-like name (≤ 63 chars of ``[A-Za-z0-9._-]``) for this proxy replica."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", pod_name.strip() or fallback)[:63].strip("-._")
    return cleaned or "flexinfer-proxy"


@dataclass
class _Report:
    """Our report for one model."""

    namespace: str
    name: str
    stamped: float
    """Monotonic time of its last stamp."""
    confirmed: bool = False
    """A read after it landed showed the model served, or the watch delivered a version written after such a read:
    requests may be forwarded under it."""
    read_version: str | None = None
    """The ``resourceVersion`` the read after an early report returned (the model not served yet)."""
    delivered_in: int | None = None
    """The watch's list epoch in which it delivered ``read_version``; every later delivery is a newer version."""


class InflightReporter:
    """Keeps this proxy's in-flight report on the Models it is serving (see the module docstring)."""

    def __init__(self, report: DemandReport, api: ModelApi, store: ModelStore, *,
                 now: Callable[[], datetime] = utc_now, clock: Callable[[], float] = time.monotonic,
                 refresh: float = REFRESH_INTERVAL) -> None:
        self._report, self._api, self._store = report, api, store
        self._now, self._clock, self._refresh = now, clock, refresh
        self._written: dict[str, _Report] = {}
        """key → every report we left set."""
        self._background = Background()
        self._restamping: set[str] = set()
        self._first: dict[str, asyncio.Future[bool]] = {}
        self._early: dict[str, asyncio.Task[None]] = {}
        self.writes = 0
        self.refusals = 0
        store.subscribe(self._delivered)

    def waiting(self, model: Model) -> None:
        """A request waits for ``model`` to be activated: write the report now and read the Model once it landed
        (see the module docstring); nothing when a report of ours is set or being written, or while the model is
        Preempted (the report would hold the drain of a replica nothing is forwarded to)."""
        key = model.key
        if preempted(model) or key in self._written or key in self._early or key in self._first:
            return
        self._early[key] = self._spawn(self._early_report(model), f"inflight-early-{key}",
                                       lambda: self._early.pop(key, None))

    async def busy(self, model: Model) -> bool:
        """Make sure a confirmed report exists before a request is forwarded to ``model``; ``False`` when the
        model is no longer served in the API server once the report landed (do not forward)."""
        key = model.key
        early = self._early.get(key)
        if early is not None:  # its write and read may make ours unnecessary
            await asyncio.wait([early])
        written = self._written.get(key)
        if written is not None and (written.confirmed or self._ordered(key, written)):
            written.confirmed = True
            if self._clock() - written.stamped >= self._refresh and key not in self._restamping:
                self._restamping.add(key)
                self._spawn(self._stamp(model.namespace, model.name), f"inflight-stamp-{key}",
                            lambda: self._restamping.discard(key))
            return True
        pending = self._first.get(key)  # requests arriving together share one first report (one write, one read)
        if pending is None:
            pending = self._first[key] = asyncio.ensure_future(self._first_report(model))
            pending.add_done_callback(lambda _: self._first.pop(key, None))
        return await asyncio.shield(pending)

    async def _early_report(self, model: Model) -> None:
        if not await self._patch(model.namespace, model.name, rfc3339(self._now())):
            return
        written = self._written.setdefault(model.key, _Report(model.namespace, model.name, self._clock()))
        cached = self._store.get(model.key)
        if cached is None or preempted(cached):  # it turned Preempted while the write was on its way
            await self._clear(model.key)
            return
        if written.confirmed:
            return
        read = await self._read(model)
        if read is None or self._written.get(model.key) is not written:
            return
        if _served(read):
            written.confirmed = True
            return
        written.read_version = str((read.get("metadata") or {}).get("resourceVersion") or "") or None
        self._delivered(None, self._store.get(model.key))  # the watch may have delivered it already

    def _delivered(self, old: Model | None, new: Model | None) -> None:
        """The watch delivered ``new``: if it is the version an early report's read returned, note it."""
        written = self._written.get(new.key) if new is not None else None
        if (written is not None and new is not None and written.read_version is not None
                and written.delivered_in is None and new.metadata.resource_version == written.read_version):
            written.delivered_in = self._store.epoch

    def _ordered(self, key: str, written: _Report) -> bool:
        """The watch cache's version of the model was delivered after the one the early report's read returned
        (same list epoch, another version): it was written after our report landed."""
        if written.delivered_in is None or written.delivered_in != self._store.epoch:
            return False
        cached = self._store.get(key)
        return cached is not None and cached.metadata.resource_version != written.read_version

    async def _first_report(self, model: Model) -> bool:
        written = self._written.get(model.key)
        if written is None:
            if not await self._patch(model.namespace, model.name, rfc3339(self._now())):
                return True
            written = self._written[model.key] = _Report(model.namespace, model.name, self._clock())
        read = await self._read(model)
        if read is None:  # forwarded, as when the report write fails
            written.confirmed = True
            return True
        phase = ((read.get("status") or {}).get("phase"))
        if _served(read) and self._written.get(model.key) is written:
            written.confirmed = True
            return True
        self.refusals += 1
        log.info("model %s is no longer Ready in the API server (phase %s); not forwarding", model.key, phase)
        await self._clear(model.key)
        return False

    async def _read(self, model: Model) -> dict[str, Any] | None:
        """The Model read afresh (``{}`` when deleted); ``None`` when the read failed (logged)."""
        try:
            return await self._api.get_model(model.namespace, model.name) or {}
        except KubeApiError as exc:
            log.warning("cannot read model %s afresh to confirm its in-flight report (%s)", model.key, exc)
            return None

    def idle(self, key: str, ready: bool) -> None:
        """The last request for the model ``key`` ended, or it was preempted with nothing in flight; clear now
        unless the cluster still has it Ready (then lazily, by the next ``refresh``)."""
        if not ready and key in self._written:
            self._spawn(self._clear(key), f"inflight-clear-{key}")

    def _spawn(self, write: Coroutine[Any, Any, None], name: str,
               done: Callable[[], object] | None = None) -> asyncio.Task[None]:
        """Run ``write`` in the background (awaited by ``aclose``); ``done`` after it ends."""
        task = self._background.spawn(write, name=name)
        if done is not None:
            task.add_done_callback(lambda _: done())
        return task

    async def refresh(self, busy: Collection[str]) -> None:
        """Re-stamp the reports of busy models (requests in flight or waiting) that are due; clear the others."""
        for key, written in list(self._written.items()):
            if key not in busy:
                await self._clear(key)
            elif self._clock() - written.stamped >= self._refresh * 0.9:
                await self._stamp(written.namespace, written.name)

    async def clear_all(self) -> None:
        """Forget every report (shutdown: ``DemandReport.delete_all`` then deletes the reports)."""
        self._written.clear()

    async def _stamp(self, namespace: str, name: str) -> None:
        key = f"{namespace}/{name}"
        if await self._patch(namespace, name, rfc3339(self._now())) and (written := self._written.get(key)):
            written.stamped = self._clock()

    async def _clear(self, key: str) -> None:
        written = self._written.pop(key, None)
        if written is not None:
            await self._patch(written.namespace, written.name, None)

    async def _patch(self, namespace: str, name: str, value: str | None) -> bool:
        try:
            await self._report.write(namespace, name, {FIELD: value})
        except KubeApiError as exc:
            log.warning("in-flight report for model %s/%s failed: %s", namespace, name, exc)
            return False
        self.writes += 1
        return True

    async def aclose(self) -> None:
        await self._background.close()


def _served(stored: Mapping[str, Any]) -> bool:
    """The Model as read is served: Ready, or a group pod's member forwarded to its running pod."""
    return ((stored.get("status") or {}).get("phase")) == READY or _forwarded(stored)


def _forwarded(stored: Mapping[str, Any] | None) -> bool:
    """A group pod's member the API server has forwarded to its running pod (any phase but Failed)."""
    try:
        model = Model.model_validate(stored or {})
    except ValueError:
        return False
    return forwarding_endpoint(model, override_enabled=False) is not None
