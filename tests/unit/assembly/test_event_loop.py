"""``flexinfer.assembly.event_loop.run``: the servers' loop runs with the collector tuned for a proxy (start-up
objects frozen, young collections rare) and leaves the process's settings as it found them; on glibc, large
freed blocks stay in the process (no page faults to reuse them) unless the operator tuned the allocator."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys

import pytest

from flexinfer.assembly.event_loop import _GLIBC_DEFAULT, GC_THRESHOLDS, run, set_allocator


def test_the_collector_is_tuned_while_a_server_runs_and_restored_after() -> None:
    before = gc.get_threshold()
    survivor = [object()]  # created before the server starts: frozen, never walked by a collection again

    async def main() -> tuple[tuple[int, int, int], int]:
        await asyncio.sleep(0)
        return gc.get_threshold(), gc.get_freeze_count()

    thresholds, frozen = run(main(), {})
    assert thresholds == GC_THRESHOLDS and GC_THRESHOLDS[0] >= 10_000
    assert frozen > 0 and survivor
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


_GROWING_BODIES = """
import os, resource
from flexinfer.assembly.event_loop import run

async def main() -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for megabytes in range(1, 31):  # ever larger bodies, each freed before the next: glibc maps each afresh
        body = b"x" * (megabytes << 20)
        del body
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

print(run(main(), dict(os.environ)))
"""


def _page_faults(**env: str) -> int:
    done = subprocess.run([sys.executable, "-c", _GROWING_BODIES], env={**os.environ, **env}, check=True,
                          capture_output=True, text=True, timeout=120)
    return int(done.stdout)


@pytest.mark.skipif(not set_allocator(_GLIBC_DEFAULT, _GLIBC_DEFAULT), reason="glibc's mallopt is not available")
def test_large_freed_blocks_are_reused_instead_of_faulted_in_again() -> None:
    tuned, untouched = _page_faults(), _page_faults(GLIBC_TUNABLES="")  # an operator's tunables: left alone
    assert tuned * 4 < untouched, (tuned, untouched)
