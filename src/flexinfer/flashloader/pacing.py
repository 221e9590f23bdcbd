"""Pacing a staging run's copy to a byte rate (``FLASH_MAX_RATE``), across all of its worker threads.

Staging many nodes from one shared volume at once (an NFS export, a PVC on networked storage) can saturate it
for everyone else; a rate cap spreads the copy out instead. ``Pace.after`` is called by each worker after a
chunk; it sleeps until the run's total is back within ``rate`` bytes per second of the run's start, waking
early when the run is cancelled. Bursts are at most one chunk per worker (``chunk_bytes`` keeps chunks small
enough that progress still moves every few seconds). Used by ``flexinfer.flashloader.staging``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

MIN_CHUNK = 64 * 1024
CHUNKS_PER_SECOND = 8


def chunk_bytes(buffer_bytes: int, rate: int) -> int:
    """The copy call size under a cap: the buffer, but at most an eighth of a second's worth (≥ 64 KiB)."""
    return buffer_bytes if rate <= 0 else min(buffer_bytes, max(MIN_CHUNK, rate // CHUNKS_PER_SECOND))


class Pace:
    """The shared pacer of one run (thread-safe); ``rate`` in bytes per second, > 0."""

    def __init__(self, rate: int, cancel: threading.Event, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate, self._cancel, self._clock = rate, cancel, clock
        self._lock = threading.Lock()
        self._start = clock()
        self._total = 0

    def after(self, nbytes: int) -> None:
        """Count ``nbytes`` just copied; sleep until the total is within the rate (or the run is cancelled)."""
        with self._lock:
            self._total += nbytes
            due = self._start + self._total / self._rate
        delay = due - self._clock()
        if delay > 0:
            self._cancel.wait(delay)
