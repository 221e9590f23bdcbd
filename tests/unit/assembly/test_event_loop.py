"""``flexinfer.assembly.event_loop.run``: the servers' loop runs with the collector tuned for a proxy (start-up
objects frozen, young collections rare) and leaves the process's settings as it found them."""

from __future__ import annotations

import asyncio
import gc

from flexinfer.assembly.event_loop import GC_THRESHOLDS, run


def test_the_collector_is_tuned_while_a_server_runs_and_restored_after() -> None:
    before = gc.get_threshold()
    survivor = [object()]  # created before the server starts: frozen, never walked by a collection again

    async def main() -> tuple[tuple[int, int, int], int]:
        await asyncio.sleep(0)
        return gc.get_threshold(), gc.get_freeze_count()

    thresholds, frozen = run(main())
    assert thresholds == GC_THRESHOLDS and GC_THRESHOLDS[0] >= 10_000
    assert frozen > 0 and survivor
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
