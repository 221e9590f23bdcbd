"""Proxy overhead benchmark: the same minimal upstream loaded with ``wrk`` directly and through the FlexInfer
proxy (an always-ready Activator/Catalog, so only the HTTP edge is measured), for a small JSON answer and a
64-chunk SSE stream, at concurrency 1 and 64. Reports added latency p50/p99 and the throughput ratio, and
LiteLLM's proxy on the same upstream when ``--litellm PATH_TO_LITELLM_BIN`` is given.

    python bench/proxy_overhead.py [--duration 5] [--no-uvloop] [--litellm /tmp/venv/bin/litellm]

Targets: added p50 <= 0.5 ms at c=1; throughput >= 0.5x direct at c=64. Prints figures only.
Internal roles (``--role upstream|proxy``) run the servers as child processes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SSE_CHUNKS = 64
BODY = {"model": "bench", "messages": [{"role": "user", "content": "hi"}]}
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


# ---------------------------------------------------------------- servers (child processes)

def _install_loop(use_uvloop: bool) -> str:
    if use_uvloop:
        try:
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
            return "uvloop"
        except ImportError:
            pass
    return "asyncio"


async def _serve_upstream(port: int) -> None:
    from aiohttp import web

    answer = json.dumps({"id": "x", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}]}).encode()
    chunk = b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok "}}]}\n\n'

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            return web.Response(body=answer, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(SSE_CHUNKS):
            await response.write(chunk)
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
    await asyncio.Event().wait()


async def _serve_proxy(port: int, upstream: str) -> None:
    from flexinfer.proxy.app import ProxyServer, create_app
    from flexinfer.proxy.config import ProxyConfig
    from flexinfer.runtime.ports import Endpoint, Grant, ModelView

    view = ModelView(name="bench", namespace="default", backend="bench", served_model_name="bench-served",
                     phase="Ready")
    endpoint = Endpoint(upstream)

    class Ready:
        async def acquire(self, model: str, timeout: float | None = None, on_wait: object = None) -> Grant:
            return Grant(model, endpoint, lambda: None)

    class OneModel:
        def resolve(self, name: str) -> ModelView | None:
            return view if name == "bench" else None

        def models(self) -> list[ModelView]:
            return [view]

    config = ProxyConfig(shutdown_drain_delay=0)
    server = ProxyServer(create_app(config, Ready(), OneModel()), config)
    await server.start("127.0.0.1", port)
    await asyncio.Event().wait()


# ---------------------------------------------------------------- load generation

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_listening(port: int, process: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server on port {port} exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on port {port} after {timeout}s")


def _lua(stream: bool) -> str:
    body = json.dumps({**BODY, "stream": stream}).replace("'", "\\'")
    script = f"wrk.method = 'POST'\nwrk.body = '{body}'\nwrk.headers['Content-Type'] = 'application/json'\n"
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as handle:
        handle.write(script)
    return handle.name


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    assert match, text
    return float(match.group(1)) * _UNITS[match.group(2)]


def wrk(url: str, script: str, connections: int, duration: float) -> dict[str, float]:
    """Run wrk; return rps, p50 and p99 (ms)."""
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(duration))}s", "--latency", "-s", script, url],
        check=True, capture_output=True, text=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = _ms(re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"rps": rps, "p50": p50, "p99": p99, "non2xx": float(errors.group(1)) if errors else 0.0}


def _spawn(args: list[str]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    return subprocess.Popen([sys.executable, __file__, *args], env=env)


def _litellm(binary: str, upstream: str) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as config:
        config.write("model_list:\n  - model_name: bench\n    litellm_params:\n      model: openai/bench\n"
                     f"      api_base: {upstream}/v1\n      api_key: none\n")
    env = {**os.environ, "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true", "LITELLM_LOG": "ERROR"}
    process = subprocess.Popen([binary, "--config", config.name, "--port", str(port), "--host", "127.0.0.1"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return process, port


def _report(results: dict[tuple[str, str, int], dict[str, float]], targets: list[str]) -> None:
    print(f"\n{'mode':5} {'c':>3} {'target':16} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'+p50 ms':>8} {'+p99 ms':>8} {'ratio':>6}")
    for (mode, target, conns), row in sorted(results.items(), key=lambda kv: (kv[0][0], kv[0][2])):
        base = results[(mode, "direct", conns)]
        print(f"{mode:5} {conns:>3} {target:16} {row['rps']:>9.0f} {row['p50']:>8.3f} {row['p99']:>8.3f} "
              f"{row['p50'] - base['p50']:>8.3f} {row['p99'] - base['p99']:>8.3f} {row['rps'] / base['rps']:>6.2f}"
              + (f"  ({row['non2xx']:.0f} non-2xx)" if row["non2xx"] else ""))
    print(f"\ntargets: added p50 <= 0.5 ms at c=1; throughput ratio >= 0.5 at c=64  (targets: {', '.join(targets)})")


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.role == "upstream":
        _install_loop(not args.no_uvloop)
        asyncio.run(_serve_upstream(args.port))
        return 0
    if args.role == "proxy":
        _install_loop(not args.no_uvloop)
        asyncio.run(_serve_proxy(args.port, args.upstream))
        return 0
    return _orchestrate(args)


def _orchestrate(args: argparse.Namespace) -> int:
    children: list[subprocess.Popen[bytes]] = []
    try:
        up_port = _free_port()
        children.append(_spawn(["--role", "upstream", "--port", str(up_port)]))
        _wait_listening(up_port, children[-1])
        upstream = f"http://127.0.0.1:{up_port}"
        targets = {"direct": upstream}
        loops = [("flexinfer", False)] + ([] if args.no_uvloop else [("flexinfer-uvloop", True)])
        for name, uv in (loops if not args.only_uvloop else [("flexinfer-uvloop", True)]):
            port = _free_port()
            children.append(_spawn(["--role", "proxy", "--port", str(port), "--upstream", upstream]
                                   + ([] if uv else ["--no-uvloop"])))
            _wait_listening(port, children[-1])
            targets[name] = f"http://127.0.0.1:{port}"
        if args.litellm:
            process, port = _litellm(args.litellm, upstream)
            children.append(process)
            _wait_listening(port, process, timeout=120)
            targets["litellm"] = f"http://127.0.0.1:{port}"
        results = _measure(targets, args.duration)
        _report(results, list(targets))
    finally:
        for child in children:
            child.terminate()
        for child in children:
            child.wait(10)
    return 0


def _measure(targets: dict[str, str], duration: float) -> dict[tuple[str, str, int], dict[str, float]]:
    results: dict[tuple[str, str, int], dict[str, float]] = {}
    for mode, stream in (("json", False), ("sse", True)):
        script = _lua(stream)
        for name, base in targets.items():
            url = base + "/v1/chat/completions"
            wrk(url, script, 8, 1.0)  # warm-up: connections, caches, JIT-free but still worth it
            for conns in (1, 64):
                results[(mode, name, conns)] = wrk(url, script, conns, duration)
                print(f"{mode} {name} c={conns}: {results[(mode, name, conns)]}", flush=True)
    return results


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    parser.add_argument("--no-uvloop", action="store_true", help="plain asyncio loops only")
    parser.add_argument("--only-uvloop", action="store_true", help="skip the plain-asyncio proxy run")
    parser.add_argument("--litellm", default="", help="path to a `litellm` executable (separate venv)")
    parser.add_argument("--role", choices=("upstream", "proxy"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--upstream", default="", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
