"""``flexinfer completion bash|zsh|fish``: print the shell code that completes ``flexinfer`` commands, flags
and choices (argcomplete). Install with, for example::

    eval "$(flexinfer completion bash)"                                  # ~/.bashrc
    eval "$(flexinfer completion zsh)"                                   # ~/.zshrc
    flexinfer completion fish > ~/.config/fish/completions/flexinfer.fish

The shell calls ``flexinfer`` back with argcomplete's variables set; ``flexinfer.cli.main`` answers from the
full parser.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

SHELLS = ("bash", "zsh", "fish")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "completion", help="print shell completion code (bash, zsh or fish)",
        description="Print the code that makes your shell complete flexinfer commands and flags.",
    )
    parser.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    return parser


def run(args: argparse.Namespace) -> int:
    from argcomplete.shell_integration import shellcode

    sys.stdout.write(shellcode(["flexinfer"], shell=args.shell))
    return 0
