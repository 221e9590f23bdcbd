"""Installs the root log handler of a long-running command: level, ``text`` or ``json`` lines on stderr,
and the access log switch.

JSON lines come from python-json-logger: ``time``, ``level``, ``logger``, ``message`` plus every ``extra``
field a call passes (the access log and lifecycle lines pass theirs), and ``trace_id``/``span_id`` (hex)
when a recording OpenTelemetry span is current. Called by the composition roots (``flexinfer.assembly``)
before anything logs.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

from opentelemetry import trace
from pythonjsonlogger.json import JsonFormatter

from flexinfer.observability.logging_config import LogSettings

ACCESS_LOGGER = "flexinfer.access"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
JSON_FIELDS = ("asctime", "levelname", "name", "message")
QUIET_LIBRARIES = ("kopf", "aiohttp.access")
"""Libraries whose INFO chatter is not ours: kept at WARNING or above whatever the level (aiohttp's own access
log would duplicate ``flexinfer.access``)."""


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
        second, text = self._cached
        if second != int(record.created):
            second = int(record.created)
            text = time.strftime(self.default_time_format, self.converter(record.created))
            self._cached = (second, text)
        return f"{text},{int(record.msecs):03d}"  # logging.Formatter.default_msec_format


class _TextFormatter(_SecondCache, logging.Formatter):
    """``text`` lines."""


class _JsonFormatter(_SecondCache, JsonFormatter):
    """``json`` lines."""


def formatter(format: str) -> logging.Formatter:
    """The formatter for ``text`` or ``json``."""
    if format == "json":
        return _JsonFormatter(list(JSON_FIELDS), rename_fields={"asctime": "time", "levelname": "level",
                                                                 "name": "logger"},
                              timestamp=False)
    return _TextFormatter(TEXT_FORMAT)


def configure_logging(settings: LogSettings, stream: TextIO | None = None) -> None:
    """Replace the root handlers with one stderr handler as ``settings`` say."""
    handler = logging.StreamHandler(stream or sys.stderr)
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
