"""``log_settings``: flags win over the environment, bad values name their variable; ``configure_logging``
writes JSON lines with the record's extra fields and switches the access log."""

from __future__ import annotations

import io
import json
import logging

import pytest

from flexinfer.core.errors import ConfigError
from flexinfer.observability.log_setup import TEXT_FORMAT, configure_logging, formatter
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


def test_the_cached_time_of_day_formats_every_record_as_the_stock_formatter_does() -> None:
    cached, stock = formatter("text"), logging.Formatter(TEXT_FORMAT)
    for created in (1_700_000_000.001, 1_700_000_000.999, 1_700_000_001.5, 1_700_000_000.25, 1_700_003_600.0):
        record = logging.LogRecord("flexinfer.access", logging.INFO, __file__, 1, "line %d", (7,), None)
        record.created, record.msecs = created, int((created - int(created)) * 1000)
        assert cached.format(record) == stock.format(record)
    assert formatter("json").formatTime(record) == stock.formatTime(record)
