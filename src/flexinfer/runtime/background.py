"""Work run in the background: writes and reloads a caller does not wait for, kept until they end.

``Background.spawn`` starts a coroutine as a task and holds it until it ends (the event loop keeps only weak
references to tasks, so an unreferenced one may vanish mid-run); ``len`` is how many still run. ``cancel`` cancels
them all without waiting; ``close(wait)`` ends them: each awaited (``wait=None``), or awaited at most ``wait``
seconds and the rest cancelled (``wait=0``: every one cancelled at once), and returns once each has ended. Used by
the manager's events (``flexinfer.manager.client``), the in-cluster proxy's reports (``flexinfer.cluster_proxy``)
and the local engine's manifest reloads (``flexinfer.assembly.local``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class Background:
    """See the module docstring."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, work: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task[Any]:
        """Run ``work`` in the background; the task (done callbacks may be added)."""
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def cancel(self) -> None:
        """Cancel every task still running, without waiting for them to end."""
        for task in list(self._tasks):
            task.cancel()

    async def close(self, wait: float | None = None) -> None:
        """End every task: awaited, at most ``wait`` seconds when given, then cancelled (see the module docstring)."""
        tasks = set(self._tasks)
        if not tasks:
            return
        if wait is None:
            await asyncio.gather(*tasks, return_exceptions=True)
            return
        late = (await asyncio.wait(tasks, timeout=wait))[1] if wait > 0 else tasks
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
