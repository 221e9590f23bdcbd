"""``flexinfer logs MODEL [--tail N] [--url URL]``: the captured output of a model's server, from a running
``flexinfer serve`` (kept across restarts and crashes, so a failed start can be diagnosed). A model that has
not run since ``serve`` started is an error saying so (exit 1)."""

from __future__ import annotations

import argparse
import sys
import urllib.parse
from typing import Any

from flexinfer.api.errors import FlexInferError
from flexinfer.cli.admin_client import add_connection_arguments, get_json
from flexinfer.cli.arguments import int_at_least


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "logs", help="print a model server's output from a running `flexinfer serve`",
        description="Print the last lines a model server wrote (stdout and stderr).",
    )
    parser.add_argument("model", help="model name, alias or namespace/name")
    parser.add_argument("--tail", type=int_at_least(0), default=200, metavar="N", help="lines to show (default 200)")
    add_connection_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    path = "/admin/logs/" + urllib.parse.quote(args.model, safe="/")
    body = get_json(args, path, {"tail": str(args.tail)})
    if body.get("started") is False:
        raise FlexInferError(f"model {body['model']} has not run since this `flexinfer serve` started, so there is "
                             "no output to show (a request to it starts it; `flexinfer status` shows its phase)")
    if not body["lines"] and args.tail:
        print(f"flexinfer logs: model {body['model']} has written no output yet", file=sys.stderr)
    for line in body["lines"]:
        sys.stdout.write(line + "\n")
    return 0
