"""``flexinfer serve`` shutdown and process lifecycle, as a real process with real model-server children.

- A second SIGTERM while a long stream is in flight: ``serve`` exits within its bound, the stream ends with
  an SSE ``service_unavailable`` error event (no silent cut, no ``[DONE]``), no model server is left.
- Streams whose clients went away do not hold the shutdown: they are not in flight, and a model server
  (a real llama-cpp-python one) still generating for them is not waited for the whole stop grace.
- SIGKILL of ``serve``: its model servers die with it (parent-death signal); what survives (a forked
  grandchild) is reaped by the next ``serve`` started on the same state directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from support.llama_server import PYTHON_SERVER, TINY_ARGS, needs_llama_server, needs_python_server
from support.local_processes import STUB, alive
from support.local_serve import ServeProcess, fake_server_command, model_manifest, serve_env, write_manifests

pytestmark = pytest.mark.integration
LONG_STREAM = fake_server_command("--chunks", "2000", "--chunk-interval", "0.05")
"""100 s of chunks: far longer than any test waits."""
HURRIED_EXIT = 8.0
"""Upper bound for the exit after a second signal (close grace 2 s + slack)."""


@pytest.fixture
def serve_in(tmp_path: Path) -> Iterator:
    started: list[ServeProcess] = []

    def start(documents: list[dict], state: Path | None = None, **env: str) -> ServeProcess:
        manifests = write_manifests(tmp_path / "models" / "models.yaml", documents)
        serve = ServeProcess.start(manifests.parent, serve_env(state or tmp_path / "state", **env))
        started.append(serve)
        return serve

    yield start
    for serve in started:
        serve.stop()


def weights(tmp_path: Path) -> Path:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"w")
    return path


def load(url: str, model: str) -> int:
    """Preload ``model`` through the admin API; returns its server pid."""
    request = urllib.request.Request(f"{url}/admin/models/{model}/load?wait=true", method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        assert json.loads(response.read())["phase"] == "Ready"
    with urllib.request.urlopen(f"{url}/admin/status", timeout=30) as response:
        status = json.loads(response.read())["models"]
    return int(next(m for m in status if m["name"] == model)["pid"])


async def wait_exit(proc: subprocess.Popen[str], timeout: float) -> float:
    """Seconds until ``proc`` exited (poll with a deadline); fails after ``timeout``."""
    started = time.monotonic()
    while proc.poll() is None:
        assert time.monotonic() - started < timeout, f"serve still running after {timeout}s"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


async def wait_dead(pids: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while any(alive(pid) for pid in pids):
        assert time.monotonic() < deadline, f"still alive after {timeout}s: {[p for p in pids if alive(p)]}"
        await asyncio.sleep(0.02)


async def draining(session: aiohttp.ClientSession, url: str) -> None:
    """Wait (deadline) until ``serve`` handled a first signal (``/readyz`` says draining): signals sent
    closer together may reach the process as one."""
    deadline = time.monotonic() + 10
    while True:
        try:
            async with session.get(url + "/readyz") as response:
                if response.status == 503:
                    return
        except aiohttp.ClientConnectionError:
            return  # nothing was in flight: the listener is already closed
        assert time.monotonic() < deadline, "serve never started draining"
        await asyncio.sleep(0.02)


async def open_stream(session: aiohttp.ClientSession, url: str, model: str) -> aiohttp.ClientResponse:
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": "x"}]}
    response = await session.post(url + "/v1/chat/completions", json=body)
    assert response.status == 200
    assert (await next_event(response)).startswith(b"data: ")  # the stream is under way
    return response


async def next_event(response: aiohttp.ClientResponse) -> bytes:
    """The next non-empty line of an SSE stream."""
    while not (line := await response.content.readline()).strip():
        assert line, "the stream ended"
    return line


async def test_second_signal_ends_streams_with_an_error_and_exits_within_the_bound(serve_in, tmp_path) -> None:
    serve = serve_in([model_manifest("long", weights(tmp_path), None, {"command": LONG_STREAM})])
    pid = load(serve.url, "long")
    async with aiohttp.ClientSession() as session:
        response = await open_stream(session, serve.url, "long")
        serve.proc.send_signal(signal.SIGTERM)  # a graceful drain: the stream keeps flowing ...
        await draining(session, serve.url)
        assert (await next_event(response)).startswith(b"data: ")
        serve.proc.send_signal(signal.SIGTERM)  # ... until the second signal, which means now
        async with asyncio.timeout(HURRIED_EXIT):
            rest = (await response.content.read()).decode()
        took = await wait_exit(serve.proc, HURRIED_EXIT)
    events = [line[len("data: "):] for line in rest.splitlines() if line.startswith("data: ")]
    assert events and events[-1] != "[DONE]", rest[-500:]
    error = json.loads(events[-1])["error"]
    assert error["code"] == "service_unavailable" and "shutting down" in error["message"], error
    assert took < HURRIED_EXIT
    assert serve.proc.returncode == 0, serve.log
    await wait_dead([pid], 5)
    assert "Traceback" not in serve.log and "ignored SIGTERM" not in serve.log, serve.log


async def test_a_server_that_ignores_sigterm_is_killed_after_the_grace(serve_in, tmp_path) -> None:
    stubborn = [sys.executable, str(STUB), "--port", "{port}", "--ignore-term"]
    serve = serve_in([model_manifest("stubborn", weights(tmp_path), None, {"command": stubborn})])
    pid = load(serve.url, "stubborn")
    async with aiohttp.ClientSession() as session:
        serve.proc.send_signal(signal.SIGTERM)
        await draining(session, serve.url)
    serve.proc.send_signal(signal.SIGTERM)
    await wait_exit(serve.proc, HURRIED_EXIT)
    assert serve.proc.returncode == 0, serve.log
    await wait_dead([pid], 5)


async def test_abandoned_streams_do_not_hold_the_shutdown(serve_in, tmp_path) -> None:
    serve = serve_in([model_manifest("long", weights(tmp_path), None, {"command": LONG_STREAM})],
                     FLEXINFER_DRAIN_TIMEOUT="60s")
    pid = load(serve.url, "long")
    async with aiohttp.ClientSession() as session:
        streams = await asyncio.gather(*(open_stream(session, serve.url, "long") for _ in range(4)))
        for response in streams:
            response.close()  # the client goes away mid-stream
    serve.proc.send_signal(signal.SIGTERM)
    took = await wait_exit(serve.proc, 20)
    assert took < 5, f"{took:.1f}s to exit:\n{serve.log}"
    assert serve.proc.returncode == 0, serve.log
    await wait_dead([pid], 5)


@pytest.mark.parametrize("config", [
    pytest.param({"args": TINY_ARGS}, marks=needs_llama_server, id="llama-server"),
    pytest.param(PYTHON_SERVER, marks=needs_python_server, id="python"),
])
async def test_streams_abandoned_at_a_real_llama_cpp_server_do_not_hold_the_shutdown(serve_in, tmp_path,
                                                                                     config) -> None:
    """llama-cpp-python keeps generating for a client that is gone and, on SIGTERM, waits for it; llama-server
    saves its slots' prompt caches when it is stopped: serve must not wait the whole stop grace (10 s) for
    work nobody will read."""
    from support.tiny_gguf import write_tiny_gguf

    serve = serve_in([model_manifest("tiny", write_tiny_gguf(tmp_path / "tiny.gguf"), None, config)])
    pid = load(serve.url, "tiny")
    body = {"model": "tiny", "stream": True, "max_tokens": 400, "logit_bias": {"2": -100},
            "messages": [{"role": "user", "content": "hello"}]}
    async def abandon(session: aiohttp.ClientSession) -> int:
        response = await session.post(serve.url + "/v1/chat/completions", json=body)
        response.close()  # gone once the stream started; the server would generate 400 tokens
        return response.status

    async with aiohttp.ClientSession() as session:
        assert await asyncio.gather(*(abandon(session) for _ in range(4))) == [200] * 4
    serve.proc.send_signal(signal.SIGTERM)
    took = await wait_exit(serve.proc, 20)
    assert took < 5, f"{took:.1f}s to exit:\n{serve.log}"
    await wait_dead([pid], 5)


async def grandchild(url: str, model: str) -> int:
    """The pid the stub printed for its forked grandchild (read through the admin API, with a deadline)."""
    deadline = time.monotonic() + 10
    while True:
        async with aiohttp.ClientSession() as session, session.get(f"{url}/admin/logs/{model}") as response:
            lines = (await response.json())["lines"]
        pids = [int(line.rsplit(" ", 1)[1]) for line in lines if "grandchild pid" in line]
        if pids:
            return pids[-1]
        assert time.monotonic() < deadline, lines
        await asyncio.sleep(0.02)


async def test_model_servers_die_with_a_killed_serve_and_leftovers_are_reaped(serve_in, tmp_path) -> None:
    tree = [sys.executable, str(STUB), "--port", "{port}", "--grandchild"]
    docs = [model_manifest("tree", weights(tmp_path), None, {"command": tree})]
    state = tmp_path / "state"
    first = serve_in(docs, state)
    leader = load(first.url, "tree")
    left = await grandchild(first.url, "tree")
    innocent = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(60)")
    try:
        assert alive(leader) and alive(left)
        records = list((state / "processes").glob("*.json"))
        assert [r.name for r in records] == [f"{leader}.json"]

        first.proc.send_signal(signal.SIGKILL)
        await wait_exit(first.proc, 10)
        await wait_dead([leader], 10)  # the parent-death signal
        assert alive(left), "the kernel does not signal the grandchild: the next serve must reap it"

        # a record whose pid now belongs to an unrelated process (a reused pid): never killed
        record = json.loads(records[0].read_text())
        records[0].with_name(f"{innocent.pid}.json").write_text(json.dumps({**record, "pgid": innocent.pid}))
        second = serve_in(docs, state)
        await wait_dead([left], 10)
        assert "left by a previous serve" in second.log, second.log
        assert alive(innocent.pid)
        assert list((state / "processes").glob("*.json")) == []
    finally:
        innocent.kill()
        await innocent.wait()
        if alive(left):
            os.kill(left, signal.SIGKILL)
