"""``flexinfer flash-load``: stage model weights into tmpfs (the Kubernetes init container and a manual tool).

Discovered by ``flexinfer.cli.main``. Configuration comes from the ``FLASH_*`` environment
(``flexinfer.settings.environment``); each flag overrides its variable. Prints a one-line summary on
stdout, per-file failures on stderr, and exits 1 on any failure (errors never show a traceback).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import TYPE_CHECKING, Any

from flexinfer.cli.arguments import byte_quantity, int_at_least
from flexinfer.flashloader import config
from flexinfer.settings import environment

if TYPE_CHECKING:
    from flexinfer.flashloader.report import StageReport

MAX_LISTED = 20


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``flash-load`` and its flags (each mirrors a ``FLASH_*`` variable)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "flash-load", help="copy model weights into tmpfs (incremental, parallel, atomic)",
        description="Stage a model directory into RAM. Flags override the FLASH_* environment variables.",
    )
    parser.add_argument("--src", help="source directory (FLASH_SRC, required)")
    parser.add_argument("--dst", help="destination directory, usually on tmpfs (FLASH_DST, required)")
    parser.add_argument("--concurrency", type=int_at_least(1), help="parallel copy workers (FLASH_CONCURRENCY, 4)")
    parser.add_argument("--buffer-kb", type=int_at_least(1), help="bytes per copy call, in KiB (FLASH_BUFFER_KB, 4096)")
    parser.add_argument(
        "--verify", action=argparse.BooleanOptionalAction, default=None,
        help="compare checksums of unchanged files and verify every expected file (FLASH_VERIFY, off)",
    )
    parser.add_argument(
        "--exclude", action="append", metavar="PREFIX[,PREFIX]",
        help="skip paths with these prefixes; repeatable (FLASH_EXCLUDE; .cache/ and .git/ always)",
    )
    parser.add_argument("--variant", type=str.lower, choices=config.VARIANTS,
                        help="weights variant to prefer: fp16 (FLASH_VARIANT)")
    parser.add_argument(
        "--chunk-mib", type=int_at_least(1), help="split files larger than this into ranges copied in parallel (256)",
    )
    parser.add_argument("--max-rate", type=byte_quantity,
                        help="largest copy rate in bytes per second, e.g. 200Mi (FLASH_MAX_RATE, unlimited)")
    parser.add_argument("--quiet", action="store_true", help="no progress output, only the summary")
    return parser


def overrides(args: argparse.Namespace) -> dict[str, str]:
    """The flags that were given, as ``FLASH_*`` values (so flags and env share one parser)."""
    values: dict[str, str] = {}
    pairs = [
        (config.ENV_SRC, args.src), (config.ENV_DST, args.dst), (config.ENV_CONCURRENCY, args.concurrency),
        (config.ENV_BUFFER_KB, args.buffer_kb), (config.ENV_VARIANT, args.variant),
        (config.ENV_MAX_RATE, args.max_rate),
    ]
    for name, value in pairs:
        if value is not None:
            values[name] = str(value)
    if args.verify is not None:
        values[config.ENV_VERIFY] = "true" if args.verify else "false"
    if args.exclude:
        values[config.ENV_EXCLUDE] = ",".join(args.exclude)
    return values


def run(args: argparse.Namespace) -> int:
    """Stage, print the summary, return 0 only when every file is in place."""
    import asyncio  # the copier: imported to stage, not to build the parser

    from flexinfer.flashloader.progress import make_progress
    from flexinfer.flashloader.staging import stage

    request = config.from_env({**environment(), **overrides(args)})
    settings = request.settings
    if args.chunk_mib:
        settings = dataclasses.replace(settings, chunk_bytes=args.chunk_mib * 1024 * 1024)
    progress = make_progress(sys.stderr, enabled=not args.quiet)
    report = asyncio.run(stage(request.src, request.dst, settings, progress))
    print_report(report)
    return 0 if report.ok else 1


def print_report(report: StageReport) -> None:
    """Summary on stdout; ignored entries (a few) and every failure on stderr."""
    print(f"flash-load: {report.summary()}", flush=True)
    for issue in report.ignored[:MAX_LISTED]:
        print(f"flash-load: ignored {issue}", file=sys.stderr)
    if len(report.ignored) > MAX_LISTED:
        print(f"flash-load: ... and {len(report.ignored) - MAX_LISTED} more ignored", file=sys.stderr)
    for issue in report.failures:
        print(f"error: {issue}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """``python -m flexinfer.cli.flash_load``: the same command, parsed without discovering the others.

    ``flexinfer flash-load`` imports no other subcommand either (``flexinfer.cli.main`` builds only the
    requested parser, and no subcommand imports its implementation before it runs); this entry point only
    skips the discovery of the package's modules.
    """
    from flexinfer.cli.main import report
    from flexinfer.core.errors import FlexInferError

    parser = argparse.ArgumentParser(prog="flexinfer")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["flash-load", *(sys.argv[1:] if argv is None else argv)])
    try:
        return run(args)
    except FlexInferError as error:
        report(error)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
