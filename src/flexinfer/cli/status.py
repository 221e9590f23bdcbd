"""``flexinfer status`` / ``flexinfer ps [--url URL] [-o wide|json|yaml]``: the models a running
``flexinfer serve`` knows, read from its admin API: namespace, name, group, phase, active for, queue depth and
the reason of the last failure (``wide`` adds priority, in flight, last swap, pid, endpoint, memory: a
llama.cpp server's measured MiB in all and weights+KV cache+compute buffers, as its log reported them, and
need: what the model takes of its group's memory budget, measured, declared or estimated; ``json``/``yaml``
print the admin API answer). Piped output is never truncated (one whole row per model). Under the table, each
group that packs by memory (budget, used, reserved for loading, evictions) and the manifests' last reload (its
errors when it was rejected)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from flexinfer.api.units import format_duration
from flexinfer.cli.admin_client import add_connection_arguments, get_json
from flexinfer.cli.output import add_output_argument, console, print_data, print_table

if TYPE_CHECKING:
    from rich.table import Table

PHASE_STYLES = {"Ready": "green", "Loading": "yellow", "Pending": "yellow", "Failed": "red", "Preempted": "magenta"}
COLUMNS = ("NAMESPACE", "NAME", "GROUP", "PHASE", "ACTIVE FOR", "QUEUE", "REASON")
WIDE_COLUMNS = ("PRIORITY", "IN FLIGHT", "LAST SWAP", "PID", "ENDPOINT", "MEMORY", "NEED")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "status", aliases=["ps"], help="show the models of a running `flexinfer serve` (alias: ps)",
        description="Show every model of a running `flexinfer serve`: namespace, group, phase, how long it has "
                    "been Ready, queue depth and the last error.",
    )
    add_connection_arguments(parser)
    add_output_argument(parser, ("table", "wide", "json", "yaml"), "table", "wide adds priority, in flight, "
                        "last swap, pid, endpoint and measured memory")
    parser.add_argument("--json", action="store_const", const="json", dest="output", help=argparse.SUPPRESS)
    return parser


def _age(seconds: object) -> str:
    return "-" if seconds is None else format_duration(float(str(seconds)))


def _reason(row: dict[str, Any]) -> str:
    error = row.get("last_error")
    if row["phase"] == "Failed" and error:
        first = str(error).strip().splitlines()[0]
        retry = row.get("retry_in")
        return first + (f" (retry in {_age(retry)})" if retry else "")
    if row.get("draining"):
        return "draining"
    return "-"


def memory_cell(memory: object) -> str:
    """``MiB total (weights+KV+compute)`` of a server's measured memory, ``-`` when none was reported."""
    if not isinstance(memory, dict) or "total_mib" not in memory:
        return "-"
    parts = "+".join(f"{float(memory.get(k) or 0):.1f}" for k in ("model_mib", "kv_mib", "compute_mib"))
    return f"{float(memory['total_mib']):.1f} MiB ({parts})"


def need_cell(need: object) -> str:
    """``512.0 MiB (measured)``: what a model takes of its group's memory budget, ``-`` without a figure."""
    if not isinstance(need, dict) or "mib" not in need:
        return "-"
    return f"{float(need['mib']):.1f} MiB ({need.get('source') or 'unknown'})"


def group_lines(groups: list[dict[str, Any]]) -> list[str]:
    """One line per group that packs by memory, for under the table."""
    lines = []
    for group in groups:
        evicted = ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in (group.get("evictions") or {}).items())
        lines.append(f"memory: group {group['group']}: {float(group['used_mib']):.1f} MiB used + "
                     f"{float(group['reserved_mib']):.1f} MiB loading of {float(group['budget_mib']):.1f} MiB, "
                     f"{len(group.get('models') or [])} running; evictions: {evicted or 'none'}")
    return lines


def status_table(models: list[dict[str, Any]], wide: bool = False) -> Table:
    """The rich table for ``/admin/status`` rows."""
    from rich.table import Table  # imported to print, not to parse arguments

    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in COLUMNS + (WIDE_COLUMNS if wide else ()):
        table.add_column(column, no_wrap=True, overflow="fold")
    for row in models:
        style = PHASE_STYLES.get(str(row["phase"]))
        phase = str(row["phase"])
        cells = [str(row["namespace"]), str(row["name"]), row.get("group") or "-",
                 f"[{style}]{phase}[/]" if style else phase, _age(row.get("ready_for")), str(row["queue_depth"]),
                 _reason(row)]
        if wide:
            swap = row.get("last_swap_age")
            cells += [str(row.get("priority", "-")), str(row["in_flight"]),
                      "-" if swap is None else f"{_age(swap)} ago", str(row.get("pid") or "-"),
                      row.get("endpoint") or "-", memory_cell(row.get("memory")), need_cell(row.get("need"))]
        table.add_row(*cells)
    return table


def run(args: argparse.Namespace) -> int:
    body = get_json(args, "/admin/status")
    if args.output in ("json", "yaml"):
        print_data(body, args.output)
    else:
        print_table(status_table(body["models"], wide=args.output == "wide"))
        for line in group_lines(body.get("groups") or []):
            console().print(line, highlight=False)
        if body.get("config"):
            console().print(config_summary(body["config"]), highlight=False)
    return 0


def config_summary(config: dict[str, Any]) -> str:
    """The manifests' reload state under the table: when the configuration in force was loaded, and the last
    reload's result (a rejected one with its errors, as ``flexinfer validate`` prints them)."""
    from rich.markup import escape

    line = f"config: {config['models']} model(s) loaded at {config['loaded_at']}"
    if config.get("last_reload"):
        line += f"; last reload {config['last_reload']} ({config.get('trigger')}): {config.get('result')}"
    errors = [f"\n  [red]error:[/] {escape(str(e))}" for e in config.get("errors") or []]
    if errors:
        line += ", the previous configuration stays in force" + "".join(errors)
    return line
