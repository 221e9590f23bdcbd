"""The in-cluster proxy's wait marker: its half of the starvation-bound contract with the manager.

While requests for a model wait for it (the dispatcher called ``on_wait``: the model is being activated),
this proxy replica keeps ``waitingSince`` for the model in its ``ModelDemand`` report
(``flexinfer.cluster_proxy.demand_report``) at the RFC 3339 start of its oldest request still waiting; the
manager takes the oldest value of the live replicas (plus a ``flexinfer.ai/waiting-since`` annotation a
pre-ModelDemand proxy left on the Model) into the election's starvation bound (``ElectionPolicy.max_wait``),
oldest first with the holder included, as the local arbiter's tickets. Each replica writes only its own
report, so replicas never race; one task per model sends the writes, each the value wanted when it is sent,
so a burst of waits or of forwards costs one write, and a clear never overtakes the write before it:

- write when the oldest waiting request changes (the first one of a waiting period; the oldest one left
  after the one before it was forwarded, timed out or was cancelled), unless the marker lags it by less than
  ``RESOLUTION``;
- clear (``null``) when this replica has no waiting request left, or the Model is deleted.

A model that turns Ready keeps its marker until its requests are on their way: a request's wait ends only
after its in-flight report was written (``DemandActivator``), so the manager sees the new holder as waiting or
as busy, never as neither. (Clearing the marker at Ready let the election hand the GPU to another starving
member in the tens of milliseconds before the in-flight report landed, and two starving models then took the
GPU from each other at every turn, neither serving a request.) Failures are logged and never fail a request.
Built by ``flexinfer.assembly.cluster_proxy`` (``DemandActivator`` opens a ``WaitTicket`` per request).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from flexinfer.api.model import Model
from flexinfer.cluster_proxy.demand import rfc3339, utc_now
from flexinfer.cluster_proxy.demand_report import DemandReport
from flexinfer.cluster_proxy.model_api import KubeApiError
from flexinfer.cluster_proxy.model_watch import ModelStore

log = logging.getLogger(__name__)

FIELD = "waitingSince"
RESOLUTION = timedelta(seconds=1)
"""A marker that lags the oldest waiting request by less than this is left as it is: while a backlog is forwarded
the oldest wait moves on with every request, and a write per request would load the API server (5,000 queued
requests drained in seconds); a marker up to a second older than the truth changes no decision of consequence
(the starvation bound is tens of seconds)."""
Step = tuple[str, str, datetime | None]
"""One write to send: the Model's namespace and name and the marker's instant (``None`` = clear)."""


class WaitMarker:
    """See the module docstring. ``begin``/``end`` bracket one waiting request."""

    def __init__(self, report: DemandReport, store: ModelStore, *,
                 now: Callable[[], datetime] = utc_now) -> None:
        self._report, self._store, self._now = report, store, now
        self._waits: dict[str, dict[int, datetime]] = {}
        """key → this replica's waiting requests (token → when the wait began), oldest first."""
        self._written: dict[str, datetime] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._tokens = itertools.count()
        self.patches: list[tuple[str, str | None]] = []
        """Every marker write sent, as (model key, value) (for tests and logs)."""
        store.subscribe(self._changed)

    def begin(self, key: str) -> int:
        token = next(self._tokens)
        moment = self._now()
        self._waits.setdefault(key, {})[token] = moment
        self._kick(key)
        return token

    def end(self, key: str, token: int) -> None:
        waits = self._waits.get(key, {})
        waits.pop(token, None)
        if not waits:
            self._waits.pop(key, None)
        self._kick(key)

    def waiting(self, key: str) -> int:
        """Requests of this replica waiting for the model."""
        return len(self._waits.get(key, {}))

    def _changed(self, old: Model | None, new: Model | None) -> None:
        current = new if new is not None else old
        if current is not None and (current.key in self._waits or current.key in self._written):
            self._kick(current.key)

    def _kick(self, key: str) -> None:
        if key not in self._workers:
            self._workers[key] = asyncio.get_running_loop().create_task(self._run(key), name=f"wait-marker-{key}")

    async def _run(self, key: str) -> None:
        try:
            await self._send(key)
        finally:  # not a done callback: a change arriving before it ran would find no worker and be lost
            if self._workers.get(key) is asyncio.current_task():
                del self._workers[key]

    async def _send(self, key: str) -> None:
        while (step := self._next(key)) is not None:
            namespace, name, moment = step
            value = None if moment is None else rfc3339(moment)
            try:
                await self._report.write(namespace, name, {FIELD: value})
            except KubeApiError as exc:
                log.warning("cannot %s the wait marker of model %s: %s", "clear" if value is None else "write",
                            key, exc)
                return
            self.patches.append((key, value))
            if moment is None:
                self._written.pop(key, None)
            else:
                self._written[key] = moment

    def _next(self, key: str) -> Step | None:
        """The write this replica's report needs now, if any (see the module docstring)."""
        waits = self._waits.get(key)
        oldest = next(iter(waits.values()), None) if waits else None
        wanted = None if oldest is None or self._store.get(key) is None else oldest
        written = self._written.get(key)
        if wanted == written or (wanted is not None and written is not None
                                 and timedelta(0) <= wanted - written < RESOLUTION):
            return None
        namespace, _, name = key.partition("/")
        return namespace, name, wanted

    async def aclose(self) -> None:
        """Cancel writes still to be sent (the report is deleted at shutdown)."""
        tasks = list(self._workers.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class WaitTicket:
    """One request's wait: ``begin`` (the ``on_wait`` callback; idempotent) and ``end`` (always call it)."""

    def __init__(self, marker: WaitMarker | None, resolve: Callable[[], Model | None]) -> None:
        self._marker, self._resolve = marker, resolve
        self._held: tuple[str, int] | None = None

    def begin(self, _reason: str = "") -> None:
        if self._marker is None or self._held is not None:
            return
        model = self._resolve()
        if model is not None:
            self._held = (model.key, self._marker.begin(model.key))

    def end(self) -> None:
        if self._marker is not None and self._held is not None:
            self._marker.end(*self._held)
            self._held = None
