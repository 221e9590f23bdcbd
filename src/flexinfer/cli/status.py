"""``flexinfer status [--url URL]``: a table of the models a running ``flexinfer serve`` knows (model, group,
phase, last swap, queue depth, in flight, endpoint), read from its admin API. A model is shown by its name,
or as ``namespace/name`` when several namespaces use that name (as ``/v1/models`` lists it); under it, the
manifests' last reload (its errors when it was rejected)."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from flexinfer.api.units import format_duration
from flexinfer.cli.admin_client import add_connection_arguments, get_json

PHASE_STYLES = {"Ready": "green", "Loading": "yellow", "Pending": "yellow", "Failed": "red", "Preempted": "magenta"}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "status", help="show the models of a running `flexinfer serve`",
        description="Show every model of a running `flexinfer serve`: group, phase, last swap, queue depth, "
                    "endpoint.",
    )
    add_connection_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the raw admin API answer")
    return parser


def status_table(models: list[dict[str, Any]]) -> Table:
    """The rich table for ``/admin/status`` rows."""
    table = Table(box=None, header_style="bold")
    for column in ("MODEL", "GROUP", "PHASE", "LAST SWAP", "QUEUE", "IN FLIGHT", "ENDPOINT"):
        table.add_column(column)
    uses = Counter(str(row["name"]) for row in models)
    for row in models:
        phase = str(row["phase"]) + (" (draining)" if row.get("draining") else "")
        age = row.get("last_swap_age")
        style = PHASE_STYLES.get(str(row["phase"]))
        shown = row["key"] if uses[str(row["name"])] > 1 else row["name"]
        table.add_row(
            str(shown), row.get("group") or "-", f"[{style}]{phase}[/]" if style else phase,
            "-" if age is None else f"{format_duration(float(age))} ago", str(row["queue_depth"]),
            str(row["in_flight"]), row.get("endpoint") or "-",
        )
    return table


def run(args: argparse.Namespace) -> int:
    body = get_json(args, "/admin/status")
    console = Console()
    if args.json:
        console.print_json(data=body)
    else:
        console.print(status_table(body["models"]))
        if body.get("config"):
            console.print(config_summary(body["config"]), highlight=False)
    return 0


def config_summary(config: dict[str, Any]) -> str:
    """The manifests' reload state under the table: when the configuration in force was loaded, and the last
    reload's result (a rejected one with its errors, as ``flexinfer validate`` prints them)."""
    line = f"config: {config['models']} model(s) loaded at {config['loaded_at']}"
    if config.get("last_reload"):
        line += f"; last reload {config['last_reload']} ({config.get('trigger')}): {config.get('result')}"
    errors = [f"\n  [red]error:[/] {escape(str(e))}" for e in config.get("errors") or []]
    if errors:
        line += ", the previous configuration stays in force" + "".join(errors)
    return line
