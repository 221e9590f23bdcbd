"""``Admission``: a grant that arrives in the same loop iteration as the request is abandoned is released
(a request whose client is gone never stays in flight)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from flexinfer.proxy.admission import Admission
from flexinfer.proxy.hooks import NullMetrics, NullTracer
from flexinfer.runtime.ports import Endpoint, Grant
from support.polling import eventually
from support.recording_engine import key


class GatedActivator:
    """Grants once ``gate`` is set; counts releases."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()
        self.released = 0

    async def acquire(self, model: str, timeout: float | None = None,
                      on_wait: Callable[[str], None] | None = None) -> Grant:
        self.entered.set()
        await self.gate.wait()
        return Grant(model, Endpoint("http://127.0.0.1:1"), self._release)

    def _release(self) -> None:
        self.released += 1


async def test_streaming_grant_racing_with_abandonment_is_released() -> None:
    """A streaming request acquires in a child task; the grant it returns after the request was abandoned
    (cancelled in the same iteration) must be released, not leaked in flight."""
    activator = GatedActivator()
    admission = Admission(activator, NullMetrics(), timeout=10, interval=1)
    reply: Any = object()  # never used: the request does not wait for an activation
    trace = NullTracer().start_request("POST", "/v1/chat/completions", {})

    async def forward() -> None:
        async with admission.admit(key("m"), trace, reply):
            raise AssertionError("the abandoned request must not be forwarded")

    request = asyncio.create_task(forward())
    await activator.entered.wait()
    activator.gate.set()  # the grant completes in the next iteration ...
    request.cancel()  # ... which is also when the abandoned request learns it was cancelled
    with pytest.raises(asyncio.CancelledError):
        await request
    await eventually(lambda: activator.released == 1, 2)
