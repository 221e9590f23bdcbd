"""Groups that pack by memory against one model at a time, on the real ``llama-server`` through ``flexinfer
serve``, for one seeded request trace.

Five generated GGUF models of different sizes (the tests' own generator, 2 to ~135 MiB each with their KV cache
and buffers) share one group. The trace: requests one after another, the model drawn with a skewed popularity
(weight 1/rank^skew, ``--skew``, default 1.2; the largest model least popular), a short think time between
requests and, now and then, an idle gap of 2-4 s. It is played three times:

- (a) one model at a time (the group without a budget: every change of model is a swap);
- (b) memory-aware, with a budget of about half the models' total need (their GGUF estimates);
- (b') memory-aware with a budget that holds them all (goal: no eviction after each model's first start).

For each it prints the evictions (a: the swaps; b: the members evicted, and how many followed an
out-of-memory start, if any) and the time to first byte of a streamed chat, p50 and p95; and (c) the offline
optimum for the same trace and budget (Belady: on a miss, the residents needed furthest in the future go first,
as few as fit the model), computed from the needs ``flexinfer serve`` measured in (b), with the share of
requests that need a start even then (when it is above 5 %, no policy's p95 can be a resident model's answer).
Goals (issue 27): (b) evicts at most 1.3x the optimum, and its p95 time to first byte is at least 2x better
than (a)'s. Prints a table; asserts nothing. Run:

    PATH=~/.cache/flexinfer/bin:$PATH .venv/bin/python bench/memory_groups.py [--requests 150] [--seed 7] [--skew 1.2]
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from flexinfer.api.model import Model
from flexinfer.local.gguf_estimate import estimate_mib
from support.local_serve import ServeProcess, model_manifest, serve_env, write_manifests
from support.tiny_gguf import Dimensions, write_tiny_gguf

ARGS = ["--ctx-size", "1024", "--threads", "1"]
SIZES = {"m0": Dimensions(), "m1": Dimensions(embd=256, layers=4, ff=768, ctx=1024),
         "m2": Dimensions(embd=384, layers=6, ff=1024, ctx=1024),
         "m3": Dimensions(embd=448, layers=8, ff=1280, ctx=1024),
         "m4": Dimensions(embd=512, layers=8, ff=1536, ctx=1024)}
POPULARITY = ["m2", "m1", "m3", "m0", "m4"]
"""Most popular first: a mid-sized model, then a small one; the largest is asked for least."""


@dataclass(frozen=True)
class Step:
    model: str
    pause: float
    """Seconds before the request is sent (think time, or an idle gap)."""


def trace(seed: int, requests: int, skew: float) -> list[Step]:
    rng = random.Random(seed)
    weights = [1 / (rank + 1) ** skew for rank in range(len(POPULARITY))]
    steps = []
    for _ in range(requests):
        pause = rng.uniform(2.0, 4.0) if rng.random() < 0.08 else rng.uniform(0.0, 0.1)
        steps.append(Step(rng.choices(POPULARITY, weights)[0], pause))
    return steps


def first_byte(url: str, model: str) -> float:
    """Seconds from sending a streamed chat to its first byte of content."""
    parts = urllib.parse.urlsplit(url)
    body = json.dumps({"model": model, "stream": True, "max_tokens": 4, "temperature": 0,
                       "messages": [{"role": "user", "content": "hello"}]})
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=300)
    try:
        started = time.perf_counter()
        connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise RuntimeError(f"{model}: {response.status} {response.read()[:300]!r}")
        while not response.readline().startswith(b"data:"):  # keep-alive comments come while it waits
            pass
        elapsed = time.perf_counter() - started
        response.read()
        return elapsed
    finally:
        connection.close()


def fetch(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    return json.loads(text) if text.startswith("{") else text


def counter(metrics: str, name: str, having: str = "") -> float:
    """The sum of ``name``'s samples (those whose labels contain ``having``)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith(name + "{") and having in line)


