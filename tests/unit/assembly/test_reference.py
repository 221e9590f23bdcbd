"""The configuration reference shows a real default for every flag and variable (never an empty cell)."""

from __future__ import annotations

import argparse
import re

from flexinfer.assembly.reference import flag_default, render_markdown
from flexinfer.cli.settings import command_parsers

ROW = re.compile(r"^\| `([^`]+)` \| (.*?) \| .* \|$")


def test_no_flag_or_variable_row_has_an_empty_default() -> None:
    text = render_markdown(command_parsers(["serve", "manager", "proxy", "flash-load"]), None)
    rows = [ROW.match(line) for line in text.splitlines()]
    empty = [m.group(1) for m in rows if m is not None and not m.group(2).strip()]
    assert [m for m in rows if m], "no table rows parsed"
    assert empty == [], f"rows without a default: {empty}"


def test_a_flag_that_falls_back_to_an_environment_variable_shows_its_default() -> None:
    parser = argparse.ArgumentParser()
    action = parser.add_argument("--concurrency", type=int, help="parallel copy workers (FLASH_CONCURRENCY, 4)")
    assert flag_default(action, action.help or "") == "`4` (from `FLASH_CONCURRENCY`)"
    leader = parser.add_argument("--leader-elect", action=argparse.BooleanOptionalAction, default=None,
                                 help="hold the Lease in POD_NAMESPACE before acting (env LEADER_ELECT)")
    assert flag_default(leader, leader.help or "") == "`false` (from `LEADER_ELECT`)"


def test_required_and_described_defaults() -> None:
    parser = argparse.ArgumentParser()
    required = parser.add_argument("-f", required=True, help="manifests")
    assert flag_default(required, "manifests") == "required"
    described = parser.add_argument("--namespace", action="append", default=[],
                                    help="watch only this namespace (default: all namespaces)")
    assert flag_default(described, described.help or "") == "all namespaces"
