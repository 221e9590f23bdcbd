"""``flexinfer serve`` end to end, as a real process.

- Two tiny GGUF models served by llama.cpp's ``llama-server`` share one GPU group; the
  official ``openai`` client alternates plain and streaming chats between them; swaps happen, every request
  succeeds, and the cold-start/swap histograms hold one sample per activation/swap.
- 200 concurrent requests over 3 models in one group (the scripted fake server): every request is answered
  (200, or a documented 429/503/504), none hangs past its timeout, and no server is stopped with requests
  in flight (every 200 stream is complete).
- The admin API / ``flexinfer status`` / ``flexinfer logs``, and no model server left after SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from support.llama_server import TINY_ARGS, needs_llama_server
from support.local_serve import (
    ServeProcess,
    fake_server_command,
    histogram_count,
    model_manifest,
    serve_env,
    write_manifests,
)

pytestmark = pytest.mark.integration


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


@pytest.fixture
def serve_factory(tmp_path: Path) -> Iterator:
    started: list[ServeProcess] = []

    def start(documents: list[dict], **env: str) -> ServeProcess:
        manifests = write_manifests(tmp_path / "models" / "models.yaml", documents)
        serve = ServeProcess.start(manifests.parent, serve_env(tmp_path / "state", **env))
        started.append(serve)
        return serve

    yield start
    for serve in started:
        serve.stop()


# ---------------------------------------------------------------- llama.cpp, openai client


@needs_llama_server
def test_two_tiny_gguf_models_swap_behind_the_openai_api(serve_factory, tmp_path: Path) -> None:
    from openai import OpenAI

    from support.tiny_gguf import write_tiny_gguf

    args = {"args": TINY_ARGS}
    docs = [model_manifest(name, write_tiny_gguf(tmp_path / name / "model.gguf", seed=seed), "tiny", args)
            for seed, name in enumerate(["tiny-a", "tiny-b"])]
    serve = serve_factory(docs)
    client = OpenAI(base_url=serve.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    order = ["tiny-a", "tiny-b", "tiny-a", "tiny-b"]
    for model in order:
        reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hello"}],
                                               max_tokens=8, temperature=0)
        assert reply.choices[0].message.content is not None and reply.usage is not None
        assert reply.usage.completion_tokens > 0
        stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=8, temperature=0, stream=True)
        chunks = list(stream)
        assert chunks and chunks[-1].choices[0].finish_reason is not None

    metrics = fetch(serve.url + "/metrics")
    cold = histogram_count(metrics, "flexinfer_model_cold_start_duration_seconds")
    swaps = histogram_count(metrics, "flexinfer_model_swap_duration_seconds", group="tiny")
    activations = len(order)  # every activation is a cold-start sample; all but the first are also swaps
    assert cold == activations, metrics
    assert swaps == activations - 1, metrics
    assert histogram_count(metrics, "flexinfer_model_swap_duration_seconds", model="tiny-a") == 1
    assert histogram_count(metrics, "flexinfer_model_swap_duration_seconds", model="tiny-b") == 2


# ---------------------------------------------------------------- concurrency with the fake server


async def one_request(session: aiohttp.ClientSession, url: str, model: str, timeout: float) -> tuple[int, bool]:
    """POST a streaming chat; returns (status, stream complete)."""
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": "x"}]}
    async with asyncio.timeout(timeout):
        async with session.post(url + "/v1/chat/completions", json=body) as response:
            text = await response.text()
    return response.status, text.rstrip().endswith("data: [DONE]")


def test_200_concurrent_requests_over_3_models_in_one_group(serve_factory, tmp_path: Path) -> None:
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"w")
    command = fake_server_command("--startup-delay", "0.2", "--chunks", "4", "--chunk-interval", "0.01")
    models = ["m0", "m1", "m2"]
    serve = serve_factory([model_manifest(m, weights, "trio", {"command": command}) for m in models],
                          PROXY_COLD_START_TIMEOUT="60s", PROXY_QUEUE_TIMEOUT="60s")

    async def burst() -> list[tuple[int, bool]]:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            return await asyncio.gather(*(one_request(session, serve.url, models[i % 3], 90) for i in range(200)))

    results = asyncio.run(burst())
    statuses = [status for status, _ in results]
    assert set(statuses) <= {200, 429, 503, 504}, statuses
    assert statuses.count(200) > 0
    assert all(complete for status, complete in results if status == 200), "a stream was cut (server stopped?)"
    log = "".join(serve.output)
    assert "Traceback" not in log, log


# ---------------------------------------------------------------- admin API, CLI, shutdown


def run_cli(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "flexinfer.cli.main", *args], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_admin_api_cli_and_no_orphans_after_sigterm(serve_factory, tmp_path: Path) -> None:
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"w")
    docs = [model_manifest(m, weights, "pair", {"command": fake_server_command("--model-name", m)})
            for m in ("left", "right")]
    docs.append(model_manifest("broken", weights, None, {"command": fake_server_command("--crash-at-start")}))
    serve = serve_factory(docs)
    request = urllib.request.Request(serve.url + "/admin/models/left/load?wait=true", method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        assert json.loads(response.read())["phase"] == "Ready"
    status = json.loads(fetch(serve.url + "/admin/status"))["models"]
    left = next(m for m in status if m["name"] == "left")
    assert left["endpoint"].startswith("http://127.0.0.1:") and left["pid"] > 0

    table = run_cli("status", "--url", serve.url)
    assert "left" in table and "Ready" in table and "pair" in table
    assert "FAKE_OPENAI_PORT=" in run_cli("logs", "left", "--url", serve.url, "--tail", "5")

    failed = urllib.request.Request(serve.url + "/admin/models/broken/load?wait=true", method="POST")
    with urllib.request.urlopen(failed, timeout=60) as response:
        assert json.loads(response.read())["phase"] == "Failed"
    assert "crashing at start as scripted" in run_cli("logs", "broken", "--url", serve.url)

    assert serve.stop() == 0
    assert not alive(left["pid"])


# ---------------------------------------------------------------- flash-loader staging (in process)


async def test_flash_loader_stages_weights_before_the_server_starts(tmp_path: Path) -> None:
    from flexinfer.api.key import ModelKey
    from flexinfer.assembly.local import start_local
    from support.local_processes import stub_command

    weights = tmp_path / "weights" / "model.gguf"
    weights.parent.mkdir()
    weights.write_bytes(os.urandom(1 << 20))
    doc = model_manifest("staged", weights, None, {"command": stub_command()},
                         cache={"flashLoader": {"enabled": True}})
    manifests = write_manifests(tmp_path / "models" / "m.yaml", [doc])
    env = serve_env(tmp_path / "state", FLEXINFER_SHM_ROOT=str(tmp_path / "shm"))
    server = await start_local([manifests], host="127.0.0.1", port=0, env=env)
    try:
        assert await server.dispatcher.preload(ModelKey("default", "staged"), wait=True, timeout=60) == "Ready"
        staged = tmp_path / "shm" / "default" / "staged" / "model.gguf"
        assert staged.read_bytes() == weights.read_bytes()
        lines = server.engine.logs.tail("default/staged") or []
        assert any(f"--model {staged}" in line for line in lines), lines
    finally:
        await server.close()
    assert server.engine.child_pids == []


async def test_a_model_cache_beside_the_models_decides_how_serve_stages(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """The ModelCache manifests in the served directory are a flash-loader layer, matched as the manager
    matches them (``<model>-cache`` or the model's name): one enables staging with its concurrency and tmpfs
    limit, one's limit is too small (the model refuses to start), a model without one is not staged."""
    from flexinfer.api.key import ModelKey
    from flexinfer.assembly.local import start_local
    from support.local_processes import stub_command

    weights = tmp_path / "weights" / "model.gguf"
    weights.parent.mkdir()
    weights.write_bytes(os.urandom(1 << 20))
    models = [model_manifest(name, weights, None, {"command": stub_command()}) for name in ("roomy", "tight", "plain")]
    caches = [{"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache", "metadata": {"name": name},
               "spec": {"source": weights.resolve().as_uri(), "flashLoader": flash}}
              for name, flash in (("roomy-cache", {"enabled": True, "concurrency": 1, "tmpfsSizeLimit": "64Mi"}),
                                  ("tight", {"enabled": True, "tmpfsSizeLimit": "1Mi"}))]
    write_manifests(tmp_path / "models" / "caches.yaml", caches)
    manifests = write_manifests(tmp_path / "models" / "models.yaml", models).parent
    env = serve_env(tmp_path / "state", FLEXINFER_SHM_ROOT=str(tmp_path / "shm"))
    caplog.set_level("INFO", logger="flexinfer.serve")
    server = await start_local([manifests], host="127.0.0.1", port=0, env=env, watch_interval=None)
    try:
        phases = [await server.dispatcher.preload(ModelKey("default", name), wait=True, timeout=60)
                  for name in ("roomy", "tight", "plain")]
        assert phases == ["Ready", "Failed", "Ready"]
        assert (tmp_path / "shm" / "default" / "roomy" / "model.gguf").read_bytes() == weights.read_bytes()
        messages = [r.getMessage() for r in caplog.records if r.name == "flexinfer.serve"]
        staged = [message for message in messages if ": staged " in message]
        assert len(staged) == 1 and "default/roomy" in staged[0], staged
        assert "with concurrency 1," in staged[0] and "tmpfs limit 64Mi" in staged[0], staged
        error = server.dispatcher.state(ModelKey("default", "tight")).last_error or ""
        assert "insufficient tmpfs space" in error and "(tmpfsSizeLimit 1Mi)" in error, error
        assert not (tmp_path / "shm" / "default" / "plain").exists()
        lines = server.engine.logs.tail("default/plain") or []
        assert any(f"--model {weights.resolve()}" in line for line in lines), lines
    finally:
        await server.close()
    assert server.engine.child_pids == []
