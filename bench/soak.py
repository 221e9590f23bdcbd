"""Soak: the contention test's request mix for a long time on the local engine, with figures per window.

``flexinfer serve`` runs four tiny llama.cpp models (generated GGUFs) in one GPU group; a seeded storm from the
official ``openai`` client (plain requests, streams, streams dropped mid-way, requests abandoned; at most
``--concurrency`` at once) runs window after window (each window its own seed: ``--seed`` + window number, so
a window replays). After each window it prints one table row: requests, answers, errors by code, requests
without a proper end (``bad``: must stay 0), p50/p95 of the proxy's queue wait of the requests it forwarded
(from the JSON access lines), swaps decided, and ``serve``'s resident memory, open file descriptors and
event-loop tasks (``flexinfer_proxy_event_loop_tasks``). Last, the growth of RSS and descriptors from the first
row after ``--warmup`` to the end (goal: at most 5 %).

    python bench/soak.py                          # one hour, 5-minute windows (docs/performance.md)
    python bench/soak.py --duration 600 --window 60

The window loop, the table and the growth line (``soak``, ``Target``, ``Figures``) are shared with
``bench/realnode_soak.py``, the same soak against the in-cluster proxy on the real node.
Not part of the test suite: it prints figures, it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.local_serve import ServeProcess, serve_env
from support.storm import STORM_MODELS, Storm, plan_storm, run_storm, storm_manifests


@dataclass
class Figures:
    """What a target reports for one window (since its previous report)."""

    waits: list[float]
    """Queue waits of the requests forwarded since the last report, seconds (``granted_waits``)."""
    swaps: int
    processes: list[tuple[float, int]]
    """Resident memory (MiB) and open file descriptors of each watched process, in ``Target.processes`` order."""
    tasks: float
    """The proxy's ``flexinfer_proxy_event_loop_tasks``."""


class Target(Protocol):
    """An endpoint under soak and the probes of its processes."""

    url: str
    processes: tuple[str, ...]
    """The watched processes' names, for the table's header and the growth line."""

    def figures(self) -> Figures: ...


@dataclass
class Row:
    """One window's figures."""

    minute: float
    storm: Storm
    figures: Figures

    def cells(self) -> list[str]:
        waits = sorted(self.figures.waits)
        p50 = statistics.median(waits) if waits else 0.0
        p95 = waits[min(len(waits) - 1, int(0.95 * len(waits)))] if waits else 0.0
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(self.storm.errors_by_code().items())) or "—"
        processes = [cell for rss, fds in self.figures.processes for cell in (f"{rss:.1f}", str(fds))]
        return [f"{self.minute:.0f}", str(len(self.storm.outcomes)), str(self.storm.count("ok")),
                str(self.storm.count("cancelled")), errors, str(self.storm.count("bad")), f"{p50:.2f} / {p95:.2f}",
                str(self.figures.swaps), *processes, f"{self.figures.tasks:.0f}"]


def header(processes: Sequence[str]) -> list[str]:
    """The table's columns; with one watched process its descriptors column is just ``fds``."""
    watched = [cell for name in processes
               for cell in (f"{name} RSS MiB", "fds" if len(processes) == 1 else f"{name} fds")]
    return ["min", "requests", "answered", "dropped by client", "errors (status code)", "bad", "wait p50 / p95 s",
            "swaps", *watched, "tasks"]


def process_figures(pid: int) -> tuple[float, int]:
    """Resident memory (MiB) and open file descriptors of process ``pid`` (``/proc``)."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kib = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    return rss_kib / 1024, len(list(Path(f"/proc/{pid}/fd").iterdir()))


def metric_samples(url: str) -> list[tuple[str, dict[str, str], float]]:
    """``(name, labels, value)`` of each sample of the Prometheus text exposition at ``url``."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]


def event_loop_tasks(url: str) -> float:
    """The proxy's ``flexinfer_proxy_event_loop_tasks`` (``url``: its base URL)."""
    return next(value for name, _, value in metric_samples(f"{url}/metrics")
                if name == "flexinfer_proxy_event_loop_tasks")


def granted_waits(lines: Sequence[dict[str, Any]]) -> list[float]:
    """The queue waits (``queue_wait_s``) of the access lines of requests that reached their model server (an
    ``upstream_s``): a request that ended before its grant (an error, its client gone) logs no wait of its own."""
    return [float(line["queue_wait_s"]) for line in lines if line.get("upstream_s") is not None]


