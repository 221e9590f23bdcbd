"""The proxy's access log: one INFO line per proxied request on the ``flexinfer.access`` logger, its fields
also passed as ``extra`` (the ``json`` log format prints them as keys).

A line is made after the answer was sent, and, with tracing off, later still: the request's fields are
queued, and the records are made and handed to logging when the proxy next waits for a model server (the
handler calls ``write_soon`` just before it forwards a request) or at most ``LATEST`` seconds later. The time
between a model server's answer and the next request is then spent on the next request, not on formatting
the last one's line. With tracing on a line is made at once, inside the request's span, so that ``json``
lines carry its ``trace_id`` and ``span_id``. ``write`` sends whatever is queued (shutdown calls it). Used
by ``handler.py``.

When the commands' ``text`` handler alone would see the records, lines are formatted straight into its
pending write instead (``write_lines_with``, the same text without a record, filter and format call each).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from typing import NamedTuple

access_log = logging.getLogger("flexinfer.access")
"""Switched by ``FLEXINFER_ACCESS_LOG``/``--[no-]access-log``."""
LATEST = 0.05
"""Seconds a queued line may wait when no request is forwarded meanwhile."""
LINE = "%s %s model=%s status=%s queue_wait=%.3fs upstream=%s duration=%.3fs bytes=%d stream=%s request_id=%s"


class Entry(NamedTuple):
    """One request's line, to be made now or later."""

    method: str
    path: str
    model: str
    status: int
    waited: float
    upstream: float | None
    elapsed: float
    sent: int
    """Body bytes sent."""
    stream: bool
    request_id: str
    ended: float
    """Wall-clock time the request ended (``time.time()``)."""


class AccessLog:
    """The queue of lines not yet handed to logging (see the module docstring)."""

    __slots__ = ("_deferred", "_pending", "_scheduled", "_timer")

    def __init__(self, *, deferred: bool) -> None:
        self._deferred = deferred
        self._pending: list[Entry] = []
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None

    @staticmethod
    def enabled() -> bool:
        return access_log.isEnabledFor(logging.INFO)

    def add(self, line: Entry) -> None:
        """Log ``line``: at once, or queued (then at the latest after ``LATEST`` seconds)."""
        if not self._deferred:
            self._write([line])
            return
        self._pending.append(line)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(LATEST, self._expired)

    def write_soon(self) -> None:
        """The caller is about to wait for a model server: make the queued lines as soon as it does."""
        if self._pending and not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._write_scheduled)

    def write(self) -> None:
        """Hand every queued line to logging now, in order."""
        pending, self._pending = self._pending, []
        if pending:
            self._write(pending)

    @staticmethod
    def _write(lines: list[Entry]) -> None:
        write = _Installed.info_lines(access_log)
        if write is not None:
            write([(line.ended, LINE % _arguments(line)) for line in lines])
            return
        for line in lines:
            _emit(line)

    def _write_scheduled(self) -> None:
        self._scheduled = False
        self.write()

    def _expired(self) -> None:
        self._timer = None
        self.write()


InfoLines = Callable[[logging.Logger], Callable[[list[tuple[float, str]]], None] | None]
"""Given a logger, a writer of its finished INFO lines as ``(created, message)`` pairs, or ``None`` when its
records must go through logging (``observability.log_setup.info_lines``)."""


def _through_logging(logger: logging.Logger) -> None:
    """No writer: every line is a record handed to logging."""


class _Installed:
    """What ``write_lines_with`` installed."""

    info_lines: InfoLines = _through_logging


def write_lines_with(info_lines: InfoLines) -> None:
    """Queued lines are written through ``info_lines`` whenever it offers a writer (the commands install
    ``log_setup.info_lines`` with their log handler: ``text`` lines then skip making a record each)."""
    _Installed.info_lines = info_lines


def _arguments(line: Entry) -> tuple[object, ...]:
    """``LINE``'s arguments."""
    method, path, model, status, waited, upstream, elapsed, sent, stream, request_id, _ = line
    return (method, path, model, status, waited, "-" if upstream is None else f"{upstream:.3f}s", elapsed, sent,
            "true" if stream else "false", request_id)


def _emit(line: Entry) -> None:
    """Hand one line's record to logging."""
    method, path, model, status, waited, upstream, elapsed, sent, stream, request_id, ended = line
    fields = {"model": model, "status": status, "method": method, "path": path, "queue_wait_s": round(waited, 4),
              "upstream_s": None if upstream is None else round(upstream, 4), "duration_s": round(elapsed, 4),
              "bytes": sent, "stream": stream, "request_id": request_id}
    access_log.handle(AccessRecord(_arguments(line), fields, ended))


class AccessRecord(logging.LogRecord):
    """An access line's record: what ``Logger.makeRecord`` makes for it, with ``created`` the time its request
    ended, and without ``LogRecord.__init__``'s per-call work (source file name, level name, process name),
    which is the same for every line. The thread and process ids are read for each record."""

    def __init__(self, args: tuple[object, ...], fields: dict[str, object], ended: float) -> None:
        # ``LogRecord.__init__`` is not called: ``_TEMPLATE`` holds what it would set, for this logger and line.
        attributes = self.__dict__
        attributes.update(_TEMPLATE)
        attributes.update(fields)
        self.args = args
        self.created, self.msecs = ended, int((ended - int(ended)) * 1000) + 0.0
        self.relativeCreated = (ended - logging._startTime) * 1000  # type: ignore[attr-defined]  # as LogRecord does
        self.thread, self.threadName = threading.get_ident(), threading.current_thread().name
        self.process = os.getpid()


_TEMPLATE = {name: value for name, value in access_log.makeRecord(
    access_log.name, logging.INFO, __file__, 0, LINE, (), None).__dict__.items()
    if name not in ("args", "created", "msecs", "relativeCreated", "thread", "threadName", "process")}
