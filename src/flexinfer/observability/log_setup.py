"""Installs the root log handler of a long-running command: level, ``text`` or ``json`` lines on stderr,
and the access log switch.

Lines logged on a running event loop's thread are written together once per loop iteration (``TickWriter``):
the access log writes a line per request, and under load one ``write`` then carries the lines of many
requests instead of one system call each. Lines from other threads, or with no loop running, are written at
once (after any pending ones, so the order is kept); ``flush`` and shutdown write whatever is pending.

JSON lines come from python-json-logger: ``time``, ``level``, ``logger``, ``message`` plus every ``extra``
field a call passes (the access log and lifecycle lines pass theirs), and ``trace_id``/``span_id`` (hex)
when a recording OpenTelemetry span is current. Called by the composition roots (``flexinfer.assembly``)
before anything logs.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable
from typing import TextIO

from opentelemetry import trace
from pythonjsonlogger.json import JsonFormatter

from flexinfer.observability.logging_config import LogSettings

ACCESS_LOGGER = "flexinfer.access"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
JSON_FIELDS = ("asctime", "levelname", "name", "message")
QUIET_LIBRARIES = ("kopf", "aiohttp.access", "httpx", "httpx2")
"""Libraries whose INFO chatter is not ours: kept at WARNING or above whatever the level (aiohttp's own access
log would duplicate ``flexinfer.access``; lightkube's HTTP client logs every request it sends, two lines every 5 s
for the leader lease alone)."""


class TraceContextFilter(logging.Filter):
    """Adds ``trace_id`` and ``span_id`` to a record when the current OpenTelemetry span is valid."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            record.trace_id = format(context.trace_id, "032x")
            record.span_id = format(context.span_id, "016x")
        return True


class _SecondCache(logging.Formatter):
    """``formatTime`` with the date and time of day formatted once per second (the access log writes a line
    per request; ``time.strftime`` was a fifth of a line's cost). Same text as ``logging.Formatter``'s."""

    _cached: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        return self.asctime(record.created, record.msecs)

    def asctime(self, created: float, msecs: float) -> str:
        """``asctime`` of a record made at ``created`` (``msecs`` as ``LogRecord`` computes it)."""
        second, text = self._cached
        if second != int(created):
            second = int(created)
            text = time.strftime(self.default_time_format, self.converter(created))
            self._cached = (second, text)
        return f"{text},{int(msecs):03d}"  # logging.Formatter.default_msec_format


class _TextFormatter(_SecondCache, logging.Formatter):
    """``text`` lines."""

    def info_line(self, logger: str, created: float, message: str) -> str:
        """The line ``format`` makes of an INFO record of ``logger`` with ``message`` made at ``created``."""
        return f"{self.asctime(created, int((created - int(created)) * 1000))} INFO {logger}: {message}"


class _JsonFormatter(_SecondCache, JsonFormatter):
    """``json`` lines."""


class TickWriter(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that batches the lines of one event loop iteration into one write."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._pending: list[str] = []
        self._tick: asyncio.AbstractEventLoop | None = None
        """The loop a flush is scheduled on (a loop closed before running it does not hold lines back)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + self.terminator
        except Exception:
            self.handleError(record)
            return
        self._queue(line)

    def _queue(self, line: str) -> None:
        """Write ``line`` with this loop iteration's lines, or at once off a loop (the caller holds the lock)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._write(line)
            return
        if self._tick is not loop:
            self._tick = loop
            loop.call_soon(self.flush)
        self._pending.append(line)

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]  # created by Handler.__init__
            self._tick = None
            self._write("")

    def _write(self, line: str) -> None:
        """Write the pending lines and ``line`` in one write (the caller holds the handler's lock)."""
        pending, self._pending = self._pending, []
        text = "".join(pending) + line if pending else line
        if not text:
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except Exception:  # a closed pipe or a full disk: logging's own rule is to carry on
            if logging.raiseExceptions and sys.__stderr__ is not None:
                sys.__stderr__.write(f"--- {len(pending) + bool(line)} log line(s) lost: the log stream failed\n")


def info_lines(logger: logging.Logger) -> Callable[[list[tuple[float, str]]], None] | None:
    """A writer of finished INFO lines of ``logger`` (``(created, message)`` pairs), for a logger that writes
    many (the access log): the lines ``logger.info`` would give, without a record, a filter or a format call
    each. ``None`` unless this module's ``text`` handler is the only one its INFO records reach (a handler for
    warnings and errors only does not count) and no filter could drop or change them (a test's capture handler,
    say, gets records as usual)."""
    handlers: list[logging.Handler] = []
    current: logging.Logger | None = logger
    while current is not None:
        handlers += [handler for handler in current.handlers if handler.level <= logging.INFO]
        current = current.parent if current.propagate else None
    if logger.filters or len(handlers) != 1 or not logger.isEnabledFor(logging.INFO):
        return None
    handler = handlers[0]
    text = handler.formatter
    if type(handler) is not TickWriter or handler.filters or type(text) is not _TextFormatter:
        return None
    name, terminator = logger.name, handler.terminator

    def write(lines: list[tuple[float, str]]) -> None:
        made = "".join([text.info_line(name, created, message) + terminator for created, message in lines])
        with handler.lock:  # type: ignore[union-attr]  # created by Handler.__init__
            handler._queue(made)

    return write


def formatter(format: str) -> logging.Formatter:
    """The formatter for ``text`` or ``json``."""
    if format == "json":
        return _JsonFormatter(list(JSON_FIELDS), rename_fields={"asctime": "time", "levelname": "level",
                                                                 "name": "logger"},
                              timestamp=False)
    return _TextFormatter(TEXT_FORMAT)


def configure_logging(settings: LogSettings, stream: TextIO | None = None) -> None:
    """Replace the root handlers with one stderr handler as ``settings`` say."""
    handler = TickWriter(stream or sys.stderr)
    handler.setFormatter(formatter(settings.format))
    if settings.format == "json":
        handler.addFilter(TraceContextFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    level = getattr(logging, settings.level)
    root.setLevel(level)
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(max(logging.WARNING, level))
    logging.getLogger(ACCESS_LOGGER).disabled = not settings.access_log