def json_lines(raw_lines: Sequence[str]) -> list[dict[str, Any]]:
    """The lines that are JSON objects (log lines in ``--log-format json``), parsed."""
    out = []
    for raw in raw_lines:
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if isinstance(line, dict):
            out.append(line)
    return out


class LocalServe:
    """``flexinfer serve`` on the storm's models, with the swap knobs of the contention test."""

    processes = ("serve",)

    def __init__(self, workdir: Path) -> None:
        env = serve_env(workdir / "state", FLEXINFER_SWAP_MIN_HOLD="2s", FLEXINFER_SWAP_MAX_WAIT="8s",
                        FLEXINFER_DRAIN_TIMEOUT="5s", PROXY_COLD_START_TIMEOUT="20s", PROXY_QUEUE_TIMEOUT="20s")
        self.serve = ServeProcess.start(storm_manifests(workdir), env, extra=("--log-format", "json"))
        self.url = self.serve.url
        self._seen = 0

    def figures(self) -> Figures:
        end = len(self.serve.output)
        lines, self._seen = json_lines(self.serve.output[self._seen:end]), end
        waits = granted_waits(lines)
        swaps = sum(line.get("event") == "swap_decided" for line in lines)
        return Figures(waits, swaps, [process_figures(self.serve.proc.pid)], event_loop_tasks(self.url))

    def stop(self) -> None:
        self.serve.stop()


def _growth(first: float, last: float) -> str:
    return f"{(last - first) / first * 100:+.1f} %" if first else "n/a"


def growth_line(rows: Sequence[Row], processes: Sequence[str], warmup: float) -> str:
    """RSS and descriptors from the first row after ``warmup`` seconds to the last, tasks, bad requests."""
    steady = [r for r in rows if r.minute >= warmup / 60] or list(rows)
    first, last = steady[0].figures, rows[-1].figures
    parts = []
    for i, name in enumerate(processes):
        prefix = "" if len(processes) == 1 else f"{name} "
        parts.append(f"{prefix}RSS {_growth(first.processes[i][0], last.processes[i][0])}, "
                     f"{prefix}fds {_growth(first.processes[i][1], last.processes[i][1])}")
    return (f"after {warmup / 60:.0f} min: {', '.join(parts)}, tasks {first.tasks:.0f} -> {last.tasks:.0f}; "
            f"bad requests: {sum(r.storm.count('bad') for r in rows)} of {sum(len(r.storm.outcomes) for r in rows)}")


async def soak(target: Target, args: argparse.Namespace) -> list[Row]:
    """Storm windows against ``target`` for ``args.duration`` seconds, one printed row each, then the growth."""
    columns = header(target.processes)
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    rows: list[Row] = []
    start = time.monotonic()
    window = 0
    while time.monotonic() - start < args.duration:
        plan = plan_storm(args.seed + window, list(args.models), args.requests, args.window)
        storm = await run_storm(target.url, plan, concurrency=args.concurrency, budget=args.budget)
        row = Row((time.monotonic() - start) / 60, storm, target.figures())
        rows.append(row)
        print("| " + " | ".join(row.cells()) + " |", flush=True)
        window += 1
    print("\n" + growth_line(rows, target.processes, args.warmup), flush=True)
    return rows


def arguments(description: str, *, requests: int, concurrency: int, budget: float) -> argparse.ArgumentParser:
    """The soak's options (shared with ``bench/realnode_soak.py``, which has other load defaults)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--duration", type=float, default=3600.0, help="seconds to run (3600)")
    parser.add_argument("--window", type=float, default=300.0, help="seconds per row (300)")
    parser.add_argument("--requests", type=int, default=requests, help=f"requests per window ({requests})")
    parser.add_argument("--concurrency", type=int, default=concurrency,
                        help=f"requests at once at most ({concurrency})")
    parser.add_argument("--budget", type=float, default=budget,
                        help=f"a request's client-side budget, s ({budget:g})")
    parser.add_argument("--warmup", type=float, default=600.0, help="growth is measured after this, s (600)")
    parser.add_argument("--seed", type=int, default=23)
    parser.set_defaults(models=tuple(STORM_MODELS))
    return parser


async def _local(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="flexinfer-soak-") as tmp:
        target = LocalServe(Path(tmp))
        try:
            await soak(target, args)
        finally:
            target.stop()


def main() -> None:
    parser = arguments(__doc__.split("\n\n")[0], requests=600, concurrency=12, budget=25.0)
    asyncio.run(_local(parser.parse_args()))


if __name__ == "__main__":
    main()
