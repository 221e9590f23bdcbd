"""The reconcile queue: coalescing, one worker per unit at a time, retries, earliest timer wins."""

from __future__ import annotations

import asyncio

from flexinfer.manager.queue import ReconcileQueue
from support.polling import eventually


async def test_requests_coalesce_and_a_running_unit_runs_again_once() -> None:
    seen: list[str] = []
    gate = asyncio.Event()

    async def handler(unit: str) -> None:
        seen.append(unit)
        if len(seen) == 1:
            await gate.wait()

    queue: ReconcileQueue[str] = ReconcileQueue(handler, workers=2)
    queue.start()
    queue.add("a")
    await eventually(lambda: seen == ["a"], 2)
    for _ in range(5):
        queue.add("a")  # while running: one more run afterwards
    gate.set()
    await asyncio.wait_for(queue.idle(), 2)
    assert seen == ["a", "a"]
    await queue.stop()


async def test_a_pass_that_wrote_runs_once_more_and_one_that_did_not_only_when_asked() -> None:
    """A handler reporting writes gets a follow-up pass without any request (the watch's echo of its writes asks
    for none); one that wrote nothing runs again only when asked meanwhile."""
    writes = [3, 0, 0]
    runs: list[int] = []

    async def handler(unit: str) -> bool:
        runs.append(writes[len(runs)] if len(runs) < len(writes) else 0)
        return runs[-1] > 0

    queue: ReconcileQueue[str] = ReconcileQueue(handler, workers=2)
    queue.start()
    queue.add("a")
    await asyncio.wait_for(queue.idle(), 2)
    assert runs == [3, 0], "the pass that wrote, then one follow-up that wrote nothing"
    queue.add("a")
    await asyncio.wait_for(queue.idle(), 2)
    assert runs == [3, 0, 0]
    await queue.stop()


async def test_one_unit_is_never_run_by_two_workers_at_once() -> None:
    running: set[str] = set()
    overlaps = 0

    async def handler(unit: str) -> None:
        nonlocal overlaps
        overlaps += unit in running
        running.add(unit)
        await asyncio.sleep(0)  # a yield inside the handler: the interleaving under test, not a wait
        running.discard(unit)

    queue: ReconcileQueue[str] = ReconcileQueue(handler, workers=4)
    queue.start()
    for i in range(50):
        queue.add(f"u{i % 3}")
        await asyncio.sleep(0)  # adds interleaved with running handlers: the behaviour under test
    await asyncio.wait_for(queue.idle(), 2)
    assert overlaps == 0
    await queue.stop()


async def test_a_failure_is_retried_later() -> None:
    calls: list[float] = []

    async def handler(unit: str) -> None:
        calls.append(asyncio.get_running_loop().time())
        if len(calls) == 1:
            raise RuntimeError("api down")

    queue: ReconcileQueue[str] = ReconcileQueue(handler)
    queue.start()
    queue.add("a")
    await eventually(lambda: len(calls) == 2)
    assert calls[1] - calls[0] >= 0.9
    await queue.stop()


async def test_only_the_earliest_timer_is_kept() -> None:
    async def handler(unit: str) -> None:
        return None

    queue: ReconcileQueue[str] = ReconcileQueue(handler)
    now = asyncio.get_running_loop().time()
    queue.wake_at("a", now + 100)
    queue.wake_at("a", now + 50)
    queue.wake_at("a", now + 70)
    assert queue.pending_timers() == {"a": now + 50}
    await queue.stop()
    assert queue.pending_timers() == {}
