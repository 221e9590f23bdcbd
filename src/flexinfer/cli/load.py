"""``flexinfer load MODEL [--timeout 10m] [--no-wait]``: start a model of a running ``flexinfer serve`` without a
request (it preempts a lower-priority holder of its GPU group, like a request would) and wait until it is
Ready, printing each phase it passes through. A model that fails to start is an error with its reason (exit
1). Over the admin API (``POST /admin/models/{model}/load``)."""

from __future__ import annotations

import argparse
from typing import Any

from flexinfer.api.errors import FlexInferError
from flexinfer.cli.model_phase import add_model_action_parser, request_action, wait_for_phase


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    return add_model_action_parser(
        subparsers, "load", "start a model of a running `flexinfer serve` and wait until it is Ready",
        "Activate a model without a request and wait until it is Ready (progress on stderr).",
        "how long to wait for Ready (default 10m; the activation stays requested after it)")


def run(args: argparse.Namespace) -> int:
    key, answer = request_action(args, "load")
    if not args.wait:
        print(f"{key}: {answer['phase']}")
        return 0
    row = wait_for_phase(args, key, ("Ready", "Failed"), args.timeout)
    if row["phase"] == "Failed":
        error = str(row.get("last_error") or "unknown error").strip().splitlines()[0]
        raise FlexInferError(f"model {key} failed to start: {error} (`flexinfer logs {row['name']}` shows its "
                             "output)")
    print(f"{key}: Ready at {row.get('endpoint') or '-'}")
    return 0
