"""``log_settings``: flags win over the environment, bad values name their variable; ``configure_logging``
writes JSON lines with the record's extra fields and switches the access log."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest

from flexinfer.core.errors import ConfigError
from flexinfer.observability.log_setup import (
    TEXT_FORMAT,
    TickWriter,
    TraceContextFilter,
    configure_logging,
    formatter,
    info_lines,
)
from flexinfer.observability.logging_config import LogSettings, log_settings


def test_defaults_environment_and_flags() -> None:
    assert log_settings({}) == LogSettings("INFO", "text", True)
    env = {"FLEXINFER_LOG_LEVEL": " debug ", "FLEXINFER_LOG_FORMAT": "JSON", "FLEXINFER_ACCESS_LOG": "off"}
    assert log_settings(env) == LogSettings("DEBUG", "json", False)
    assert log_settings(env, level="ERROR", format="text", access_log=True) == LogSettings("ERROR", "text", True)


@pytest.mark.parametrize(("name", "value"), [("FLEXINFER_LOG_LEVEL", "verbose"), ("FLEXINFER_LOG_FORMAT", "yaml")])
def test_a_bad_value_names_its_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"{name}='{value}'"):
        log_settings({name: value})


def test_json_lines_and_the_access_switch() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure_logging(LogSettings("INFO", "json", False), stream)
        logging.getLogger("flexinfer.test").info("hello %s", "there", extra={"model": "ns/m"})
        logging.getLogger("flexinfer.access").info("dropped")
        logging.getLogger("flexinfer.test").debug("below the level")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logging.getLogger("flexinfer.access").disabled = False
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert len(lines) == 1
    assert lines[0]["message"] == "hello there" and lines[0]["model"] == "ns/m"
    assert lines[0]["level"] == "INFO" and lines[0]["logger"] == "flexinfer.test" and "trace_id" not in lines[0]


@pytest.mark.parametrize("library", ["kopf", "httpx2", "httpx", "aiohttp.access"])
def test_a_librarys_info_chatter_stays_out_even_at_debug(library: str) -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, logging.getLogger(library).level)
    try:
        configure_logging(LogSettings("DEBUG", "text", True), stream)
        logging.getLogger(library).info('HTTP Request: PUT https://10.96.0.1/leases "HTTP/1.1 200 OK"')
        logging.getLogger(library).warning("a warning still shows")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logging.getLogger(library).setLevel(saved[2])
    assert "HTTP Request" not in stream.getvalue() and "a warning still shows" in stream.getvalue()


def test_the_cached_time_of_day_formats_every_record_as_the_stock_formatter_does() -> None:
    cached, stock = formatter("text"), logging.Formatter(TEXT_FORMAT)
    for created in (1_700_000_000.001, 1_700_000_000.999, 1_700_000_001.5, 1_700_000_000.25, 1_700_003_600.0):
        record = logging.LogRecord("flexinfer.access", logging.INFO, __file__, 1, "line %d", (7,), None)
        record.created, record.msecs = created, int((created - int(created)) * 1000)
        assert cached.format(record) == stock.format(record)
    assert formatter("json").formatTime(record) == stock.formatTime(record)


class _Writes(io.StringIO):
    """A stream that keeps each ``write`` call's text."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return super().write(text)


