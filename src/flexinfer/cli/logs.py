"""``flexinfer logs MODEL [--tail N] [--url URL]``: the captured output of a model's server, from a running
``flexinfer serve`` (kept across restarts and crashes, so a failed start can be diagnosed)."""

from __future__ import annotations

import argparse
import sys
import urllib.parse
from typing import Any

from flexinfer.cli.admin_client import add_connection_arguments, get_json


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "logs", help="print a model server's output from a running `flexinfer serve`",
        description="Print the last lines a model server wrote (stdout and stderr).",
    )
    parser.add_argument("model", help="model name, alias or namespace/name")
    parser.add_argument("--tail", type=int, default=200, metavar="N", help="lines to show (default 200)")
    add_connection_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    path = "/admin/logs/" + urllib.parse.quote(args.model, safe="/")
    body = get_json(args, path, {"tail": str(max(args.tail, 0))})
    for line in body["lines"]:
        sys.stdout.write(line + "\n")
    return 0