def play(workdir: Path, documents: list[dict[str, Any]], steps: Sequence[Step],
         budget: float | None) -> tuple[int, list[float], dict[str, float]]:
    """(evictions, time to first byte per request, measured need per model) for one run."""
    manifests = write_manifests(workdir / "models" / "models.yaml", documents).parent
    extra = ["--no-access-log", *(["--group-memory", f"g={budget:.2f}"] if budget else [])]
    process = ServeProcess.start(manifests, serve_env(workdir / f"state-{budget}"), extra=extra)
    try:
        times = []
        for step in steps:
            time.sleep(step.pause)  # the trace's own think time and idle gaps
            times.append(first_byte(process.url, step.model))
        metrics = fetch(process.url + "/metrics")
        name = "flexinfer_sharedgroup_evictions_total" if budget else "flexinfer_sharedgroup_preemptions_total"
        needs = {m["name"]: m["need"]["mib"] for m in fetch(process.url + "/admin/status")["models"] if m["need"]}
        oom = counter(metrics, name, 'reason="out_of_memory"')
        if oom:
            print(f"  {oom:.0f} of the evictions followed an out-of-memory start")
        return int(counter(metrics, name)), times, needs
    finally:
        process.stop()


def belady(steps: Sequence[Step], needs: dict[str, float], budget: float) -> tuple[int, int]:
    """Evictions of the offline optimum: on a miss, the residents used furthest in the future go first until
    the model fits, less any of them the others make unnecessary (the same minimal-set rule as the planner);
    and its misses (requests whose model was not resident, first starts included)."""
    resident: set[str] = set()
    evictions = misses = 0
    for index, step in enumerate(steps):
        if step.model in resident:
            continue
        misses += 1
        later = [s.model for s in steps[index + 1:]]
        order = sorted(resident, key=lambda m: (later.index(m) if m in later else len(later), m), reverse=True)
        deficit = sum(needs[m] for m in resident) + needs[step.model] - budget
        victims: list[str] = []
        for model in order:
            if sum(needs[v] for v in victims) >= deficit:
                break
            victims.append(model)
        for model in reversed(list(victims)):
            if sum(needs[v] for v in victims) - needs[model] >= deficit:
                victims.remove(model)
        resident -= set(victims)
        evictions += len(victims)
        resident.add(step.model)
    return evictions, misses


def row(label: str, evictions: int | str, times: list[float] | None) -> str:
    if not times:
        return f"{label:<44} {evictions!s:>9}"
    ordered = sorted(times)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"{label:<44} {evictions!s:>9} {statistics.median(times) * 1000:9.0f} {p95 * 1000:9.0f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=150)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--skew", type=float, default=1.2)
    args = parser.parse_args()
    steps = trace(args.seed, args.requests, args.skew)
    with tempfile.TemporaryDirectory(prefix="flexinfer-memory-groups-") as tmp:
        workdir = Path(tmp)
        documents = [model_manifest(name, write_tiny_gguf(workdir / name / "model.gguf", seed=i, dims=dims), "g",
                                    {"args": ARGS}) for i, (name, dims) in enumerate(SIZES.items())]
        estimates = {d["metadata"]["name"]: estimate_mib(Model.model_validate(d), workdir) or 0.0 for d in documents}
        half = sum(estimates.values()) / 2
        counts = {name: sum(s.model == name for s in steps) for name in SIZES}
        print(f"{len(steps)} requests, seed {args.seed}, skew {args.skew}; per model (estimated MiB, requests): "
              + ", ".join(f"{n} ({estimates[n]:.0f}, {counts[n]})" for n in SIZES))
        print(f"budget: half = {half:.0f} MiB, all = {sum(estimates.values()) * 1.2:.0f} MiB")
        one = play(workdir, documents, steps, None)
        packed = play(workdir, documents, steps, half)
        roomy = play(workdir, documents, steps, sum(estimates.values()) * 1.2)
        print(f"{'':<44} {'evictions':>9} {'p50 ms':>9} {'p95 ms':>9}")
        print(row("(a) one model at a time", one[0], one[1]))
        print(row("(b) memory-aware, half budget", packed[0], packed[1]))
        optimum, misses = belady(steps, packed[2], half)
        print(row("(c) offline optimum (Belady), half budget", optimum, None))
        print(row("(b') memory-aware, everything fits", roomy[0], roomy[1]))
        print("measured needs (MiB): " + ", ".join(f"{n} {packed[2].get(n, 0):.1f}" for n in SIZES))
        print(f"requests that need a start even at the optimum (first starts included): {misses} of {len(steps)} "
              f"({100 * misses / len(steps):.1f} %); above 5 % every policy's p95 is a start")
    return 0


if __name__ == "__main__":
    sys.exit(main())
