"""The in-cluster proxy's in-flight reports: how the manager knows not to cut a swap's outgoing model off.

While this proxy forwards requests to a model it keeps the Model annotation
``inflight.flexinfer.ai/<proxy identity>`` set to the RFC 3339 time of its last refresh (the manager's drain
gate, ``flexinfer.core.model_status_plan``: a preempted model keeps its replica while a report younger than
30 s exists, bounded by the swap drain timeout). Writes (merge patches on the Model's metadata):

- ``busy(model)`` before the first request is forwarded when no report of ours was written within
  ``refresh`` (10 s); it is awaited so the report lands before the request reaches the model;
- ``refresh(busy_keys)`` from the heartbeat: re-stamps busy models every ``refresh``, removes the report
  of models with nothing in flight;
- ``idle(model, ready)`` when the last request ends: removed at once if the model is no longer Ready in
  the cluster (a swap is waiting for it), else lazily by the next ``refresh`` (no write per request).
Failures are logged and never fail a request. Used by ``flexinfer.kube.proxy_side``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Collection
from datetime import datetime

from flexinfer.api.model import Model
from flexinfer.kube.demand import rfc3339, utc_now
from flexinfer.kube.model_api import KubeApiError, ModelApi

log = logging.getLogger(__name__)

INFLIGHT_PREFIX = "inflight.flexinfer.ai/"
REFRESH_INTERVAL = 10.0
"""Re-stamp period: well inside the manager's 30 s staleness limit."""


def proxy_identity(pod_name: str, fallback: str) -> str:
    """A valid annotation-name suffix (≤ 63 chars of ``[A-Za-z0-9._-]``) for this proxy replica."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", pod_name.strip() or fallback)[:63].strip("-._")
    return cleaned or "flexinfer-proxy"


class InflightReporter:
    """Keeps this proxy's in-flight report on the Models it is serving (see the module docstring)."""

    def __init__(self, api: ModelApi, identity: str, *, now: Callable[[], datetime] = utc_now,
                 clock: Callable[[], float] = time.monotonic, refresh: float = REFRESH_INTERVAL) -> None:
        self._api, self._now, self._clock, self._refresh = api, now, clock, refresh
        self.annotation = INFLIGHT_PREFIX + identity
        self._written: dict[str, tuple[str, str, float]] = {}
        """key → (namespace, name, monotonic time of our last stamp) for every report we left set."""
        self._background: set[asyncio.Task[None]] = set()
        self.writes = 0

    async def busy(self, model: Model) -> None:
        """Make sure a fresh report exists before a request is forwarded to ``model``."""
        written = self._written.get(model.key)
        if written is None or self._clock() - written[2] >= self._refresh:
            await self._stamp(model.namespace, model.name)

    def idle(self, model: Model, ready: bool) -> None:
        """The last request for ``model`` ended; clear now if the cluster no longer has it Ready."""
        if not ready and model.key in self._written:
            task = asyncio.create_task(self._clear(model.key), name=f"inflight-clear-{model.key}")
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def refresh(self, busy: Collection[str]) -> None:
        """Re-stamp busy models whose report is due; clear the reports of models that are idle now."""
        for key, (namespace, name, stamped) in list(self._written.items()):
            if key not in busy:
                await self._clear(key)
            elif self._clock() - stamped >= self._refresh * 0.9:
                await self._stamp(namespace, name)

    async def clear_all(self) -> None:
        """Remove every report (shutdown)."""
        for key in list(self._written):
            await self._clear(key)

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
            await self._api.patch_model(namespace, name, {"metadata": {"annotations": {self.annotation: value}}})
        except KubeApiError as exc:
            log.warning("in-flight report for model %s/%s failed: %s", namespace, name, exc)
            return False
        self.writes += 1
        return True

    async def aclose(self) -> None:
        tasks = list(self._background)
        await asyncio.gather(*tasks, return_exceptions=True)
