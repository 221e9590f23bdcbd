"""Shutdown state of one proxy: readiness, whether new requests are still accepted, and what is in flight.

``handler.py`` counts every proxied request in and out (``enter``/``leave``, from the request's own task);
``app.ProxyServer.shutdown`` flips readiness (``/readyz`` → 503 ``draining``), stops accepting, and waits
for the count to reach zero. A request leaves as soon as its handler ends, which is also when its client
disconnects (the server cancels the handler), so an abandoned request never holds the drain. ``abort``
ends every request still in flight now (a second shutdown signal): their tasks are cancelled with
``aborted`` set, and the handler answers them with a ``shutting down`` error instead of a silent cut.
"""

from __future__ import annotations

import asyncio


class DrainState:
    """Ready/draining flags plus the in-flight requests, whose count can be awaited down to zero."""

    __slots__ = ("_idle", "_tasks", "aborted", "accepting", "draining", "inflight")

    def __init__(self) -> None:
        self.draining = False
        self.accepting = True
        self.aborted = False
        self.inflight = 0
        self._tasks: set[asyncio.Task[object]] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self) -> None:
        """A request starts (call from its handler task)."""
        self.inflight += 1
        self._idle.clear()
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)

    def leave(self) -> None:
        """The request that ``enter``ed from this task is over."""
        task = asyncio.current_task()
        if task is not None:
            self._tasks.discard(task)
        self.inflight -= 1
        if self.inflight == 0:
            self._idle.set()

    def abort(self) -> int:
        """Stop accepting and cancel every request in flight (``aborted`` tells their handlers why);
        returns how many were cancelled."""
        self.accepting, self.aborted = False, True
        tasks = [task for task in self._tasks if not task.done()]
        for task in tasks:
            task.cancel()
        return len(tasks)

    async def wait_idle(self, timeout: float) -> bool:
        """True when no request is in flight within ``timeout`` seconds."""
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True
