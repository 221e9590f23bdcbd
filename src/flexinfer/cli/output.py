"""``-o/--output`` for the commands that print objects (``status``/``ps``, ``render``, ``validate``): ``json``,
``yaml``, and for tables ``wide``; and the console tables are printed on, which never truncates or wraps a
name when the output is not a terminal (a pipe, a file): ``grep``/``awk`` see whole rows.

rich and PyYAML are imported when something is printed, not when the option is added: every subcommand's
parser is built for ``flexinfer --help`` and shell completion, which must start fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

UNLIMITED_WIDTH = 100_000


def add_output_argument(parser: argparse.ArgumentParser, choices: tuple[str, ...], default: str,
                        meaning: str) -> None:
    """``-o/--output {choices}``."""
    parser.add_argument("-o", "--output", choices=choices, default=default,
                        help=f"output format: {', '.join(choices)} (default {default}); {meaning}")


def console() -> Console:
    """A console for stdout: the terminal's width on a terminal, unlimited (and no colour) otherwise."""
    from rich.console import Console

    if sys.stdout.isatty():
        return Console()
    return Console(width=UNLIMITED_WIDTH, no_color=True, highlight=False)


def print_table(table: Table) -> None:
    """``table`` on stdout: fitted to a terminal; otherwise at full width, without colour or trailing blanks."""
    from rich.console import Console

    if sys.stdout.isatty():
        Console().print(table)
        return
    plain = Console(width=UNLIMITED_WIDTH, no_color=True, highlight=False)
    with plain.capture() as captured:
        plain.print(table)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


def print_data(data: Any, fmt: str) -> None:
    """``data`` as indented JSON or as YAML (one document) on stdout."""
    if fmt == "json":
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        import yaml

        sys.stdout.write(yaml.safe_dump(data, sort_keys=False, width=UNLIMITED_WIDTH))
