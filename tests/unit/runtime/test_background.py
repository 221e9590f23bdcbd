"""``Background``: tasks kept until they end; ``close`` awaits them, within a bound, and cancels the rest."""

from __future__ import annotations

import asyncio

from flexinfer.runtime.background import Background


async def finish(gate: asyncio.Event, done: list[str], name: str) -> None:
    await gate.wait()
    done.append(name)


async def test_a_task_is_kept_while_it_runs_and_close_without_a_bound_awaits_it() -> None:
    gate, work = asyncio.Event(), Background()
    done: list[str] = []
    work.spawn(finish(gate, done, "a"), name="a")
    await asyncio.sleep(0)
    assert len(work) == 1
    closing = asyncio.create_task(work.close())
    await asyncio.sleep(0)
    assert not closing.done()
    gate.set()
    await closing
    assert done == ["a"] and len(work) == 0


async def test_close_with_a_bound_keeps_what_ended_in_time_and_cancels_the_rest() -> None:
    quick, never, work = asyncio.Event(), asyncio.Event(), Background()
    done: list[str] = []
    quick.set()
    late = work.spawn(finish(never, done, "late"))
    work.spawn(finish(quick, done, "quick"))
    await work.close(wait=0.05)
    assert done == ["quick"] and late.cancelled() and len(work) == 0


async def test_close_at_once_and_cancel_end_every_task_unfinished() -> None:
    never = asyncio.Event()
    done: list[str] = []
    work = Background()
    first = work.spawn(finish(never, done, "x"))
    await work.close(wait=0)
    assert first.cancelled()
    second = work.spawn(finish(never, done, "y"))
    work.cancel()  # does not wait
    assert not second.done()
    await asyncio.gather(second, return_exceptions=True)
    assert second.cancelled() and done == [] and len(work) == 0
