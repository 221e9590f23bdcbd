"""``flexinfer serve -f DIR|FILE [--host H] [--port P] [--no-watch] [--watch-interval S] [--group-memory GROUP=SIZE]
[--admin-token-file PATH] [--log-level L] [--log-format text|json]``: serve Model manifests on this machine.

One OpenAI-compatible endpoint for every model; model servers start on demand as local processes and
models sharing a ``spec.gpu.shared`` group swap on one GPU (or, in a group given a memory budget with
``--group-memory``, run side by side as far as it holds them). Runs ``flexinfer.assembly.run_local`` until
SIGTERM/SIGINT; the manifests are reloaded on SIGHUP and (unless ``--no-watch``) when their files change.
"""

from __future__ import annotations

import argparse
import gc
from pathlib import Path
from typing import Any

from flexinfer.cli.arguments import add_listen_arguments, add_log_arguments, start_logging
from flexinfer.settings import environment


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "serve", help="serve models on this machine behind one OpenAI-compatible endpoint",
        description="Serve Model manifests on this machine: model servers run as local processes, started on "
                    "demand; models in one spec.gpu.shared group swap on the GPU. Environment: PROXY_* "
                    "(proxy), FLEXINFER_* (local engine, swap policy, tracing).",
    )
    parser.add_argument("-f", "--filename", action="append", required=True, metavar="FILE|DIR",
                        help="Model manifest file or directory (repeatable)")
    add_listen_arguments(parser, "127.0.0.1")
    add_log_arguments(parser, access_log=True)
    parser.add_argument("--watch", action=argparse.BooleanOptionalAction, default=True,
                        help="reload the manifests when their files change (default on; SIGHUP always reloads)")
    parser.add_argument("--watch-interval", type=positive_seconds, default=None, metavar="SECONDS",
                        help="how often the manifest files are checked (default 1)")
    parser.add_argument("--group-memory", action="append", default=[], metavar="GROUP=SIZE",
                        help="let a shared GPU group keep as many models running as fit in SIZE (24Gi, MiB, or "
                             "auto: the GPU's memory; CPU-only models: the host's available memory), evicting by "
                             "cost; repeatable")
    parser.add_argument("--admin-token-file", type=Path, default=None, metavar="PATH",
                        help="file holding the admin API's bearer token, read once at start (trailing newline "
                             "stripped); wins over FLEXINFER_ADMIN_TOKEN")
    return parser


def positive_seconds(text: str) -> float:
    """An ``argparse`` type: a number of seconds greater than zero."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds greater than 0, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    # The whole server stack: imported only when serving, with the cyclic collector paused. The imports create
    # only long-lived objects (event_loop.run freezes them anyway): a full collection midway walks them all for
    # nothing (~10 % of serve's time to listen).
    gc.disable()
    try:
        from flexinfer.assembly.local import run_local
        from flexinfer.local.reloading import DEFAULT_WATCH_INTERVAL
        from flexinfer.proxy.listen_config import listen_address
    finally:
        gc.freeze()
        gc.enable()

    env = environment()
    host, port = listen_address(env, host=args.host, port=args.port, default_host="127.0.0.1")
    start_logging(args, env)
    interval = args.watch_interval or DEFAULT_WATCH_INTERVAL
    return run_local(args.filename, host=host, port=port, env=env, watch_interval=interval if args.watch else None,
                     group_memory=args.group_memory, admin_token_file=args.admin_token_file)
