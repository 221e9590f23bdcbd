"""Shutdown state of one proxy: readiness, whether new requests are still accepted, and in-flight count.

``handler.py`` counts every proxied request in and out; ``app.ProxyServer.shutdown`` flips readiness
(``/readyz`` → 503 ``draining``), stops accepting, and waits for the count to reach zero.
"""

from __future__ import annotations

import asyncio


class DrainState:
    """Ready/draining flags plus an in-flight counter that can be awaited down to zero."""

    __slots__ = ("_idle", "accepting", "draining", "inflight")

    def __init__(self) -> None:
        self.draining = False
        self.accepting = True
        self.inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self) -> None:
        self.inflight += 1
        self._idle.clear()

    def leave(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """True when no request is in flight within ``timeout`` seconds."""
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True
