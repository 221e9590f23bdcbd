"""The copy rate cap (``FLASH_MAX_RATE``): the pacer's arithmetic, and a real staging run kept to the rate."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest

from flexinfer.flashloader.config import StageSettings
from flexinfer.flashloader.pacing import Pace, chunk_bytes
from flexinfer.flashloader.progress import NullProgress
from flexinfer.flashloader.staging import stage, stage_blocking
from support.file_trees import read_tree, write_tree


class RecordedWaits(threading.Event):
    """A cancel event that records how long the pacer asked to sleep (and never sleeps)."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.waits.append(timeout)
        return False


def test_the_pacer_sleeps_until_the_total_is_within_the_rate() -> None:
    now = [10.0]
    waits = RecordedWaits()
    pace = Pace(100, waits, clock=lambda: now[0])
    pace.after(50)  # 50 bytes at 100 B/s are due 0.5 s after the start
    now[0] = 10.2
    pace.after(50)  # 100 bytes are due at 1.0 s; 0.2 s have passed
    now[0] = 12.0
    pace.after(10)  # behind the rate: no sleep
    assert waits.waits == pytest.approx([0.5, 0.8])


def test_chunks_are_an_eighth_of_a_second_under_a_cap() -> None:
    assert chunk_bytes(4 << 20, 0) == 4 << 20
    assert chunk_bytes(4 << 20, 8 << 20) == 1 << 20
    assert chunk_bytes(4 << 20, 1024) == 64 * 1024


def test_a_capped_run_takes_as_long_as_its_rate_says(src: Path, dst: Path) -> None:
    tree = {"a.bin": os.urandom(384 * 1024), "b.bin": os.urandom(128 * 1024)}
    write_tree(src, tree)
    began = time.monotonic()
    report = stage_blocking(src, dst, StageSettings(concurrency=2, max_rate=1024 * 1024))
    assert time.monotonic() - began >= 0.45  # 512 KiB at 1 MiB/s
    assert report.ok and read_tree(dst) == tree


class FirstBytes(NullProgress):
    """Sets ``moved`` once the first chunk is copied."""

    def __init__(self) -> None:
        self.moved = threading.Event()

    def advance(self, nbytes: int) -> None:
        self.moved.set()


async def test_cancelling_a_paced_run_does_not_wait_for_the_pacer(src: Path, dst: Path) -> None:
    write_tree(src, {"big.bin": os.urandom(1024 * 1024)})
    sink = FirstBytes()
    task = asyncio.create_task(stage(src, dst, StageSettings(concurrency=1, max_rate=64 * 1024), sink))  # 16 s
    assert await asyncio.to_thread(sink.moved.wait, 5)
    began = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - began < 2
    assert os.listdir(dst) == []
