"""``flexinfer serve -f DIR|FILE [--host 127.0.0.1] [--port 8080]``: serve Model manifests on this machine.

One OpenAI-compatible endpoint for every model; model servers start on demand as local processes and
models sharing a ``spec.gpu.shared`` group swap on one GPU. Runs ``flexinfer.assembly.run_local`` until
SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
from typing import Any

from flexinfer.cli.arguments import port_number


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "serve", help="serve models on this machine behind one OpenAI-compatible endpoint",
        description="Serve Model manifests on this machine: model servers run as local processes, started on "
                    "demand; models in one spec.gpu.shared group swap on the GPU. Environment: PROXY_* "
                    "(proxy), FLEXINFER_* (local engine, swap policy, tracing).",
    )
    parser.add_argument("-f", "--filename", action="append", required=True, metavar="FILE|DIR",
                        help="Model manifest file or directory (repeatable)")
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    parser.add_argument("--port", type=port_number, default=8080,
                        help="listen port (default 8080; 0 picks a free port)")
    return parser


def run(args: argparse.Namespace) -> int:
    from flexinfer.assembly.local import run_local  # the whole server stack: imported only when serving

    return run_local(args.filename, host=args.host, port=args.port)
