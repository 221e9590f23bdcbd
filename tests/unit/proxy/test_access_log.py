"""The access log's lines are made after the answer: queued until the proxy next forwards a request or
``LATEST`` seconds pass, in order, with the time the request ended; made at once with tracing on; the queue is
written by ``write`` (shutdown) and by the proxy when it forwards."""

from __future__ import annotations

import asyncio
import io
import logging
import time

import pytest
from tests.support.polling import eventually

from flexinfer.observability.log_setup import TickWriter, formatter, info_lines
from flexinfer.proxy import access_log as access_log_module
from flexinfer.proxy.access_log import LATEST, LINE, AccessLog, AccessRecord, Entry, write_lines_with


def _entry(n: int, ended: float) -> Entry:
    return Entry("POST", "/v1/chat/completions", "default/alpha", 200, 0.0, 0.0021, 0.0032, 17 + n, False,
                 f"rid-{n}", ended)


def _lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "flexinfer.access"]


async def test_queued_lines_are_made_in_order_once_the_proxy_forwards(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="flexinfer.access")
    access, ended = AccessLog(deferred=True), time.time() - 0.5
    access.add(_entry(1, ended))
    access.add(_entry(2, ended + 0.25))
    await asyncio.sleep(0)
    assert _lines(caplog) == [], "nothing is made while answers are being sent"
    access.write_soon()
    assert _lines(caplog) == [], "made once the caller waits"
    await asyncio.sleep(0)
    first, second = _lines(caplog)
    assert first.getMessage() == ("POST /v1/chat/completions model=default/alpha status=200 queue_wait=0.000s "
                                  "upstream=0.002s duration=0.003s bytes=18 stream=false request_id=rid-1")
    assert (first.created, first.msecs, first.request_id) == (ended, int((ended % 1) * 1000), "rid-1")  # type: ignore[attr-defined]
    assert (second.created, second.bytes, second.upstream_s) == (ended + 0.25, 19, 0.0021)  # type: ignore[attr-defined]


async def test_a_queued_line_is_made_within_latest_when_nothing_is_forwarded(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="flexinfer.access")
    access, started = AccessLog(deferred=True), time.monotonic()
    access.add(_entry(1, time.time()))
    await eventually(lambda: len(_lines(caplog)) == 1, timeout=LATEST * 40)
    assert time.monotonic() - started >= LATEST * 0.9


async def test_without_deferral_or_at_shutdown_lines_are_made_at_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="flexinfer.access")
    AccessLog(deferred=False).add(_entry(1, time.time()))  # tracing on: inside the request's span
    assert [r.request_id for r in _lines(caplog)] == ["rid-1"]  # type: ignore[attr-defined]
    access = AccessLog(deferred=True)
    access.add(_entry(2, time.time()))
    access.write()
    assert [r.request_id for r in _lines(caplog)] == ["rid-1", "rid-2"]  # type: ignore[attr-defined]


def test_an_access_record_holds_what_make_record_would_with_the_request_end_as_its_time() -> None:
    access_log = logging.getLogger("flexinfer.access")
    args, fields, ended = ("POST", "/v1/x"), {"model": "default/alpha", "status": 200, "request_id": "r"}, 1.7e9 + 0.25
    ours = AccessRecord(args, fields, ended).__dict__
    stock = access_log.makeRecord(access_log.name, logging.INFO, access_log_module.__file__, 0, LINE, args, None,
                                  extra=fields).__dict__
    times = {"created", "msecs", "relativeCreated"}
    assert {k: v for k, v in ours.items() if k not in times} == {k: v for k, v in stock.items() if k not in times}
    assert (ours["created"], ours["msecs"]) == (ended, 250.0)
    assert ours["relativeCreated"] == (ended - logging._startTime) * 1000  # type: ignore[attr-defined]


async def test_a_writer_offered_for_text_lines_writes_what_logging_would() -> None:
    log, stream = logging.getLogger("flexinfer.access"), io.StringIO()
    handler = TickWriter(stream)
    handler.setFormatter(formatter("text"))
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.INFO)
    ended = time.time()
    written = []
    try:
        assert info_lines(log) is not None, "the handler alone sees the access records: lines may skip logging"
        for writer in (None, info_lines):  # through logging, then with the commands' writer
            if writer is not None:
                write_lines_with(writer)
            access = AccessLog(deferred=True)
            access.add(_entry(1, ended))
            access.add(_entry(2, ended + 0.5)._replace(upstream=None, stream=True))
            access.write()
            handler.flush()
            written.append(stream.getvalue())
            stream.seek(0)
            stream.truncate()
    finally:
        write_lines_with(access_log_module._through_logging)
        log.removeHandler(handler)
        log.propagate = True
        log.setLevel(logging.NOTSET)
    through_logging, direct = written
    assert direct == through_logging
    assert "upstream=- duration=0.003s bytes=19 stream=true request_id=rid-2\n" in direct
