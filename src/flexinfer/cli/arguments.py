"""Argument types and option groups shared by the subcommands (integers with a lower bound, ports, log and
listen options), with a clear message."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type`` accepting whole numbers ≥ ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be ≥ {minimum}, got {value}")
        return value

    return parse


def byte_quantity(text: str) -> str:
    """An argparse ``type`` for a byte count: a whole number or a quantity (``200Mi``), kept as text."""
    from flexinfer.api.units import quantity_bytes

    try:
        quantity_bytes(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected bytes or a quantity such as 200Mi, got {text!r}") from None
    return text


def port_number(text: str) -> int:
    """An argparse ``type`` for a TCP port: 0 (pick a free one) to 65535."""
    value = int_at_least(0)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port from 0 to 65535, got {value}")
    return value


def add_log_arguments(parser: argparse.ArgumentParser, *, access_log: bool = False) -> None:
    """``--log-level`` and ``--log-format`` (and, for commands that proxy, ``--[no-]access-log``); unset flags
    fall back to ``FLEXINFER_LOG_LEVEL``/``FLEXINFER_LOG_FORMAT``/``FLEXINFER_ACCESS_LOG``."""
    from flexinfer.observability.logging_config import FORMATS, LEVELS

    parser.add_argument("--log-level", type=str.upper, choices=LEVELS, default=None,
                        help="log level (default: $FLEXINFER_LOG_LEVEL or INFO)")
    parser.add_argument("--log-format", type=str.lower, choices=FORMATS, default=None,
                        help="text lines or one JSON object per line (default: $FLEXINFER_LOG_FORMAT or text)")
    if access_log:
        parser.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=None,
                            help="one line per proxied request (default: $FLEXINFER_ACCESS_LOG or on)")


def add_listen_arguments(parser: argparse.ArgumentParser, default_host: str) -> None:
    """``--host`` and ``--port``; unset flags fall back to ``FLEXINFER_HOST``/``FLEXINFER_PORT``."""
    parser.add_argument("--host", default=None,
                        help=f"listen address (default: $FLEXINFER_HOST or {default_host})")
    parser.add_argument("--port", type=port_number, default=None,
                        help="listen port (default: $FLEXINFER_PORT or 8080; 0 picks a free port)")


def start_logging(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    """Install the log handler the flags and environment ask for (``ConfigError`` for a bad variable)."""
    from flexinfer.observability.log_setup import configure_logging, info_lines
    from flexinfer.observability.logging_config import log_settings
    from flexinfer.proxy.access_log import write_lines_with

    configure_logging(log_settings(env, level=args.log_level, format=args.log_format,
                                   access_log=getattr(args, "access_log", None)))
    write_lines_with(info_lines)


def duration(text: str) -> float:
    """An argparse ``type`` for a Go-style duration (``90s``, ``10m``, ``1h30m``) → seconds."""
    from flexinfer.api.units import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
