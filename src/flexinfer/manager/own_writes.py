"""How many writes a reconcile pass made itself.

A pass that wrote is followed by one more pass (``flexinfer.manager.queue``): its writes are facts the next
step may wait for. The store keeps each write's answer and ignores the watch event of that same version, so the
follow-up comes from here, not from the echo (whose timing against the answer varies). ``KubeApi`` counts each
write it sends for the pass running in the current task (``count_write``; ``counting`` sets the counter in a
``ContextVar``: the queue's workers run different units' passes at once, each in its own task). Used by
``flexinfer.manager.client`` and ``flexinfer.manager.program``.
"""

from __future__ import annotations

from collections.abc import Awaitable
from contextvars import ContextVar

_writes: ContextVar[list[int] | None] = ContextVar("flexinfer_pass_writes", default=None)


def count_write() -> None:
    """One write made by the pass running in this task (if any)."""
    counter = _writes.get()
    if counter is not None:
        counter[0] += 1


async def counting(work: Awaitable[None]) -> int:
    """Run ``work`` (a pass); the writes it made."""
    counter = [0]
    token = _writes.set(counter)
    try:
        await work
    finally:
        _writes.reset(token)
    return counter[0]
