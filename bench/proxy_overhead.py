"""Proxy overhead benchmark: the real ``flexinfer serve`` path against the same upstream loaded directly and
through nginx, with ``wrk``; prints added latency, throughput ratio and the proxy's CPU per request.

    python bench/proxy_overhead.py [--duration 3] [--rounds 2] [--baseline-src OTHER/src] [--litellm BIN]
                                   [--in-cluster] [--floor] [--traced]

``serve`` runs two ``spec.config.command`` models whose command is this script's minimal aiohttp upstream
(``--role upstream``): ``bench`` (no body rewrite) and ``bench-rw`` (``servedModelName`` differs, so the body's
``model`` is rewritten). Once ``bench`` is Ready its model server is the one upstream every target uses
(``direct``, ``nginx`` when installed — a keep-alive reverse proxy, one worker — and ``serve``);
``--baseline-src`` adds a second ``serve`` running another source tree (A/B in one run), ``--litellm`` LiteLLM's
proxy, ``--in-cluster`` the in-cluster ``flexinfer proxy`` against a real kube-apiserver with the same two
Models Ready at that upstream (target ``proxy``, set up by ``bench/incluster_target.py``), ``--floor`` the
minimal relay of ``bench/minimal_relay.py`` (FlexInfer's parsing and upstream pool without its features),
``--traced`` a ``serve`` with tracing on (``FLEXINFER_OTEL_ENABLED``) exporting to the test suite's OTLP/HTTP
receiver, run in this process.
Scenarios: JSON at c=1 and c=64, a 64-chunk SSE stream at c=16, 100 KB and 1 MB prompts at c=1 (through
``bench-rw`` for the proxies), and JSON at c=1 and c=64 again while 2,000 idle keep-alive client connections
(each has made one request) stay open to the target. Runs are interleaved (every target once per round, then
the next round) and the median round is reported; CPU is the server processes' user+system time read from
``/proc`` around each run. Prints figures only (and the load average), asserts nothing. Internal role:
``--role upstream --port N``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SSE_CHUNKS = 64
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}
_TICK = os.sysconf("SC_CLK_TCK")
SRC = Path(__file__).resolve().parents[1] / "src"


# ---------------------------------------------------------------- the upstream (child process)

async def _serve_upstream(port: int, startup_delay: float = 0.0, listening_file: str = "") -> None:
    from aiohttp import web

    await asyncio.sleep(startup_delay)
    answer = json.dumps({"id": "x", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}]}).encode()
    chunk = b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok "}}]}\n\n'

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if b'"stream":true' not in body.replace(b" ", b""):
            return web.Response(body=answer, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(SSE_CHUNKS):
            await response.write(chunk)
        await response.write(b"data: [DONE]\n\n")
        return response

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(client_max_size=8 << 20)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
    if listening_file:  # when it could first answer, on the machine-wide monotonic clock
        await asyncio.to_thread(Path(listening_file).write_text, repr(time.monotonic()))
    await asyncio.Event().wait()


# ---------------------------------------------------------------- targets

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


@dataclass
class Target:
    name: str
    url: str
    process: subprocess.Popen[bytes] | None = None
    rewrite_model: str = "bench-rw"

    def cpu_seconds(self) -> float:
        """User+system CPU of the server process and its workers (not of model servers it started)."""
        if self.process is None:
            return 0.0
        pids = [self.process.pid]
        if self.name == "nginx":
            children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
            pids += [int(p) for p in children.read_text().split()] if children.exists() else []
        total = 0
        for pid in pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except FileNotFoundError:
                continue
            total += int(fields[11]) + int(fields[12])
        return total / _TICK


def _otlp_receiver() -> Any:
    """The test suite's OTLP/HTTP receiver (protobuf decoded, every span kept), for the ``traced`` target."""
    sys.path.insert(0, str(SRC.parent / "tests"))
    from support.otlp_receiver import OTLPReceiver

    return OTLPReceiver()


