"""The cold starts and swaps of ``flexinfer serve``, kept for the admin API (``GET /admin/lifecycle?after=N``).

``LifecycleEvents`` is a ``LifecycleObserver`` (it takes only ``cold_start`` and ``swap``) that numbers every
event from 1 and keeps the last ``capacity`` (1024) in a ring; ``after(n)`` answers a poller such as the
Kubernetes manager, which replays a group pod's cold starts and swaps into its own histograms: the events
numbered above ``n``, the ``next`` to poll with, and whether some it had not seen left the ring (``lost``).
Added to the observer group by ``flexinfer.assembly.local``; read by ``flexinfer.local.admin``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from flexinfer.api.model import Model
from flexinfer.runtime.observer import NullObserver

CAPACITY = 1024
"""Events kept (the oldest leave first)."""


@dataclass(frozen=True)
class LifecycleEvent:
    """One cold start or swap as the dispatcher measured it (``at``: wall clock, seconds since the epoch)."""

    seq: int
    model: str
    kind: str
    seconds: float
    at: float

    def as_json(self) -> dict[str, object]:
        stamp = datetime.fromtimestamp(self.at, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        return {"seq": self.seq, "model": self.model, "kind": self.kind, "seconds": self.seconds, "at": stamp}


@dataclass(frozen=True)
class EventWindow:
    """The answer to one poll: the events after the poller's number, the number to poll with next, and whether
    events it had not seen are gone (left the ring, or numbers from before a restart of ``serve``)."""

    events: tuple[LifecycleEvent, ...]
    next: int
    lost: bool

    def as_json(self) -> dict[str, object]:
        return {"next": self.next, "events": [e.as_json() for e in self.events], "lost": self.lost}


class LifecycleEvents(NullObserver):
    """Records cold starts and swaps (see the module docstring); ``clock`` gives the wall-clock time of each."""

    def __init__(self, capacity: int = CAPACITY, clock: Callable[[], float] = time.time) -> None:
        self._ring: deque[LifecycleEvent] = deque(maxlen=capacity)
        self._last = 0
        self._clock = clock

    def cold_start(self, model: Model, seconds: float) -> None:
        self._record(model, "cold_start", seconds)

    def swap(self, model: Model, seconds: float) -> None:
        self._record(model, "swap", seconds)

    def _record(self, model: Model, kind: str, seconds: float) -> None:
        self._last += 1
        self._ring.append(LifecycleEvent(self._last, model.key, kind, seconds, self._clock()))

    def after(self, seq: int) -> EventWindow:
        """The events numbered above ``seq``. A ``seq`` beyond the last number given (the poller saw an earlier
        ``serve``) gets every event held, as does one older than the ring; both with ``lost``."""
        if seq > self._last:
            return EventWindow(tuple(self._ring), self._last, True)
        held = tuple(e for e in self._ring if e.seq > seq)
        first = self._ring[0].seq if self._ring else self._last + 1
        return EventWindow(held, self._last, seq < first - 1)
