"""``flexinfer unload MODEL [--timeout 10m] [--no-wait]``: stop a model of a running ``flexinfer serve`` (like
``ollama stop``): its in-flight requests finish first (drain), then its server stops and it stays stopped until
the next request. Waits until it is stopped, printing each phase. Over the admin API
(``POST /admin/models/{model}/unload``)."""

from __future__ import annotations

import argparse
from typing import Any

from flexinfer.cli.admin_client import add_connection_arguments, post_json
from flexinfer.cli.arguments import duration
from flexinfer.cli.model_phase import model_path, wait_for_phase

STOPPED = ("Idle", "Preempted", "Failed")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "unload", help="drain and stop a model of a running `flexinfer serve`",
        description="Drain a model's in-flight requests, stop its server and wait until it is stopped.",
    )
    parser.add_argument("model", help="model name, alias or namespace/name")
    parser.add_argument("--timeout", type=duration, default=600.0, metavar="DURATION",
                        help="how long to wait for the stop (default 10m)")
    parser.add_argument("--no-wait", dest="wait", action="store_false", help="return once the stop is asked")
    add_connection_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    answer = post_json(args, model_path(args.model) + "/unload")
    key = str(answer["model"])
    if args.wait:
        answer = wait_for_phase(args, key, STOPPED, args.timeout)
    print(f"{key}: {answer['phase']}")
    return 0
