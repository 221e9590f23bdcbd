"""The reconcile queue: coalesces requests per unit, runs each unit single-writer, wakes units on timers.

``add(unit)`` while the unit waits is a no-op; while it runs, it runs once more afterwards. So does a unit whose
handler reports that it wrote (returns True): a pass decides from what it finds and its writes are the next
pass's facts (a member scaled to zero lets the next one start), so the follow-up pass does not hang on the watch
echoing those writes, which the store ignores (the same version again). A pool of
workers serves different units concurrently (a shared group is one unit, so its decisions are never
made by two workers at once). ``wake_at(unit, when)`` keeps only the earliest timer per unit. A failing
reconcile is retried with exponential backoff (1 s doubling to 60 s); that is the only other requeue.
Used by ``flexinfer.manager.program``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

log = logging.getLogger("flexinfer.manager")
U = TypeVar("U")
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 60.0


class ReconcileQueue(Generic[U]):
    """See the module docstring. ``handler`` raising counts as a failure (logged, retried)."""

    def __init__(self, handler: Callable[[U], Awaitable[bool | None]], workers: int = 4) -> None:
        self._handler = handler
        self._workers = workers
        self._ready: deque[U] = deque()
        self._queued: set[U] = set()
        self._running: set[U] = set()
        self._dirty: set[U] = set()
        self._timers: dict[U, tuple[float, asyncio.TimerHandle]] = {}
        self._failures: dict[U, int] = {}
        self._wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._idle = asyncio.Event()
        self._idle.set()
        self.processed = 0

    def add(self, unit: U) -> None:
        """Reconcile ``unit`` soon (coalesced)."""
        if unit in self._running:
            self._dirty.add(unit)
        elif unit not in self._queued:
            self._queued.add(unit)
            self._ready.append(unit)
            self._idle.clear()
            self._wakeup.set()

    def wake_at(self, unit: U, when: float) -> None:
        """Reconcile ``unit`` at loop time ``when`` (only the earliest pending timer is kept)."""
        loop = asyncio.get_running_loop()
        current = self._timers.get(unit)
        if current is not None:
            if current[0] <= when:
                return
            current[1].cancel()
        handle = loop.call_at(when, self._fire, unit)
        self._timers[unit] = (when, handle)

    def _fire(self, unit: U) -> None:
        self._timers.pop(unit, None)
        self.add(unit)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._work(), name=f"reconcile-{i}") for i in range(self._workers)]

    async def stop(self) -> None:
        """Cancel timers and workers (a reconcile in progress is cancelled)."""
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def idle(self) -> None:
        """Wait until nothing is queued or running (timers may still be pending)."""
        await self._idle.wait()

    def pending_timers(self) -> dict[U, float]:
        return {unit: when for unit, (when, _) in self._timers.items()}

    async def _next(self) -> U:
        while not self._ready:
            self._wakeup.clear()
            await self._wakeup.wait()
        unit = self._ready.popleft()
        self._queued.discard(unit)
        return unit

    async def _work(self) -> None:
        while True:
            unit = await self._next()
            self._running.add(unit)
            wrote = False
            try:
                wrote = await self._run(unit)
            finally:
                self._running.discard(unit)
                if unit in self._dirty or wrote:
                    self._dirty.discard(unit)
                    self.add(unit)
                if not self._ready and not self._running:
                    self._idle.set()

    async def _run(self, unit: U) -> bool:
        """Run the handler; whether it wrote (False when it failed: the retry timer runs it again)."""
        try:
            wrote = await self._handler(unit)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a failed reconcile must not kill the worker
            count = self._failures.get(unit, 0) + 1
            self._failures[unit] = count
            delay = min(RETRY_FIRST_S * 2 ** (count - 1), RETRY_MAX_S)
            log.warning("reconcile %s failed (attempt %d, retry in %.0fs): %s", unit, count, delay, error)
            self.wake_at(unit, asyncio.get_running_loop().time() + delay)
            return False
        finally:
            self.processed += 1
        self._failures.pop(unit, None)
        return bool(wrote)
