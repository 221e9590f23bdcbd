"""``flexinfer validate -f FILE|DIR …``: check manifests without applying anything.

Prints ``ok: N resources`` or one ``error: <file>[doc i]: <field path>: <problem>`` line per problem
(exit 1, through ``flexinfer.cli.main``). Besides the schema and cross-field rules it resolves each
Model's runtime profile, so an unknown ``spec.config.runtimeProfile`` is reported here, not at rollout.
"""

from __future__ import annotations

import argparse
from typing import Any

from flexinfer.api.errors import FieldProblem, InvalidResourceError
from flexinfer.api.loading import load_paths
from flexinfer.api.model import Model
from flexinfer.core.errors import ConfigError
from flexinfer.core.profiles import runtime_profile


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "validate", help="validate Model/ModelCache/GPULease manifests",
        description="Validate manifests (files or directories of multi-document YAML).",
    )
    parser.add_argument("-f", "--filename", action="append", required=True, metavar="FILE|DIR",
                        help="manifest file or directory (repeatable)")
    return parser


def run(args: argparse.Namespace) -> int:
    resources = load_paths(args.filename)
    problems = []
    for resource in resources:
        if isinstance(resource, Model):
            try:
                runtime_profile(resource)
            except ConfigError as exc:
                problems.append(FieldProblem("", str(exc)))
    if problems:
        raise InvalidResourceError(problems)
    print(f"ok: {len(resources)} resources")
    return 0
