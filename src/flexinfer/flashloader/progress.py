"""Progress displays for a staging run: a rich bar for people at a terminal, log lines for everyone else.

``flexinfer.flashloader.staging`` calls a ``ProgressSink`` from its worker threads (``advance`` after each
copied chunk, ``file_done`` after each rename), so every implementation here is thread-safe.
``make_progress(stream)`` is what ``flexinfer flash-load`` uses; the local engine passes its own sink or none.
rich is imported only when a bar is actually shown.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TextIO

BIG_FILE = 100 * 1024 * 1024
LOG_INTERVAL_S = 5.0
COPYING = "copying"
CHECKSUMMING = "checksumming"
"""The two long tasks of a run: copying files, and (``verify``) hashing source and staged copy."""


class ProgressSink(Protocol):
    """Receives staging progress. Methods may be called concurrently from worker threads.

    ``begin``/``end`` bracket one task (``COPYING`` or ``CHECKSUMMING``); ``advance`` counts bytes copied or
    hashed in it."""

    def begin(self, files: int, total_bytes: int, task: str = COPYING) -> None: ...

    def advance(self, nbytes: int) -> None: ...

    def file_done(self, rel: str, size: int) -> None: ...

    def end(self) -> None: ...


class NullProgress:
    """Discards progress (library default)."""

    def begin(self, files: int, total_bytes: int, task: str = COPYING) -> None:
        pass

    def advance(self, nbytes: int) -> None:
        pass

    def file_done(self, rel: str, size: int) -> None:
        pass

    def end(self) -> None:
        pass


class LogProgress:
    """Periodic one-line reports (at most one per ``interval`` seconds) plus a line per file > 100 MiB.

    The opening and periodic lines (``copying``; ``checksumming`` with ``verify``) are a contract: in a
    pod, the manager reads them from the init container's log (``flexinfer.core.loading_logs``) and shows
    the bytes staged in the Model's status, which keeps a long copy from counting as a stalled load. Lines
    are written only when bytes were copied or hashed."""

    def __init__(
        self, write: Callable[[str], None], interval: float = LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._write, self._interval, self._clock = write, interval, clock
        self._lock = threading.Lock()
        self._done = self._total = self._files = self._files_done = 0
        self._started = self._last = 0.0
        self._task = COPYING

    def begin(self, files: int, total_bytes: int, task: str = COPYING) -> None:
        with self._lock:
            self._files, self._total, self._task = files, total_bytes, task
            self._done = self._files_done = 0
            self._started = self._last = self._clock()
        if files:
            self._write(f"flash-load: {task} {files} files, {total_bytes / 2**20:.1f} MiB")

    def advance(self, nbytes: int) -> None:
        with self._lock:
            self._done += nbytes
            now = self._clock()
            if now - self._last < self._interval:
                return
            self._last = now
            line = self._line(now)
        self._write(line)

    def file_done(self, rel: str, size: int) -> None:
        with self._lock:
            self._files_done += 1
        if size > BIG_FILE and self._task == COPYING:
            self._write(f"flash-load: copied {rel} ({size / 2**20:.1f} MiB)")

    def end(self) -> None:
        pass

    def _line(self, now: float) -> str:
        elapsed = max(now - self._started, 1e-9)
        percent = 100.0 * self._done / self._total if self._total else 100.0
        task = "" if self._task == COPYING else "checksummed "
        return (
            f"flash-load: {task}{self._done / 2**20:.1f}/{self._total / 2**20:.1f} MiB ({percent:.0f}%), "
            f"{self._files_done}/{self._files} files, {self._done / elapsed / 1e9:.2f} GB/s"
        )


class RichProgress:
    """A rich progress bar (bytes, rate, ETA) on a terminal stream."""

    def __init__(self, stream: TextIO) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self._progress: Any = Progress(
            TextColumn("flash-load"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
            console=Console(file=stream), transient=False,
        )
        self._task: Any = None

    def begin(self, files: int, total_bytes: int, task: str = COPYING) -> None:
        if files and task == COPYING:
            self._progress.start()
            self._task = self._progress.add_task("copy", total=total_bytes)

    def advance(self, nbytes: int) -> None:
        if self._task is not None:
            self._progress.update(self._task, advance=nbytes)

    def file_done(self, rel: str, size: int) -> None:
        pass

    def end(self) -> None:
        if self._task is not None:
            self._progress.stop()
            self._task = None


def make_progress(stream: TextIO, enabled: bool = True) -> ProgressSink:
    """A bar when ``stream`` is a terminal, log lines otherwise, nothing when disabled."""
    if not enabled:
        return NullProgress()
    if stream.isatty():
        return RichProgress(stream)
    return LogProgress(lambda line: print(line, file=stream, flush=True))
