"""Captured output of model servers: a bounded ring buffer of lines per model, optionally mirrored to a file.

``LogStore`` keeps one ``ModelLog`` per model key (``namespace/name``) across restarts, so
``flexinfer logs MODEL`` shows the last lines even after a crash. ``pump`` copies a child's output pipe
into a ``ModelLog``. Used by ``flexinfer.local.process`` / ``engine`` and the admin API (via the engine).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import IO

DEFAULT_MAX_LINES = 1000
DEFAULT_MAX_FILE_BYTES = 16 * 1024 * 1024
CHUNK = 64 * 1024


class ModelLog:
    """The last ``max_lines`` lines of one model's server output (and, optionally, a log file)."""

    def __init__(self, max_lines: int = DEFAULT_MAX_LINES, file: Path | None = None,
                 max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> None:
        self._lines: deque[str] = deque(maxlen=max_lines)
        self._times: deque[float] = deque(maxlen=max_lines)
        self.written = 0
        """Lines added since creation (the sequence number of the next line)."""
        self._partial = ""
        self._path = file
        self._max_file_bytes = max_file_bytes
        self._file: IO[str] | None = None

    @property
    def path(self) -> Path | None:
        """The mirror file, if any."""
        return self._path

    def open_file(self) -> None:
        """Open the mirror file for appending (rotating it to ``.1`` when it has grown too large)."""
        if self._path is None or self._file is not None:
            return
        self._path.parent.mkdir(parents=True, exist_ok=True)
        if self._path.exists() and self._path.stat().st_size > self._max_file_bytes:
            self._path.replace(self._path.with_name(self._path.name + ".1"))
        self._file = self._path.open("a", encoding="utf-8")

    def write(self, text: str) -> None:
        """Append output text; complete lines enter the buffer, a trailing partial line waits for more."""
        data = self._partial + text
        *complete, self._partial = data.split("\n")
        for line in complete:
            self.add_line(line)

    def add_line(self, line: str) -> None:
        """Append one line (without its newline)."""
        line = line.rstrip("\r")
        self._lines.append(line)
        self._times.append(time.time())
        self.written += 1
        if self._file is not None:
            self._file.write(line + "\n")

    def flush(self) -> None:
        """Commit a trailing partial line and flush the file."""
        if self._partial:
            self.add_line(self._partial)
            self._partial = ""
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        """Flush and close the mirror file (the buffer stays readable)."""
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None

    def tail(self, lines: int | None = None) -> list[str]:
        """The last ``lines`` lines (all buffered lines when ``None``), including a pending partial line."""
        out = list(self._lines)
        if self._partial:
            out.append(self._partial)
        return out if lines is None else out[-lines:] if lines > 0 else []


    def window(self, after: int | None = None, newer_than: float | None = None,
               limit: int | None = None) -> LogWindow:
        """Complete lines with a sequence number ≥ ``after`` and written at or after the wall-clock time
        ``newer_than``, the last ``limit`` of them; ``next`` is the ``after`` that continues from here (for
        ``flexinfer logs --follow``)."""
        first = self.written - len(self._lines)
        picked = [line for number, (stamp, line) in enumerate(zip(self._times, self._lines, strict=True), first)
                  if (after is None or number >= after) and (newer_than is None or stamp >= newer_than)]
        if limit is not None:
            picked = picked[-limit:] if limit > 0 else []
        return LogWindow(picked, self.written)


@dataclass(frozen=True)
class LogWindow:
    """Some lines of a ``ModelLog`` and the sequence number to continue from."""

    lines: list[str]
    next: int


class LogStore:
    """One ``ModelLog`` per model key; files under ``directory`` when given."""

    def __init__(self, directory: Path | None = None, max_lines: int = DEFAULT_MAX_LINES) -> None:
        self.directory = directory
        self.max_lines = max_lines
        self._logs: dict[str, ModelLog] = {}

    def get(self, key: str) -> ModelLog:
        """The log of model ``key`` (created on first use)."""
        log = self._logs.get(key)
        if log is None:
            file = self.directory / (key.replace("/", "_") + ".log") if self.directory else None
            log = self._logs[key] = ModelLog(self.max_lines, file)
        return log

    def tail(self, key: str, lines: int | None = None) -> list[str] | None:
        """The last lines of model ``key``, or ``None`` if it never produced output."""
        log = self._logs.get(key)
        return None if log is None else log.tail(lines)

    def window(self, key: str, after: int | None = None, newer_than: float | None = None,
               limit: int | None = None) -> LogWindow | None:
        """``ModelLog.window`` of model ``key``, or ``None`` if it never produced output."""
        log = self._logs.get(key)
        return None if log is None else log.window(after, newer_than, limit)

    def close(self) -> None:
        """Close every mirror file."""
        for log in self._logs.values():
            log.close()


async def pump(reader: asyncio.StreamReader, log: ModelLog) -> None:
    """Copy ``reader`` into ``log`` until end of file (never blocks the child on a full pipe)."""
    try:
        while chunk := await reader.read(CHUNK):
            log.write(chunk.decode("utf-8", errors="replace"))
    finally:
        with contextlib.suppress(OSError):
            log.flush()
