"""Soak: the contention test's request mix for a long time on the local engine, with figures per window.

``flexinfer serve`` runs four tiny llama.cpp models (generated GGUFs) in one GPU group; a seeded storm from the
official ``openai`` client (plain requests, streams, streams dropped mid-way, requests abandoned; at most
``--concurrency`` at once) runs window after window (each window its own seed: ``--seed`` + window number, so
a window replays). After each window it prints one table row: requests, answers, errors by code, requests
without a proper end (``bad``: must stay 0), p50/p95 of the proxy's queue wait (from the JSON access lines),
swaps decided, and ``serve``'s resident memory, open file descriptors and event-loop tasks
(``flexinfer_proxy_event_loop_tasks``). Last, the growth of RSS and descriptors from the first row after
``--warmup`` to the end (goal: at most 5 %).

    python bench/soak.py                          # one hour, 5-minute windows (docs/performance.md)
    python bench/soak.py --duration 600 --window 60

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.local_serve import ServeProcess, serve_env
from support.storm import STORM_MODELS, Storm, plan_storm, run_storm, storm_manifests


@dataclass
class Row:
    """One window's figures."""

    minute: float
    storm: Storm
    waits: list[float]
    swaps: int
    rss_mib: float
    fds: int
    tasks: float

    def cells(self) -> list[str]:
        waits = sorted(self.waits)
        p50 = statistics.median(waits) if waits else 0.0
        p95 = waits[min(len(waits) - 1, int(0.95 * len(waits)))] if waits else 0.0
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(self.storm.errors_by_code().items())) or "—"
        return [f"{self.minute:.0f}", str(len(self.storm.outcomes)), str(self.storm.count("ok")),
                str(self.storm.count("cancelled")), errors, str(self.storm.count("bad")), f"{p50:.2f} / {p95:.2f}",
                str(self.swaps), f"{self.rss_mib:.1f}", str(self.fds), f"{self.tasks:.0f}"]


HEADER = ["min", "requests", "answered", "dropped by client", "errors (status code)", "bad", "wait p50 / p95 s",
          "swaps", "serve RSS MiB", "fds", "tasks"]


def _serve(workdir: Path) -> ServeProcess:
    manifests = storm_manifests(workdir)
    env = serve_env(workdir / "state", FLEXINFER_SWAP_MIN_HOLD="2s", FLEXINFER_SWAP_MAX_WAIT="8s",
                    FLEXINFER_DRAIN_TIMEOUT="5s", PROXY_COLD_START_TIMEOUT="20s", PROXY_QUEUE_TIMEOUT="20s")
    return ServeProcess.start(manifests, env, extra=("--log-format", "json"))


def _process_figures(pid: int) -> tuple[float, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kib = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    return rss_kib / 1024, len(list(Path(f"/proc/{pid}/fd").iterdir()))


def _tasks(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return next(float(line.split()[-1]) for line in text.splitlines()
                if line.startswith("flexinfer_proxy_event_loop_tasks "))


def _lines(serve: ServeProcess, start: int) -> tuple[list[dict[str, Any]], int]:
    """The JSON lines ``serve`` wrote since line ``start``, and the next start."""
    out, end = [], len(serve.output)
    for raw in serve.output[start:end]:
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if isinstance(line, dict):
            out.append(line)
    return out, end


def _growth(first: float, last: float) -> str:
    return f"{(last - first) / first * 100:+.1f} %" if first else "n/a"


async def soak(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="flexinfer-soak-") as tmp:
        serve = _serve(Path(tmp))
        try:
            print("| " + " | ".join(HEADER) + " |")
            print("|" + "---|" * len(HEADER))
            rows: list[Row] = []
            start, seen = time.monotonic(), 0
            window = 0
            while time.monotonic() - start < args.duration:
                plan = plan_storm(args.seed + window, list(STORM_MODELS), args.requests, args.window)
                storm = await run_storm(serve.url, plan, concurrency=args.concurrency, budget=args.budget)
                lines, seen = _lines(serve, seen)
                waits = [float(line["queue_wait_s"]) for line in lines if "queue_wait_s" in line]
                swaps = sum(line.get("event") == "swap_decided" for line in lines)
                rss, fds = _process_figures(serve.proc.pid)
                row = Row((time.monotonic() - start) / 60, storm, waits, swaps, rss, fds, _tasks(serve.url))
                rows.append(row)
                print("| " + " | ".join(row.cells()) + " |", flush=True)
                window += 1
            steady = [r for r in rows if r.minute >= args.warmup / 60] or rows
            print(f"\nafter {args.warmup / 60:.0f} min: RSS {_growth(steady[0].rss_mib, rows[-1].rss_mib)}, "
                  f"fds {_growth(steady[0].fds, rows[-1].fds)}, tasks {steady[0].tasks:.0f} -> {rows[-1].tasks:.0f}; "
                  f"bad requests: {sum(r.storm.count('bad') for r in rows)} of "
                  f"{sum(len(r.storm.outcomes) for r in rows)}")
        finally:
            serve.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=3600.0, help="seconds to run (3600)")
    parser.add_argument("--window", type=float, default=300.0, help="seconds per row (300)")
    parser.add_argument("--requests", type=int, default=600, help="requests per window (600)")
    parser.add_argument("--concurrency", type=int, default=12, help="requests at once at most (12)")
    parser.add_argument("--budget", type=float, default=25.0, help="a request's client-side budget, s (25)")
    parser.add_argument("--warmup", type=float, default=600.0, help="growth is measured after this, s (600)")
    parser.add_argument("--seed", type=int, default=23)
    asyncio.run(soak(parser.parse_args()))


if __name__ == "__main__":
    main()
