"""The in-cluster proxy's in-flight reports: how the manager knows not to cut a swap's outgoing model off.

While this proxy forwards requests to a model it keeps ``inFlightAt`` for the model in its ``ModelDemand``
report (``flexinfer.cluster_proxy.demand_report``) at the RFC 3339 time of its last refresh (the manager's drain
gate, ``flexinfer.core.model_status.plan``: a preempted model keeps its replica while a report younger
than 30 s exists, bounded by the swap drain timeout). Writes:

- ``busy(model)`` before a request is forwarded. With no report of ours for the model (the first request after an
  idle period; requests arriving meanwhile wait for the same report instead of each writing one — 64 at once took
  1.3 s against a busy API server) it writes the report, then reads the Model afresh from the API server: if it is
  no longer Ready there (nor forwarded to its group pod), the report is withdrawn and ``busy`` returns ``False``
  (the caller must not forward the request; it re-activates). The manager, for its part, marks a model Preempted
  first and then reads the reports afresh, so either the manager sees our report (and drains) or we see the model no
  longer Ready (and do not forward): a request is never forwarded to a replica the manager is scaling down without a
  report. With a report of ours already set, a due re-stamp (older than ``refresh``, 10 s) is a plain write in the
  background, one per model at a time: that report already holds the drain, so no request waits for the write (at
  c=64, every request in the window used to write and wait, a p99 of half a second);
- ``refresh(busy_keys)`` from the heartbeat: re-stamps busy models every ``refresh``, removes the report
  of models with nothing in flight;
- ``idle(model, ready)`` when the last request ends: removed at once if the model is no longer Ready in
  the cluster (a swap is waiting for it), else lazily by the next ``refresh`` (no write per request).
Other failures (403, 404, transport errors) are logged and never fail a request. Built by
``flexinfer.assembly.cluster_proxy``; used by ``DemandActivator`` (``flexinfer.cluster_proxy.demand_activator``).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Collection, Coroutine, Mapping
from datetime import datetime
from typing import Any

from flexinfer.api.model import Model
from flexinfer.cluster_proxy.demand import forwarding_endpoint, rfc3339, utc_now
from flexinfer.cluster_proxy.demand_report import DemandReport
from flexinfer.cluster_proxy.model_api import KubeApiError, ModelApi
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


class InflightReporter:
    """Keeps this proxy's in-flight report on the Models it is serving (see the module docstring)."""

    def __init__(self, report: DemandReport, api: ModelApi, *, now: Callable[[], datetime] = utc_now,
                 clock: Callable[[], float] = time.monotonic, refresh: float = REFRESH_INTERVAL) -> None:
        self._report, self._api, self._now, self._clock, self._refresh = report, api, now, clock, refresh
        self._written: dict[str, tuple[str, str, float]] = {}
        """key → (namespace, name, monotonic time of our last stamp) for every report we left set."""
        self._background = Background()
        self._restamping: set[str] = set()
        self._first: dict[str, asyncio.Future[bool]] = {}
        self.writes = 0
        self.refusals = 0

    async def busy(self, model: Model) -> bool:
        """Make sure a fresh report exists before a request is forwarded to ``model``; ``False`` when the
        model is no longer Ready in the API server once the first report landed (do not forward)."""
        written = self._written.get(model.key)
        if written is None:  # requests arriving together share one first report (one write, one read)
            pending = self._first.get(model.key)
            if pending is None:
                pending = self._first[model.key] = asyncio.ensure_future(self._first_report(model))
                pending.add_done_callback(lambda _: self._first.pop(model.key, None))
            return await asyncio.shield(pending)
        if self._clock() - written[2] >= self._refresh and model.key not in self._restamping:
            self._restamping.add(model.key)
            self._spawn(self._stamp(model.namespace, model.name), f"inflight-stamp-{model.key}",
                        lambda: self._restamping.discard(model.key))
        return True

    async def _first_report(self, model: Model) -> bool:
        if not await self._patch(model.namespace, model.name, rfc3339(self._now())):
            return True
        self._written[model.key] = (model.namespace, model.name, self._clock())
        try:
            stored = await self._api.get_model(model.namespace, model.name)
        except KubeApiError as exc:
            log.warning("cannot confirm model %s is Ready (%s); forwarding", model.key, exc)
            return True
        phase = ((stored or {}).get("status") or {}).get("phase")
        if phase == READY or _forwarded(stored):
            return True
        self.refusals += 1
        log.info("model %s is no longer Ready in the API server (phase %s); not forwarding", model.key, phase)
        await self._clear(model.key)
        return False

    def idle(self, model: Model, ready: bool) -> None:
        """The last request for ``model`` ended; clear now if the cluster no longer has it Ready."""
        if not ready and model.key in self._written:
            self._spawn(self._clear(model.key), f"inflight-clear-{model.key}")

    def _spawn(self, write: Coroutine[Any, Any, None], name: str, done: Callable[[], None] | None = None) -> None:
        """Run ``write`` in the background (awaited by ``aclose``); ``done`` after it ends."""
        task = self._background.spawn(write, name=name)
        if done is not None:
            task.add_done_callback(lambda _: done())

    async def refresh(self, busy: Collection[str]) -> None:
        """Re-stamp busy models whose report is due; clear the reports of models that are idle now."""
        for key, (namespace, name, stamped) in list(self._written.items()):
            if key not in busy:
                await self._clear(key)
            elif self._clock() - stamped >= self._refresh * 0.9:
                await self._stamp(namespace, name)

    async def clear_all(self) -> None:
        """Forget every report (shutdown: ``DemandReport.delete_all`` then deletes the reports)."""
        self._written.clear()

    async def _stamp(self, namespace: str, name: str) -> None:
        key = f"{namespace}/{name}"
        if await self._patch(namespace, name, rfc3339(self._now())):
            self._written[key] = (namespace, name, self._clock())

    async def _clear(self, key: str) -> None:
        entry = self._written.pop(key, None)
        if entry is not None:
            await self._patch(entry[0], entry[1], None)

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


def _forwarded(stored: Mapping[str, Any] | None) -> bool:
    """A group pod's member the API server has forwarded to its running pod (any phase but Failed)."""
    try:
        model = Model.model_validate(stored or {})
    except ValueError:
        return False
    return forwarding_endpoint(model, override_enabled=False) is not None