def _manifests(directory: Path) -> Path:
    weights = directory / "weights.bin"
    weights.write_bytes(b"w")
    command = [sys.executable, str(Path(__file__).resolve()), "--role", "upstream", "--port", "{port}"]
    docs = []
    for name, served in (("bench", None), ("bench-rw", "bench-served")):
        config: dict[str, object] = {"command": command, "healthPath": "/health"}
        if served:
            config["servedModelName"] = served
        docs.append({"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model", "metadata": {"name": name},
                     "spec": {"backend": "llamacpp", "source": weights.resolve().as_uri(), "config": config}})
    path = directory / "models.yaml"
    path.write_text("---\n".join(json.dumps(d) + "\n" for d in docs))  # JSON documents are YAML
    return path


def _start_serve(name: str, src: Path, manifests: Path, state: Path, extra_env: dict[str, str] | None = None) -> Target:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(src), "FLEXINFER_STATE_DIR": str(state),
           "FLEXINFER_SHM_ROOT": str(state / "shm"), **(extra_env or {})}
    state.mkdir(parents=True, exist_ok=True)
    with (state / "serve.log").open("wb") as log:  # the child keeps its own copy of the descriptor
        process = subprocess.Popen([sys.executable, "-m", "flexinfer.cli.main", "serve", "-f", str(manifests),
                                    "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT)
    _wait_listening(port, process)
    url = f"http://127.0.0.1:{port}"
    for model in ("bench", "bench-rw"):
        request = urllib.request.Request(f"{url}/admin/models/{model}/load?wait=true", method="POST")
        with urllib.request.urlopen(request, timeout=120) as response:
            assert json.loads(response.read())["phase"] == "Ready", model
    return Target(name, url, process)


def _endpoint(serve: Target, model: str) -> str:
    with urllib.request.urlopen(serve.url + "/admin/status", timeout=30) as response:
        models = json.loads(response.read())["models"]
    return str(next(m for m in models if m["name"] == model)["endpoint"]).rstrip("/")


NGINX_CONF = """daemon off; worker_processes 1; pid {dir}/nginx.pid; error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off; client_body_temp_path {dir}; proxy_temp_path {dir}; client_max_body_size 8m;
  client_body_buffer_size 2m;
  upstream model {{ server {upstream}; keepalive 128; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{ proxy_pass http://model; proxy_http_version 1.1; proxy_set_header Connection "";
                 proxy_buffering off; proxy_request_buffering on; }}
  }}
}}
"""


def _start_nginx(upstream: str, directory: Path) -> Target | None:
    binary = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if binary is None:
        print("nginx not installed: skipped")
        return None
    port = _free_port()
    conf = directory / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=directory, upstream=upstream.removeprefix("http://"), port=port))
    process = subprocess.Popen([binary, "-p", str(directory), "-c", str(conf)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_listening(port, process)
    return Target("nginx", f"http://127.0.0.1:{port}", process, rewrite_model="bench")


def _start_floor(upstream: str) -> Target:
    """``bench/minimal_relay.py``: the proxy machinery without FlexInfer's features (the floor)."""
    port = _free_port()
    process = subprocess.Popen([sys.executable, str(Path(__file__).with_name("minimal_relay.py")), "--port",
                                str(port), "--upstream", upstream], env={**os.environ, "PYTHONPATH": str(SRC)},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_listening(port, process)
    return Target("floor", f"http://127.0.0.1:{port}", process, rewrite_model="bench")


def _start_litellm(binary: str, upstream: str, directory: Path) -> Target:
    port = _free_port()
    config = directory / "litellm.yaml"
    config.write_text("model_list:\n  - model_name: bench\n    litellm_params:\n      model: openai/bench\n"
                      f"      api_base: {upstream}/v1\n      api_key: none\n")
    env = {**os.environ, "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true", "LITELLM_LOG": "ERROR"}
    process = subprocess.Popen([binary, "--config", str(config), "--port", str(port), "--host", "127.0.0.1"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _wait_listening(port, process, timeout=120)
    return Target("litellm", f"http://127.0.0.1:{port}", process, rewrite_model="bench")


# ---------------------------------------------------------------- load generation

@dataclass(frozen=True)
class Scenario:
    name: str
    connections: int
    stream: bool = False
    prompt_bytes: int = 0
    idle: int = 0
    """Idle keep-alive client connections held open to the target during the run."""

    def script(self, model: str, directory: Path) -> Path:
        content = f"string.rep('a', {self.prompt_bytes})" if self.prompt_bytes else "'hi'"
        stream = "true" if self.stream else "false"
        body = (f"'{{\"model\":\"{model}\",\"stream\":{stream},\"messages\":[{{\"role\":\"user\",\"content\":\"' .. "
                f"{content} .. '\"}}]}}'")
        path = directory / f"{self.name}-{model}.lua"
        path.write_text(f"wrk.method = 'POST'\nwrk.body = {body}\nwrk.headers['Content-Type'] = 'application/json'\n")
        return path


SCENARIOS = (
    Scenario("json c=1", 1), Scenario("json c=64", 64), Scenario("sse64 c=16", 16, stream=True),
    Scenario("json 100KB c=1", 1, prompt_bytes=100_000), Scenario("json 1MB c=1", 1, prompt_bytes=1_000_000),
    Scenario("json c=1 idle2000", 1, idle=2000), Scenario("json c=64 idle2000", 64, idle=2000),
)


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    assert match, text
    return float(match.group(1)) * _UNITS[match.group(2)]


def wrk(url: str, script: Path, connections: int, duration: float) -> dict[str, float]:
    """Run wrk; return rps, requests, p50 and p99 (ms) and the non-2xx count."""
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(duration))}s", "--latency", "-s", str(script), url],
        check=True, capture_output=True, text=True,
    ).stdout
    found = {key: re.search(pattern, out, re.M) for key, pattern in (
        ("rps", r"Requests/sec:\s+([\d.]+)"), ("requests", r"(\d+) requests in"),
        ("p50", r"^\s+50%\s+(\S+)"), ("p99", r"^\s+99%\s+(\S+)"))}
    assert all(found.values()), out
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"rps": float(found["rps"].group(1)), "requests": float(found["requests"].group(1)),  # type: ignore[union-attr]
            "p50": _ms(found["p50"].group(1)), "p99": _ms(found["p99"].group(1)),  # type: ignore[union-attr]
            "non2xx": float(errors.group(1)) if errors else 0.0}


def _idle_connections(url: str, count: int) -> list[http.client.HTTPConnection]:
    """``count`` keep-alive connections to ``url``'s server, each after one answered request, left idle."""
    host, port = url.removeprefix("http://").split(":")
    body = b'{"model":"bench","messages":[{"role":"user","content":"hi"}]}'
    connections = []
    for _ in range(count):
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        if response.status != 200 or response.will_close:
            raise RuntimeError(f"{url} did not keep an idle-to-be connection open ({response.status})")
        connections.append(connection)
    return connections


def _run(target: Target, scenario: Scenario, directory: Path, duration: float) -> dict[str, float]:
    model = "bench" if target.name == "direct" or not scenario.prompt_bytes else target.rewrite_model
    script = scenario.script(model, directory)
    idle = _idle_connections(target.url, scenario.idle) if scenario.idle else []
    before = target.cpu_seconds()
    try:
        row = wrk(target.url + "/v1/chat/completions", script, scenario.connections, duration)
    finally:
        for connection in idle:
            connection.close()
    cpu = target.cpu_seconds() - before
    units = row["requests"] * (SSE_CHUNKS + 1 if scenario.stream else 1)
    row["cpu_us"] = cpu / units * 1e6 if units else 0.0
    return row


def _measure(targets: list[Target], scenarios: list[Scenario], directory: Path, duration: float,
             rounds: int) -> dict[tuple[str, str], dict]:
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    for scenario in scenarios:
        for target in targets:  # warm-up: connections, first-request caches
            _run(target, scenario, directory, 1.0)
        for _ in range(rounds):
            for target in targets:
                results.setdefault((scenario.name, target.name), []).append(_run(target, scenario, directory,
                                                                                 duration))
        print(f"  {scenario.name}: done (load {os.getloadavg()[0]:.2f})", flush=True)
    return {key: _median(rows) for key, rows in results.items()}


def _median(rows: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(row[key] for row in rows) for key in rows[0]}


def _report(results: dict[tuple[str, str], dict[str, float]], targets: list[Target],
            scenarios: list[Scenario]) -> None:
    print(f"\n{'scenario':16} {'target':10} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'+p50 ms':>8} "
          f"{'ratio':>6} {'CPU':>16}")
    for scenario in scenarios:
        base = results[(scenario.name, "direct")]
        for target in targets:
            row = results[(scenario.name, target.name)]
            unit = "µs/chunk" if scenario.stream else "ms/req"
            cpu = row["cpu_us"] if scenario.stream else row["cpu_us"] / 1000
            shown = "" if target.name == "direct" else f"{cpu:>8.3f} {unit}"
            print(f"{scenario.name:16} {target.name:10} {row['rps']:>8.0f} {row['p50']:>8.3f} {row['p99']:>8.3f} "
                  f"{row['p50'] - base['p50']:>8.3f} {row['rps'] / base['rps']:>6.2f} {shown:>16}"
                  + (f"  ({row['non2xx']:.0f} non-2xx)" if row["non2xx"] else ""))
        print()
    print("goals: JSON c=1 +p50 <= 0.2 ms and CPU <= 0.15 ms/req; JSON c=64 ratio >= 0.6 and CPU <= 0.15 ms/req;"
          " SSE ratio >= 1.0 and CPU <= 8 µs/chunk")


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.role == "upstream":
        try:
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        except ImportError:
            pass
        asyncio.run(_serve_upstream(args.port, args.startup_delay, args.listening_file))
        return 0
    if args.queued:
        return _queued(args.queued, Path(args.baseline_src).resolve() if args.baseline_src else SRC)
    return _orchestrate(args)


def _orchestrate(args: argparse.Namespace) -> int:
    targets: list[Target] = []
    if args.no_access_log:  # inherited by every FlexInfer target (nginx's bench config logs no access either)
        os.environ["FLEXINFER_ACCESS_LOG"] = "false"
    with tempfile.TemporaryDirectory(prefix="proxy-bench-") as tmp, contextlib.ExitStack() as stack:
        directory = Path(tmp)
        manifests = _manifests(directory)
        try:
            serve = _start_serve("serve", SRC, manifests, directory / "state")
            upstream = _endpoint(serve, "bench")
            targets.append(Target("direct", upstream))
            if not args.no_nginx:
                nginx = _start_nginx(upstream, directory)
                targets += [nginx] if nginx else []
            if args.floor:
                targets.append(_start_floor(upstream))
            if args.baseline_src:
                targets.append(_start_serve("baseline", Path(args.baseline_src).resolve(), manifests,
                                            directory / "state-baseline"))
            targets.append(serve)
            if args.traced:
                receiver = stack.enter_context(_otlp_receiver())
                targets.append(_start_serve("traced", SRC, manifests, directory / "state-traced", {
                    "FLEXINFER_OTEL_ENABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}))
            if args.in_cluster:  # stopped by the targets' `finally`, then its apiserver by the exit stack
                from incluster_target import in_cluster_proxy

                targets.append(Target("proxy", *stack.enter_context(in_cluster_proxy(upstream, directory, SRC))))
            if args.litellm:
                targets.append(_start_litellm(args.litellm, upstream, directory))
            print(f"targets: {', '.join(t.name for t in targets)}; FlexInfer access log "
                  f"{'off' if args.no_access_log else 'on'}; load average before: "
                  f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
            scenarios = [s for s in SCENARIOS if not args.only or any(part in s.name for part in args.only)]
            results = _measure(targets, scenarios, directory, args.duration, args.rounds)
            _report(results, targets, scenarios)
            if args.traced:
                print(f"traced: {len(receiver.spans())} spans received by the OTLP receiver")
            print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        finally:
            for target in targets:
                if target.process is not None:
                    target.process.terminate()
            for target in targets:
                if target.process is not None:
                    try:
                        target.process.wait(60)
                    except subprocess.TimeoutExpired:
                        print(f"{target.name} did not stop within 60s: killed")
                        target.process.kill()
    return 0


# ---------------------------------------------------------------- waiting at scale

def _rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]


def _queued(count: int, src: Path) -> int:
    """``count`` requests, one connection each, sent while the model is still starting (its server sleeps
    before listening): ``serve``'s memory per waiting request, and how long after Ready the last answer
    arrives."""
    with tempfile.TemporaryDirectory(prefix="proxy-queued-") as tmp:
        directory = Path(tmp)
        weights = directory / "weights.bin"
        weights.write_bytes(b"w")
        listening = directory / "listening"
        command = [sys.executable, str(Path(__file__).resolve()), "--role", "upstream", "--port", "{port}",
                   "--startup-delay", "8", "--listening-file", str(listening)]
        doc = {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model", "metadata": {"name": "cold"},
               "spec": {"backend": "llamacpp", "source": weights.resolve().as_uri(),
                        "config": {"command": command, "healthPath": "/health"}}}
        (directory / "models.yaml").write_text(json.dumps(doc) + "\n")
        port = _free_port()
        env = {**os.environ, "PYTHONPATH": str(src), "FLEXINFER_STATE_DIR": str(directory / "state"),
               "PROXY_MAX_QUEUE_SIZE": str(count * 2), "PROXY_COLD_START_TIMEOUT": "120s"}
        process = subprocess.Popen([sys.executable, "-m", "flexinfer.cli.main", "serve", "-f",
                                    str(directory / "models.yaml"), "--port", str(port)], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_listening(port, process)
            time.sleep(0.5)
            before = _rss_kib(process.pid)
            result = asyncio.run(_flood(port, count, process.pid))
        finally:
            process.terminate()
            process.wait(60)
        statuses, ready_at, last_at, waiting_rss = result
        listened = float(listening.read_text())
    print(f"{src}: {count} queued requests: serve RSS {before} KiB idle → {waiting_rss} KiB with all waiting "
          f"({(waiting_rss - before) * 1024 / count:.0f} bytes each); statuses {statuses}; last answer "
          f"{last_at - listened:.2f}s after the model server listened ({last_at - ready_at:.2f}s after /admin/status "
          f"showed Ready); load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


async def _flood(port: int, count: int, pid: int) -> tuple[dict[int, int], float, float, int]:
    body = json.dumps({"model": "cold", "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json"
               f"\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body
    statuses: dict[int, int] = {}
    done: list[float] = []

    async def one() -> None:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            answer = await reader.read()
        except OSError:
            statuses[-1] = statuses.get(-1, 0) + 1  # -1: connection refused or reset
            return
        status = int(answer.split(b" ", 2)[1]) if answer else 0
        statuses[status] = statuses.get(status, 0) + 1
        done.append(time.monotonic())
        writer.close()

    tasks = []
    for _ in range(count):
        tasks.append(asyncio.ensure_future(one()))
        if len(tasks) % 100 == 0:
            await asyncio.sleep(0.03)
    phase, depth = "", 0
    while phase != "Ready" and depth < count:  # every request has reached the queue (or the model is up)
        await asyncio.sleep(0.05)
        phase, depth = await asyncio.to_thread(_model_state, port)
    waiting_rss = _rss_kib(pid)
    ready_at = 0.0
    while not ready_at:
        await asyncio.sleep(0.02)
        phase, _ = await asyncio.to_thread(_model_state, port)
        if phase == "Ready":
            ready_at = time.monotonic()
    await asyncio.gather(*tasks)
    return statuses, ready_at, max(done), waiting_rss


def _model_state(port: int) -> tuple[str, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/status", timeout=30) as response:
        model = json.loads(response.read())["models"][0]
    return str(model["phase"]), int(model["queue_depth"])


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds per scenario (median reported)")
    parser.add_argument("--baseline-src", default="", help="a second `serve` from this source tree (A/B)")
    parser.add_argument("--only", action="append", default=[],
                        help="run the scenarios whose name contains this text (repeatable), e.g. 'sse' or 'c=64'")
    parser.add_argument("--no-nginx", action="store_true", help="skip nginx even when installed")
    parser.add_argument("--no-access-log", action="store_true",
                        help="run the FlexInfer targets without their access log (as the nginx target runs)")
    parser.add_argument("--litellm", default="", help="path to a `litellm` executable (separate venv)")
    parser.add_argument("--floor", action="store_true",
                        help="add bench/minimal_relay.py: the same machinery without FlexInfer's features")
    parser.add_argument("--traced", action="store_true",
                        help="add a `serve` with tracing on, exporting to an OTLP/HTTP receiver in this process")
    parser.add_argument("--in-cluster", action="store_true",
                        help="add `flexinfer proxy` against a real kube-apiserver (built on first use)")
    parser.add_argument("--queued", type=int, default=0,
                        help="instead: N requests (one connection each) queued for a cold model; memory and drain time "
                             "(of the --baseline-src tree when given)")
    parser.add_argument("--startup-delay", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--listening-file", default="", help=argparse.SUPPRESS)
    parser.add_argument("--role", choices=("upstream",), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
