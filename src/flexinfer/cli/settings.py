"""``flexinfer settings [--markdown] [--chart DIR]``: every environment variable, flag and Helm value with its
default, so operators can see the whole configuration before a rollout. ``docs/CONFIGURATION.md`` is this
command's ``--markdown --chart charts/flexinfer`` output (a test keeps them equal). ``--models`` prints the
Model/ModelCache field reference instead (``docs/reference/models.md``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from flexinfer.core.errors import ConfigError


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "settings", help="list every environment variable, flag and Helm value with its default",
        description="List every environment variable, command-line flag and (with --chart) Helm value "
                    "with its default.",
    )
    parser.add_argument("--markdown", action="store_true", help="print the Markdown reference (docs/CONFIGURATION.md)")
    parser.add_argument("--chart", metavar="DIR", help="also list the Helm values of this chart directory")
    parser.add_argument("--models", action="store_true",
                        help="print the Model/ModelCache field reference instead (docs/reference/models.md)")
    return parser


def command_parsers(names: list[str]) -> dict[str, argparse.ArgumentParser]:
    """The argument parser of each named ``flexinfer`` subcommand."""
    from flexinfer.cli.main import build_parser

    parsers: dict[str, argparse.ArgumentParser] = {}
    for name in names:
        for action in build_parser(name)._actions:  # argparse offers no public accessor for subparsers
            if isinstance(action, argparse._SubParsersAction) and name in action.choices:
                parsers[name] = action.choices[name]
    return parsers


def run(args: argparse.Namespace) -> int:
    from flexinfer.assembly.reference import COMPONENTS, reference_text, render_markdown

    if args.models:
        from flexinfer.assembly.model_reference import render_markdown as model_reference

        print(model_reference(), end="")
        return 0
    values = None
    if args.chart:
        values = Path(args.chart) / "values.yaml"
        if not values.is_file():
            raise ConfigError(f"--chart {args.chart}: no values.yaml in that directory")
    commands = [component.command for component in COMPONENTS]
    text = render_markdown(command_parsers(commands), values) if args.markdown else reference_text(commands, values)
    print(text, end="")
    return 0
