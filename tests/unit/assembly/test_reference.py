"""The configuration reference shows a real default for every flag and variable (never an empty cell), and the
flash-loader precedence chain with the defaults of its first layer."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from flexinfer.assembly.reference import PRECEDENCE_TITLE, flag_default, render_markdown
from flexinfer.cli.settings import command_parsers
from flexinfer.core.controller_defaults import FLASH_LOADER_ENV_VARS

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


def test_the_reference_states_the_flash_loader_precedence_with_every_default() -> None:
    """The precedence chain (env defaults → matching ModelCache → Model) is in the generated reference, in that
    order, with each DEFAULT_FLASH_LOADER_* variable and its default from the settings table."""
    text = render_markdown({}, None)
    section = text.split(PRECEDENCE_TITLE, 1)[1].split("\n## ", 1)[0]
    markers = ("1. **Environment defaults**", "2. **The matching `ModelCache`**",
               "3. **`Model.spec.cache.flashLoader`**")
    layers = [section.index(marker) for marker in markers]
    assert layers == sorted(layers)
    for var in FLASH_LOADER_ENV_VARS:
        assert f"- `{var.name}`: {f'`{var.default}`' if var.default else 'unset'}" in section, var.name


def test_the_committed_configuration_doc_has_the_precedence() -> None:
    committed = (Path(__file__).resolve().parents[3] / "docs" / "CONFIGURATION.md").read_text(encoding="utf-8")
    assert PRECEDENCE_TITLE in committed
    assert committed.index(PRECEDENCE_TITLE) < committed.index("## Helm values")
