"""``flexinfer unload MODEL [--timeout 10m] [--no-wait]``: stop a model of a running ``flexinfer serve`` (like
``ollama stop``): its in-flight requests finish first (drain), then its server stops and it stays stopped until
the next request. Waits until it is stopped, printing each phase. Over the admin API
(``POST /admin/models/{model}/unload``)."""

from __future__ import annotations

import argparse
from typing import Any

from flexinfer.cli.model_phase import add_model_action_parser, request_action, wait_for_phase

STOPPED = ("Idle", "Preempted", "Failed")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    return add_model_action_parser(
        subparsers, "unload", "drain and stop a model of a running `flexinfer serve`",
        "Drain a model's in-flight requests, stop its server and wait until it is stopped.",
        "how long to wait for the stop (default 10m)")


def run(args: argparse.Namespace) -> int:
    key, answer = request_action(args, "unload")
    if args.wait:
        answer = wait_for_phase(args, key, STOPPED, args.timeout)
    print(f"{key}: {answer['phase']}")
    return 0
