# PYTHON_ARGCOMPLETE_OK
"""``flexinfer`` entry point: discovers subcommand modules and maps errors to one line + exit code.

Each module in ``flexinfer.cli`` that defines ``add_parser(subparsers)`` and ``run(args) -> int`` is a
subcommand. Errors: ``FlexInferError`` → its message (one line per problem) on stderr, exit 1;
Ctrl-C → exit 130. Never a traceback for expected failures. Shell completion (``flexinfer completion``) is
answered here, from the full parser, when argcomplete calls back.

Start-up stays short (``--version``, ``ps``, ``load`` … in about 0.1 s, docs/performance.md "CLI start-up";
``tests/unit/cli/test_cli_imports.py`` checks what they import): a subcommand module imports at its top only
what its parser needs and its implementation (the engines, aiohttp, kopf, rich, the pydantic models) inside
``run``; argcomplete is imported only when the shell asks for completions.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

import flexinfer
import flexinfer.cli as cli_package
from flexinfer.api.errors import FlexInferError, InvalidResourceError
from flexinfer.settings import environment


def command_modules() -> dict[str, str]:
    """Subcommand name → module name, found without importing anything (``flash_load`` → ``flash-load``)."""
    return {
        info.name.replace("_", "-"): info.name
        for info in sorted(pkgutil.iter_modules(cli_package.__path__), key=lambda m: m.name)
        if info.name != "main"
    }


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser; with ``only``, just that subcommand is imported (fast start-up for the
    flash-loader init container), otherwise every subcommand (for ``--help``)."""
    parser = argparse.ArgumentParser(
        prog="flexinfer", description="Inference control plane for on-prem GPUs.",
    )
    parser.add_argument("--version", action="version", version=f"flexinfer {flexinfer.__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = command_modules()
    for name, module_name in modules.items():
        if only is not None and name != only:
            continue
        module = importlib.import_module(f"flexinfer.cli.{module_name}")
        if hasattr(module, "add_parser") and hasattr(module, "run"):
            sub = module.add_parser(subparsers)
            sub.set_defaults(handler=module.run)
    return parser


def _requested_command(argv: Sequence[str]) -> str | None:
    first = next((arg for arg in argv if not arg.startswith("-")), None)
    return first if first in command_modules() else None


def report(error: FlexInferError) -> None:
    """Print an error as one line per problem on stderr."""
    if isinstance(error, InvalidResourceError):
        for problem in error.problems:
            print(f"error: {problem}", file=sys.stderr)
    else:
        print(f"error: {error}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    completing = argv is None and "_ARGCOMPLETE" in environment()
    parser = build_parser(None if completing else _requested_command(arguments))
    if completing:
        import argcomplete

        argcomplete.autocomplete(parser)  # answers the shell and exits
    args = parser.parse_args(arguments)
    if getattr(args, "handler", None) is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.handler(args))
    except FlexInferError as error:
        report(error)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
