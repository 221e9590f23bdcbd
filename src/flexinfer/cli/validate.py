"""``flexinfer validate -f FILE|DIR … [--offline]``: check manifests without applying anything.

Prints ``ok: N resources`` or one ``error: <file>:<line>: <problem>`` line per problem (exit 1, through
``flexinfer.cli.main``). It runs every check ``serve`` and ``render`` run, through the same code
(``flexinfer.api.load_manifests`` and ``flexinfer.local.validation.check_manifests``): the schema and
cross-field rules, duplicate names (both places named), ``spec.config`` shapes and durations, runtime
profiles, colliding client-facing names, and for ``file://`` models the weights and an installed backend on
this machine — ``--offline`` skips only those machine checks (to validate manifests written for another
machine). Relative ``file://`` sources are resolved against the current directory, as ``serve`` does.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from flexinfer.api.errors import InvalidResourceError
from flexinfer.api.loading import load_manifests
from flexinfer.local.profiles import SystemAvailability
from flexinfer.local.validation import check_manifests
from flexinfer.settings import environment


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "validate", help="validate Model/ModelCache/GPULease manifests",
        description="Validate manifests (files or directories of multi-document YAML) with every check `serve` "
                    "and `render` run.",
    )
    parser.add_argument("-f", "--filename", action="append", required=True, metavar="FILE|DIR",
                        help="manifest file or directory (repeatable)")
    parser.add_argument("--offline", action="store_true",
                        help="skip the checks against this machine (file:// weights present, backend installed)")
    return parser


def run(args: argparse.Namespace) -> int:
    manifests = load_manifests(args.filename)
    installed = None if args.offline else SystemAvailability(path=environment().get("PATH"))
    problems = check_manifests(manifests, installed, Path.cwd())
    if problems:
        raise InvalidResourceError(problems)
    print(f"ok: {len(manifests)} resources")
    return 0