@pytest.fixture
def batched() -> Iterator[tuple[_Writes, logging.Logger, TickWriter]]:
    """A logger whose only handler is a ``TickWriter`` on a recording stream."""
    stream, log = _Writes(), logging.getLogger("flexinfer.test.batched")
    handler = TickWriter(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    log.propagate = False
    try:
        yield stream, log, handler
    finally:
        log.removeHandler(handler)
        log.propagate = True


def test_lines_of_one_loop_iteration_are_written_together_after_it_and_in_order(
        batched: tuple[_Writes, logging.Logger, TickWriter]) -> None:
    stream, log, _ = batched
    seen_during: list[list[str]] = []

    async def burst() -> None:
        for n in range(3):
            log.warning("line %d", n)
        seen_during.append(list(stream.calls))  # nothing written while the iteration runs
        await asyncio.sleep(0)  # the iteration ends: the three lines go out in one write
        seen_during.append(list(stream.calls))
        log.warning("line 3")
        await asyncio.to_thread(log.warning, "from a thread")  # written at once, after the pending line

    log.warning("before the loop")  # no loop running: written at once
    asyncio.run(burst())
    assert seen_during == [["before the loop\n"], ["before the loop\n", "line 0\nline 1\nline 2\n"]]
    assert stream.calls[2:] == ["line 3\nfrom a thread\n"]
    assert stream.getvalue().splitlines() == ["before the loop", "line 0", "line 1", "line 2", "line 3",
                                              "from a thread"]


def test_a_line_pending_when_its_loop_closed_is_written_by_flush_and_by_the_next_loop(
        batched: tuple[_Writes, logging.Logger, TickWriter]) -> None:
    stream, log, handler = batched
    loop = asyncio.new_event_loop()

    async def one(text: str) -> None:
        log.warning(text)

    async def last(text: str) -> None:
        asyncio.get_running_loop().stop()  # this is the loop's last iteration: its flush never runs
        log.warning(text)

    loop.run_until_complete(last("first"))
    loop.close()
    assert stream.calls == []
    asyncio.run(one("second"))  # a new loop schedules its own flush
    assert stream.getvalue().splitlines() == ["first", "second"]
    loop = asyncio.new_event_loop()
    loop.run_until_complete(last("third"))
    loop.close()
    assert stream.getvalue().splitlines() == ["first", "second"]
    handler.flush()  # shutdown's flush
    assert stream.getvalue().splitlines() == ["first", "second", "third"]


def test_info_lines_are_offered_only_when_the_text_handler_alone_would_see_the_records() -> None:
    log = logging.getLogger("flexinfer.test.lines")
    handler = TickWriter(io.StringIO())
    handler.setFormatter(formatter("text"))
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.INFO)
    errors_only = logging.Handler(logging.WARNING)
    log.addHandler(errors_only)
    try:
        assert info_lines(log) is not None, "a handler for warnings and up never sees the lines"
        log.addFilter(lambda record: True)
        assert info_lines(log) is None, "a filter on the logger may drop or change records"
        log.filters.clear()
        handler.addFilter(TraceContextFilter())
        assert info_lines(log) is None, "so may one on the handler"
        handler.filters.clear()
        handler.setFormatter(formatter("json"))
        assert info_lines(log) is None, "json lines carry each record's fields"
        handler.setFormatter(formatter("text"))
        log.propagate = True  # the root's handlers (a test's capture) see the records as well
        assert info_lines(log) is None
        log.propagate = False
        log.setLevel(logging.WARNING)
        assert info_lines(log) is None
        log.setLevel(logging.INFO)
        log.disabled = True  # the access switch
        assert info_lines(log) is None
        log.disabled = False
        errors_only.setLevel(logging.INFO)
        assert info_lines(log) is None
    finally:
        log.removeHandler(errors_only)
        log.removeHandler(handler)
        log.propagate, log.disabled = True, False
        log.setLevel(logging.NOTSET)


def test_info_lines_are_the_lines_logging_writes_and_go_out_with_the_pending_ones() -> None:
    stream, log = _Writes(), logging.getLogger("flexinfer.test.lines")
    handler = TickWriter(stream)
    handler.setFormatter(formatter("text"))
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.INFO)
    created = (1_700_000_000.0015, 1_700_000_001.999)
    try:
        for when in created:
            record = log.makeRecord(log.name, logging.INFO, __file__, 1, "line %s", (when,), None)
            record.created, record.msecs = when, int((when - int(when)) * 1000) + 0.0
            log.handle(record)
        write = info_lines(log)
        assert write is not None

        async def in_loop() -> None:
            log.info("pending")
            write([(when, f"line {when}") for when in created])
            assert len(stream.calls) == 2, "written with this iteration's lines, after it"

        asyncio.run(in_loop())
    finally:
        log.removeHandler(handler)
        log.propagate = True
        log.setLevel(logging.NOTSET)
    *through_logging, direct = stream.calls
    assert direct.endswith("".join(through_logging))
    assert direct.splitlines()[0].endswith("INFO flexinfer.test.lines: pending")
