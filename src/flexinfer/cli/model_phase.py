"""Asking a running ``flexinfer serve`` to act on one model and waiting on its phase through the admin API, with
one progress line per change on stderr (used by ``flexinfer load`` and ``flexinfer unload``)."""

from __future__ import annotations

import argparse
import sys
import time
import urllib.parse
from collections.abc import Collection
from typing import Any

from flexinfer.api.errors import FlexInferError
from flexinfer.api.units import format_duration
from flexinfer.cli.admin_client import add_connection_arguments, get_json, post_json
from flexinfer.cli.arguments import duration

POLL_SECONDS = 0.25


def add_model_action_parser(subparsers: Any, action: str, help_text: str, description: str,
                            timeout_help: str) -> argparse.ArgumentParser:
    """The parser of ``flexinfer <action> MODEL [--timeout D] [--no-wait]``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(action, help=help_text, description=description)
    parser.add_argument("model", help="model name, alias or namespace/name")
    parser.add_argument("--timeout", type=duration, default=600.0, metavar="DURATION", help=timeout_help)
    parser.add_argument("--no-wait", dest="wait", action="store_false",
                        help=f"return once the {action} is asked")
    add_connection_arguments(parser)
    return parser


def request_action(args: argparse.Namespace, action: str) -> tuple[str, dict[str, Any]]:
    """``POST /admin/models/<model>/<action>``: the model's key and the answer."""
    answer = post_json(args, model_path(args.model) + "/" + action)
    return str(answer["model"]), answer


def model_path(model: str) -> str:
    """``/admin/models/<model>`` (a ``namespace/name`` keeps its slash)."""
    return "/admin/models/" + urllib.parse.quote(model, safe="/")


def model_rows(args: argparse.Namespace, key: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The ``/admin/status`` row of model ``key``, and every row."""
    rows = [dict(row) for row in get_json(args, "/admin/status")["models"]]
    for row in rows:
        if row["key"] == key:
            return row, rows
    raise FlexInferError(f"model {key} is no longer served")


def holder_note(row: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """For a Pending model, who holds its GPU group (a loaded model is not preempted by ``load`` alone: it
    keeps the GPU until it is idle or unloaded)."""
    group = row.get("group")
    if row["phase"] != "Pending" or not group:
        return ""
    holder = next((r for r in rows if r.get("group") == group and r["key"] != row["key"]
                   and r["phase"] in ("Ready", "Loading")), None)
    if holder is None:
        return ""
    return (f"; GPU group {group} is held by {holder['key']} until it is idle "
            f"(`flexinfer unload {holder['key']}` frees it now)")


def wait_for_phase(args: argparse.Namespace, key: str, done: Collection[str], timeout: float) -> dict[str, Any]:
    """Poll until the model's phase is in ``done`` (and it is not draining); the last row. Prints
    ``<key>: <phase> (<elapsed>)`` on stderr whenever the phase changes; ``FlexInferError`` after ``timeout``."""
    started, shown = time.monotonic(), ""
    while True:
        row, rows = model_rows(args, key)
        phase = str(row["phase"]) + (" (draining)" if row.get("draining") else "")
        if phase != shown:
            print(f"{key}: {phase} ({format_duration(time.monotonic() - started)}){holder_note(row, rows)}",
                  file=sys.stderr, flush=True)
            shown = phase
        if row["phase"] in done and not row.get("draining"):
            return row
        if time.monotonic() - started > timeout:
            raise FlexInferError(f"model {key} is still {phase} after {format_duration(timeout)} (--timeout)")
        time.sleep(POLL_SECONDS)
