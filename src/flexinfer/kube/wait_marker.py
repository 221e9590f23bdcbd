"""The in-cluster proxy's wait marker: its half of the starvation-bound contract with the manager.

While requests for a model wait for it (the dispatcher called ``on_wait``: the model is being activated),
this proxy keeps the Model annotation ``flexinfer.ai/waiting-since``
(``flexinfer.core.election.WAITING_SINCE_ANNOTATION``) at the RFC 3339 start of the oldest wait of the
current waiting period; the manager reads it into the election's starvation bound
(``ElectionPolicy.max_wait``). Writes are merge patches of the main resource, one per change, never one
per request:

- write when a waiting period starts (first waiting request) and the cached Model carries no marker, or a
  newer one than ours. Several proxy replicas therefore converge on the oldest start. It is read-then-write
  on the watch cache: two replicas starting together may both write and the newer value may land last;
  the replica holding the older start sees that value arrive and writes its own again;
- clear (merge ``null``) when the cached Model is Ready (any replica that sees a Ready model with a marker
  clears it, so a marker left behind by a crashed replica costs at most one extra swap), or when this
  replica has no waiting request left and the marker is the value it wrote. A replica still waiting whose
  marker another replica cleared writes its own again.

The period keeps its start while any request waits, even after the oldest one has timed out or been
cancelled. After each write nothing more is written for that model until the watch shows the written
value (at most ``PENDING_TIMEOUT``); one task per model sends the patches, so a clear never overtakes the
write before it. Failures are logged and never fail a request. Built by ``flexinfer.kube.proxy_side``
(``DemandActivator`` opens a ``WaitTicket`` per request).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from datetime import datetime

from flexinfer.api.model import Model
from flexinfer.core.election import WAITING_SINCE_ANNOTATION, waiting_since_of
from flexinfer.kube.demand import rfc3339, utc_now
from flexinfer.kube.model_api import KubeApiError, ModelApi
from flexinfer.kube.model_watch import ModelStore

log = logging.getLogger(__name__)

PENDING_TIMEOUT = 30.0
"""How long a written value may stay invisible in the watch cache before the marker is decided again."""

Step = tuple[Model, str | None]
"""One patch to send: the Model and the marker value (``None`` = clear)."""


class WaitMarker:
    """See the module docstring. ``begin``/``end`` bracket one waiting request."""

    def __init__(self, api: ModelApi, store: ModelStore, *, now: Callable[[], datetime] = utc_now,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._api, self._store, self._now, self._clock = api, store, now, clock
        self._waits: dict[str, dict[int, datetime]] = {}
        self._written: dict[str, str] = {}
        self._pending: dict[str, tuple[str | None, float]] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._tokens = itertools.count()
        self.patches: list[tuple[str, str | None]] = []
        """Every marker patch sent, as (model key, value) (for tests and logs)."""
        store.subscribe(self._changed)

    def begin(self, key: str) -> int:
        token = next(self._tokens)
        self._waits.setdefault(key, {})[token] = self._now()
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
        if new is None:
            key = old.key if old is not None else ""
            self._written.pop(key, None)
            self._pending.pop(key, None)
            return
        if new.key in self._waits or new.key in self._pending or WAITING_SINCE_ANNOTATION in new.metadata.annotations:
            self._kick(new.key)

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
            model, value = step
            self._pending[key] = (value, self._clock())
            try:
                await self._api.patch_model(model.namespace, model.name,
                                            {"metadata": {"annotations": {WAITING_SINCE_ANNOTATION: value}}})
            except KubeApiError as exc:
                self._pending.pop(key, None)
                log.warning("cannot %s the wait marker of model %s: %s", "clear" if value is None else "write",
                            key, exc)
                return
            self.patches.append((key, value))
            if value is None:
                self._written.pop(key, None)
            else:
                self._written[key] = value

    def _next(self, key: str) -> Step | None:
        """The patch the cached Model needs now, if any (see the module docstring)."""
        model = self._store.get(key)
        if model is None:
            return None
        raw = model.metadata.annotations.get(WAITING_SINCE_ANNOTATION)
        pending = self._pending.get(key)
        if pending is not None:
            if pending[0] != raw and self._clock() - pending[1] < PENDING_TIMEOUT:
                return None
            del self._pending[key]
        waits, ready = self._waits.get(key), model.status.phase == "Ready"
        if ready or not waits:
            return (model, None) if raw is not None and (ready or self._written.get(key) == raw) else None
        oldest = min(waits.values())
        cached = waiting_since_of(model)
        return None if cached is not None and cached <= oldest else (model, rfc3339(oldest))

    async def aclose(self) -> None:
        """Cancel patches still to be sent (a marker left behind is cleared when the model is next Ready)."""
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
