"""``flexinfer logs MODEL [--tail N] [--since 10m] [-f] [--url URL]``: the captured output of a model's server,
from a running ``flexinfer serve`` (kept across restarts and crashes, so a failed start can be diagnosed).
``--since`` keeps the lines written in that last duration; ``-f/--follow`` keeps printing new lines until
Ctrl-C (exit 0, even when the parent left SIGINT ignored or blocked) or until ``serve`` goes away (exit 1). A
model that has not run since ``serve`` started is an error saying so (exit 1), except with ``--follow``, which
waits for its first output."""

from __future__ import annotations

import argparse
import signal
import sys
import time
import urllib.parse
from types import FrameType
from typing import Any

from flexinfer.api.errors import FlexInferError
from flexinfer.cli.admin_client import add_connection_arguments, get_json
from flexinfer.cli.arguments import duration, int_at_least

FOLLOW_POLL_SECONDS = 0.5


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "logs", help="print a model server's output from a running `flexinfer serve`",
        description="Print the last lines a model server wrote (stdout and stderr).",
    )
    parser.add_argument("model", help="model name, alias or namespace/name")
    parser.add_argument("--tail", type=int_at_least(0), default=200, metavar="N", help="lines to show (default 200)")
    parser.add_argument("--since", type=duration, default=None, metavar="DURATION",
                        help="only lines written in this last duration (e.g. 10m, 1h)")
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until Ctrl-C")
    add_connection_arguments(parser)
    return parser


def _window(args: argparse.Namespace, after: int | None) -> dict[str, Any]:
    query = {"tail": str(args.tail)} if after is None else {"after": str(after)}
    if args.since is not None and after is None:
        query["since"] = str(args.since)
    path = "/admin/models/" + urllib.parse.quote(args.model, safe="/") + "/logs"
    return dict(get_json(args, path, query))


def run(args: argparse.Namespace) -> int:
    if args.follow:
        return _follow(args)
    body = _window(args, None)
    if body.get("started") is False:
        raise FlexInferError(f"model {body['model']} has not run since this `flexinfer serve` started, so there is "
                             "no output to show (a request to it starts it; `flexinfer status` shows its phase)")
    if not body["lines"] and args.tail:
        print(f"flexinfer logs: model {body['model']} has written no output yet", file=sys.stderr)
    _write(body["lines"])
    return 0


def _follow(args: argparse.Namespace) -> int:
    """Print the window, then new lines every ``FOLLOW_POLL_SECONDS`` until Ctrl-C (exit 0)."""
    try:
        _end_on_interrupt()
        body = _window(args, None)
        while True:
            _write(body["lines"])
            after = int(body["next"])
            time.sleep(FOLLOW_POLL_SECONDS)
            body = _window(args, after)
    except KeyboardInterrupt:
        return 0
    finally:
        # whatever ends it: a Python handler still installed at exit would be reset to the default by the
        # interpreter's finalization, and a SIGINT arriving then would kill the process (exit -2, not 0 or 1)
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _end_on_interrupt() -> None:
    """Make SIGINT end ``--follow`` whatever the parent left: a job that a non-interactive shell starts with
    ``&`` inherits SIGINT ignored (Python then installs no handler of its own, so nothing would end it), and a
    parent may leave it blocked. The first SIGINT raises ``KeyboardInterrupt``; later ones are ignored, so a
    second Ctrl-C cannot break the exit."""
    signal.signal(signal.SIGINT, _interrupted)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _interrupted(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def _write(lines: list[str]) -> None:
    for line in lines:
        sys.stdout.write(line + "\n")
    sys.stdout.flush()
