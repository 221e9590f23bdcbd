"""Log settings of the long-running commands (``serve``, ``proxy``, ``manager``), parsed from the environment
snapshot, and the table ``flexinfer settings`` documents.

Flags win over the environment: ``--log-level`` over ``FLEXINFER_LOG_LEVEL``, ``--log-format`` over
``FLEXINFER_LOG_FORMAT``, ``--access-log/--no-access-log`` over ``FLEXINFER_ACCESS_LOG``. Unlike most variables,
a bad level, format or access-log word is an error naming the variable (a typo must not silently hide logs). Applied by
``flexinfer.observability.log_setup.configure_logging``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from flexinfer.core.envvalues import EnvReader, EnvVar, Kind

LEVEL = "FLEXINFER_LOG_LEVEL"
FORMAT = "FLEXINFER_LOG_FORMAT"
ACCESS_LOG = "FLEXINFER_ACCESS_LOG"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMATS = ("text", "json")

ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar(LEVEL, "INFO", "Log level: DEBUG, INFO, WARNING or ERROR (`--log-level` wins).", Kind.CHOICE),
    EnvVar(FORMAT, "text", "`text` (one readable line) or `json` (one JSON object per line, with `trace_id`/"
           "`span_id` when tracing is on); `--log-format` wins.", Kind.CHOICE),
    EnvVar(ACCESS_LOG, "true", "One INFO line per proxied request on the `flexinfer.access` logger (model, "
           "status, queue wait, upstream time, bytes, stream, request id); `--[no-]access-log` wins.", Kind.BOOL),
)


@dataclass(frozen=True)
class LogSettings:
    """How a command logs."""

    level: str = "INFO"
    format: str = "text"
    access_log: bool = True


def log_settings(env: Mapping[str, str], *, level: str | None = None, format: str | None = None,
                 access_log: bool | None = None) -> LogSettings:
    """The effective settings: each flag given (not ``None``) wins over its variable. ``ConfigError`` names
    the variable when its value is not one of the choices."""
    read = EnvReader(env)
    return LogSettings(
        level=level or read.choice(LEVEL, tuple(name.lower() for name in LEVELS), "info").upper(),
        format=format or read.choice(FORMAT, FORMATS, "text"),
        access_log=read.flag(ACCESS_LOG, True) if access_log is None else access_log,
    )
