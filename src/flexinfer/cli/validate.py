"""``flexinfer validate -f FILE|DIR … [--offline]``: check manifests without applying anything.

Prints ``ok: N resources`` or one ``error: <file>:<line>:<column>: <field>: <problem>`` line per problem (exit 1,
through ``flexinfer.cli.main``). It runs every check ``serve`` and ``render`` run, through the same code
(``flexinfer.api.load_manifests`` and ``flexinfer.local.validation.check_manifests``): the schema and cross-field
rules, duplicate names (both places named), ``spec.config`` shapes and durations, runtime profiles, colliding
client-facing names, and for ``file://`` models the weights and an installed backend on this machine — ``--offline``
skips only those machine checks (to validate manifests written for another machine). Relative ``file://`` sources
are resolved against the current directory, as ``serve`` does. ``-f -`` reads standard input; ``kind: List``
documents contribute their items; objects of other kinds (a ConfigMap beside the manifests) are errors naming
file:line:column and kind, or with ``--skip-unknown-kinds`` are reported on stderr and left out. ``-o json|yaml``
prints ``{ok, resources, problems, skipped}`` instead (exit 1 still when there are problems).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flexinfer.api.errors import FieldProblem, InvalidResourceError
from flexinfer.cli.output import add_output_argument, print_data
from flexinfer.settings import environment

if TYPE_CHECKING:
    from flexinfer.api.loading import Manifest


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "validate", help="validate Model/ModelCache/GPULease manifests",
        description="Validate manifests (files or directories of multi-document YAML) with every check `serve` "
                    "and `render` run.",
    )
    add_manifest_arguments(parser)
    add_output_argument(parser, ("text", "json", "yaml"), "text", "json/yaml list resources, problems, skipped")
    parser.add_argument("--offline", action="store_true",
                        help="skip the checks against this machine (file:// weights present, backend installed)")
    return parser


def add_manifest_arguments(parser: argparse.ArgumentParser) -> None:
    """``-f/--filename`` (repeatable, ``-`` = stdin) and ``--skip-unknown-kinds`` (also used by ``render``)."""
    parser.add_argument("-f", "--filename", action="append", required=True, metavar="FILE|DIR|-",
                        help="manifest file or directory, - for standard input (repeatable)")
    parser.add_argument("--skip-unknown-kinds", action="store_true",
                        help="leave out objects of other kinds (e.g. ConfigMaps) with a note on stderr "
                             "instead of failing")


def load(args: argparse.Namespace) -> tuple[list[Manifest], list[FieldProblem]]:
    """The manifests the arguments name, and the objects skipped (reported on stderr)."""
    from flexinfer.api.loading import load_manifests  # the resource types: for a run, not for ``--help``

    skipped: list[FieldProblem] | None = [] if args.skip_unknown_kinds else None
    try:
        manifests = load_manifests(args.filename, skipped)
    finally:
        for problem in skipped or []:
            print(f"skipped: {problem}", file=sys.stderr)
    return manifests, skipped or []


def run(args: argparse.Namespace) -> int:
    from flexinfer.local.profiles import SystemAvailability
    from flexinfer.local.validation import check_manifests

    manifests, skipped = load(args)
    installed = None if args.offline else SystemAvailability(path=environment().get("PATH"))
    problems = check_manifests(manifests, installed, Path.cwd())
    if args.output != "text":
        print_data({"ok": not problems, "resources": [_resource(m) for m in manifests],
                    "problems": [str(p) for p in problems], "skipped": [str(p) for p in skipped]}, args.output)
        return 1 if problems else 0
    if problems:
        raise InvalidResourceError(problems)
    print(f"ok: {len(manifests)} resources")
    return 0


def _resource(manifest: Manifest) -> dict[str, Any]:
    meta = manifest.resource.metadata
    return {"kind": manifest.resource.kind, "namespace": meta.namespace, "name": meta.name,
            "source": manifest.where()}
