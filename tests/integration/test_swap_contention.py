"""Swaps under contention, as a user sees them: ``flexinfer serve`` with four real llama.cpp servers in one GPU
group, a seeded storm from the official ``openai`` client (plain requests, streams, streams dropped mid-way,
requests abandoned), at most N at once, one fixed budget.

Checked: every request ends within its budget with a complete answer or an OpenAI error (none hangs, none is
truncated, no bare error); the group never sits with a Ready, idle model past ``min_hold`` while another member
has requests waiting (sampled from ``/admin/status``); no model is preempted sooner than ``min_hold`` after it
became Ready unless the winner was starving (from the JSON lifecycle lines). A failure prints its seed: set
``FLEXINFER_STORM_SEED`` to replay it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from support.llama_server import needs_llama_server
from support.local_serve import ServeProcess, serve_env
from support.storm import STORM_MODELS, Storm, plan_storm, run_storm, storm_manifests

pytestmark = [pytest.mark.integration, needs_llama_server]

MIN_HOLD, MAX_WAIT, BUDGET = 2.0, 8.0, 25.0
SLACK = 1.0
"""How far a sampled observation may lag the arbiter (status polls, log lines, a stop in progress)."""


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeProcess]:
    manifests = storm_manifests(tmp_path)
    env = serve_env(tmp_path / "state", FLEXINFER_SWAP_MIN_HOLD=f"{MIN_HOLD}s", FLEXINFER_SWAP_MAX_WAIT=f"{MAX_WAIT}s",
                    FLEXINFER_DRAIN_TIMEOUT="5s", PROXY_COLD_START_TIMEOUT=f"{BUDGET - 5}s",
                    PROXY_QUEUE_TIMEOUT=f"{BUDGET - 5}s")
    process = ServeProcess.start(manifests, env, extra=("--log-format", "json", "--no-access-log"))
    yield process
    process.stop()


@dataclass
class Idle:
    """One status sample in which a Ready model sat idle past the hold while others waited."""

    at: float
    holder: str
    ready_for: float
    waiting: list[str]


async def _watch(url: str, stop: asyncio.Event, found: list[Idle]) -> int:
    """Sample ``/admin/status`` until ``stop``; record every stalled-group sample; return the sample count."""
    samples = 0
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            async with session.get(f"{url}/admin/status") as response:
                models: list[dict[str, Any]] = (await response.json())["models"]
            samples += 1
            waiting = [m["name"] for m in models if m["queue_depth"] > 0]
            for m in models:
                idle = m["phase"] == "Ready" and not m["in_flight"] and not m["queue_depth"] and not m["draining"]
                if idle and waiting and (m["ready_for"] or 0.0) > MIN_HOLD + SLACK:
                    found.append(Idle(time.monotonic(), m["name"], m["ready_for"], waiting))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)
    return samples


def _lifecycle(serve: ServeProcess) -> list[dict[str, Any]]:
    lines = []
    for raw in serve.output:
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if isinstance(line, dict) and line.get("event"):
            # ``time`` is the local wall clock with milliseconds, as logging's asctime writes it
            line["ts"] = datetime.strptime(line["time"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            lines.append(line)
    return lines


def _early_preemptions(events: list[dict[str, Any]], storm: Storm, storm_start_wall: float) -> list[str]:
    """Swap decisions that took the GPU from a model Ready for less than ``min_hold`` when no request of the
    winner had waited ``max_wait`` (minus the sampling slack) at that moment."""
    ready_at: dict[str, float] = {}
    bad = []
    for e in events:
        at = e["ts"]
        if e["event"] == "ready":
            ready_at[e["model"]] = at
        elif e["event"] == "swap_decided":
            loser, winner = e["loser"], e["model"]
            held = at - ready_at.get(loser, float("-inf"))
            if held >= MIN_HOLD - 0.05:
                continue
            decided = at - storm_start_wall
            starving = any(o.planned.model == _name(winner) and o.started and o.started <= decided - MAX_WAIT + SLACK
                           and o.ended >= decided for o in storm.outcomes)
            if not starving:
                bad.append(f"{winner} preempted {loser} {held:.2f}s after Ready at storm+{decided:.1f}s")
    return bad


def _name(key: str) -> str:
    return key.split("/", 1)[-1]


async def test_a_seeded_storm_on_one_group_answers_every_request_within_its_budget(serve: ServeProcess) -> None:
    seed = int(os.environ.get("FLEXINFER_STORM_SEED", "23"))
    plan = plan_storm(seed, list(STORM_MODELS), count=70, duration=45.0)
    stop, stalls = asyncio.Event(), []
    watcher = asyncio.ensure_future(_watch(serve.url, stop, stalls))
    wall_start, mono_start = time.time(), time.monotonic()
    try:
        storm = await run_storm(serve.url, plan, concurrency=8, budget=BUDGET)
    finally:
        stop.set()
        samples = await watcher
    for o in storm.outcomes:  # client times, relative to the storm's start (the log's are wall-clock)
        o.started, o.ended = o.started - mono_start, o.ended - mono_start
    where = f"(seed {seed}; replay with FLEXINFER_STORM_SEED={seed})"
    bad = [f"#{o.planned.index} {o.planned.kind} {o.planned.model}: {o.message}" for o in storm.outcomes
           if o.result == "bad"]
    assert not bad, f"requests without a proper end {where}: {bad}"
    assert all(o.seconds <= BUDGET for o in storm.outcomes), where
    assert storm.count("ok") >= len(plan) // 2, f"too few answers {where}: {storm.errors_by_code()}"
    assert samples > 50 and not stalls, f"group idle while others waited {where}: {stalls[:5]}"
    events = _lifecycle(serve)
    swaps = [e for e in events if e["event"] == "swap_decided"]
    assert len(swaps) >= 5, f"the storm must make the group swap {where}"
    early = _early_preemptions(events, storm, wall_start)
    assert not early, f"preempted inside min_hold without a starving winner {where}: {early}"
