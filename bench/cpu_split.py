"""Where a proxied request's CPU goes: the kernel, the Python interpreter, and the C libraries under it, for
``flexinfer serve`` and for the floor (``bench/minimal_relay.py``) on the same upstream, with ``perf``.

    python bench/cpu_split.py [--duration 4] [--rounds 3] [--connections 64] [--baseline-src OTHER/src]

Each target takes JSON chat completions from ``wrk`` while ``perf record -e cpu-clock`` samples its process;
the samples are grouped by the shared object they fell in (``perf report --sort dso``) and printed as
microseconds per request, next to the CPU per request read from ``/proc``. Runs are interleaved and the
median round is printed. A row the two targets share (the kernel's TCP work, the event loop, the HTTP parser)
is the machinery; the difference in the interpreter row is the Python that FlexInfer's features run per
request. Needs ``perf`` (``linux-perf``) and ``wrk``; prints figures only, asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import proxy_overhead as bench  # the targets and the wrk runner of the overhead benchmark

GROUPS = (("kernel", r"\[kernel"), ("interpreter", r"libpython|^python"),
          ("event loop", r"uvloop|loop\.cpython|_asyncio"), ("HTTP parser", r"httptools|parser\.cpython"),
          ("C library", r"libc\.|libm\.|vdso"))
"""Rows of the table: a name and the pattern its shared objects match (anything else is ``other C``)."""


def _split(data: Path) -> dict[str, float]:
    """Share of samples per row, from ``perf report``'s per-object percentages."""
    report = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--sort", "dso", "--stdio"],
                            check=True, capture_output=True, text=True).stdout
    shares: dict[str, float] = dict.fromkeys([name for name, _ in GROUPS] + ["other C"], 0.0)
    for match in re.finditer(r"^\s+([\d.]+)%\s+(\S+)", report, re.M):
        share, dso = float(match.group(1)) / 100, match.group(2)
        row = next((name for name, pattern in GROUPS if re.search(pattern, dso)), "other C")
        shares[row] += share
    return shares


def _measure(target: bench.Target, script: Path, connections: int, duration: float,
             directory: Path) -> dict[str, float]:
    """One run: CPU per request (µs) in total and per row."""
    assert target.process is not None
    data = directory / f"{target.name}.perf"
    perf = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-F", "2000", "-p", str(target.process.pid),
                             "-o", str(data), "--", "sleep", str(duration + 1)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    before = target.cpu_seconds()
    row = bench.wrk(target.url + "/v1/chat/completions", script, connections, duration)
    cpu = target.cpu_seconds() - before
    perf.wait()
    total = cpu / row["requests"] * 1e6
    return {"total": total, **{name: share * total for name, share in _split(data).items()}}


def _report(results: dict[str, list[dict[str, float]]]) -> None:
    names = list(results)
    rows = ["total"] + [name for name, _ in GROUPS] + ["other C"]
    print(f"\nCPU per request, µs (median of {len(next(iter(results.values())))} runs)")
    print(f"{'':14}" + "".join(f"{name:>12}" for name in names))
    for row in rows:
        print(f"{row:14}" + "".join(f"{statistics.median(r[row] for r in results[name]):12.1f}" for name in names))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--baseline-src", help="a second serve running another source tree")
    args = parser.parse_args()
    if shutil.which("perf") is None or shutil.which("wrk") is None:
        print("needs perf and wrk on PATH")
        return 2
    with tempfile.TemporaryDirectory(prefix="cpu-split-") as tmp, contextlib.ExitStack() as stack:
        directory = Path(tmp)
        manifests = bench._manifests(directory)
        serve = bench._start_serve("serve", bench.SRC, manifests, directory / "state")
        targets = [bench._start_floor(bench._endpoint(serve, "bench"))]
        if args.baseline_src:
            targets.append(bench._start_serve("baseline", Path(args.baseline_src).resolve(), manifests,
                                              directory / "state-baseline"))
        targets.append(serve)
        for target in targets:
            stack.callback(_stop, target)
        script = bench.SCENARIOS[0].script("bench", directory)
        results: dict[str, list[dict[str, float]]] = {t.name: [] for t in targets}
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
        for _ in range(args.rounds):
            for target in targets:
                results[target.name].append(_measure(target, script, args.connections, args.duration, directory))
        _report(results)
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


def _stop(target: bench.Target) -> None:
    if target.process is not None:
        target.process.terminate()
        target.process.wait(60)


if __name__ == "__main__":
    sys.exit(main())
