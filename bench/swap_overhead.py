"""Swap overhead of ``flexinfer serve``: control-plane time added to a model swap on a shared GPU group.

Two models A and B share one group; both run the scripted fake OpenAI server (``support.fake_openai``'s
application) behind a start-up delay. With A Ready and idle, a streaming request for B is timed from send
(t0) to B's first response byte (t1). B's server logs when its process was spawned (``SPAWN``, printed by
``sh`` before Python even starts) and when it began listening (``LISTENING``), so its own start-up time
S = listening - spawn is known for every swap, and

    overhead = (spawn - t0)  [queue, swap decision, drain + stop A, port, spawn]
             + (t1 - listening)  [readiness probing (2 ms → 25 ms backoff), forwarding, first byte]

Then the roles alternate. Target: overhead ≤ 50 ms. Run:

    .venv/bin/python bench/swap_overhead.py [--startup-delay 0.5] [--rounds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.local_serve import ServeProcess, model_manifest, serve_env, write_manifests

TARGET_MS = 50.0
SPAWN_WRAPPER = 'echo "SPAWN $(date +%s.%N)"; exec "$0" "$@"'


async def serve_fake(port: int, delay: float) -> None:
    """The ``--role server`` process: wait ``delay``, listen, print ``LISTENING <time>``."""
    from aiohttp import web

    from support.fake_openai import FakeOpenAI, Script

    await asyncio.sleep(delay)
    runner = web.AppRunner(FakeOpenAI(Script(chunks=2)).app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print(f"LISTENING {time.time():.6f}", flush=True)
    await asyncio.Event().wait()


def server_command(delay: float) -> list[str]:
    """``spec.config.command``: the spawn-stamping wrapper around this script's server role."""
    return ["sh", "-c", SPAWN_WRAPPER, sys.executable, str(Path(__file__).resolve()), "--role", "server",
            "--port", "{port}", "--startup-delay", str(delay)]


async def first_byte(session: aiohttp.ClientSession, url: str, model: str) -> tuple[float, float]:
    """Wall-clock (send, first body byte) of a streaming chat for ``model`` (the rest is read and dropped)."""
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": "x"}]}
    sent = time.time()
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        assert response.status == 200, await response.text()
        while True:
            chunk = await response.content.readany()
            assert chunk, "empty response"
            if not chunk.startswith(b":"):  # `: loading` SSE comments are not the model's bytes
                break
        arrived = time.time()
        await response.read()
    return sent, arrived


async def stamps(session: aiohttp.ClientSession, url: str, model: str) -> tuple[float, float]:
    """The last (SPAWN, LISTENING) times in ``model``'s captured server output."""
    async with session.get(f"{url}/admin/logs/{model}", params={"tail": "50"}) as response:
        lines = (await response.json())["lines"]
    spawn = [float(line.split()[1]) for line in lines if line.startswith("SPAWN ")]
    listening = [float(line.split()[1]) for line in lines if line.startswith("LISTENING ")]
    return spawn[-1], listening[-1]


async def swaps(url: str, rounds: int) -> list[tuple[float, float, float]]:
    """(before spawn, server start-up S, after listening) in seconds, per measured swap."""
    async with aiohttp.ClientSession() as session:
        await first_byte(session, url, "model-a")  # A's cold start (not measured)
        samples = []
        for index in range(rounds):
            model = "model-b" if index % 2 == 0 else "model-a"
            sent, arrived = await first_byte(session, url, model)
            spawn, listening = await stamps(session, url, model)
            assert sent < spawn < listening < arrived, (sent, spawn, listening, arrived)
            samples.append((spawn - sent, listening - spawn, arrived - listening))
        return samples


def describe(label: str, values_ms: list[float]) -> str:
    ordered = sorted(values_ms)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return (f"{label:<44} median {statistics.median(ordered):7.1f} ms   p90 {p90:7.1f} ms   "
            f"min {ordered[0]:7.1f}   max {ordered[-1]:7.1f}")


def report(delay: float, samples: list[tuple[float, float, float]]) -> None:
    before = [s[0] * 1000 for s in samples]
    startup = [s[1] * 1000 for s in samples]
    after = [s[2] * 1000 for s in samples]
    overhead = [b + a for b, a in zip(before, after, strict=True)]
    print(f"swap overhead of flexinfer serve: {len(samples)} swaps, fake server start-up delay {delay}s")
    print(describe("request -> B spawned (decision, drain+stop A)", before))
    print(describe("B spawned -> B listening (S, not counted)", startup))
    print(describe("B listening -> first byte (probe, forward)", after))
    print(describe("overhead (total - S)", overhead))
    median = statistics.median(overhead)
    print(f"median overhead {median:.1f} ms: {'meets' if median <= TARGET_MS else 'MISSES'} the "
          f"{TARGET_MS:.0f} ms target")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--startup-delay", type=float, default=0.5, help="the fake server's scripted delay (s)")
    parser.add_argument("--rounds", type=int, default=10, help="measured swaps")
    parser.add_argument("--role", choices=("bench", "server"), default="bench", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "server":
        asyncio.run(serve_fake(args.port, args.startup_delay))
        return 0
    with tempfile.TemporaryDirectory(prefix="flexinfer-swap-bench-") as tmp:
        root = Path(tmp)
        weights = root / "weights.bin"
        weights.write_bytes(b"w")
        command = server_command(args.startup_delay)
        docs = [model_manifest(name, weights, "bench", {"command": command}) for name in ("model-a", "model-b")]
        serve = ServeProcess.start(write_manifests(root / "models" / "m.yaml", docs).parent, serve_env(root / "state"))
        try:
            samples = asyncio.run(swaps(serve.url, args.rounds))
        finally:
            serve.stop()
    report(args.startup_delay, samples)
    return 0


if __name__ == "__main__":
    sys.exit(main())
