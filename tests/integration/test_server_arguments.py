"""The model server's arguments in both engines, against llama.cpp's real ``llama-server``.

- Kubernetes: the arguments the manager renders into a ``pvc://`` Model's Deployment (the image's entrypoint
  is ``llama-server``) run here with the weights' path and a local port in place of ``/models`` and
  ``0.0.0.0:8080``. The server answers with the name the local engine gives it, not the path it loads; the
  proxy's body rewrite sends it that same name; ``spec.config.args`` come last and unchanged, so a flag
  ``llama-server`` does not know stops it with its own message.
- Local: ``flexinfer serve`` answers with that name too, and a model whose ``spec.config.args`` carry a flag
  ``llama-server`` refuses fails visibly: the waiting request gets a 503 naming the server's message (not a
  504 after the cold-start budget), ``flexinfer ps`` and ``flexinfer load`` show it, the model is Failed.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flexinfer.cluster_proxy.catalog import backend_model_name
from flexinfer.core.controller_defaults import controller_defaults
from flexinfer.core.manifests.render import render_model
from support.llama_server import LLAMA_SERVER, TINY_ARGS, needs_llama_server
from support.local_serve import ServeProcess, model_manifest, serve_env, write_manifests
from support.polling import wait_until
from support.resource_builders import make_model
from support.tiny_gguf import write_tiny_gguf

pytestmark = [pytest.mark.integration, needs_llama_server]
BOGUS = "--bogus-flag"
REFUSED = f"invalid argument: {BOGUS}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def post_chat(base_url: str, model: str, timeout: float = 60) -> tuple[int, dict[str, Any]]:
    body = json.dumps({"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = urllib.request.Request(base_url + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def healthy(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(base_url + "/health", timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError):
        return False


def rendered_args(config: dict[str, Any]) -> list[str]:
    """The ``model`` container's args of the Deployment the manager renders for a ``pvc://`` tiny-a."""
    model = make_model("tiny-a", backend="llamacpp", source="pvc://weights/tiny-a.gguf", config=config)
    deployment = render_model(model, [], controller_defaults({}), 1)[0]
    container = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "model")
    args: list[str] = container["args"]
    return args


def here(args: list[str], weights: Path, port: int) -> list[str]:
    """``args`` with this machine's weights path, loopback host and ``port`` in place of the pod's."""
    out = list(args)
    for flag, value in (("--model", str(weights)), ("--host", "127.0.0.1"), ("--port", str(port))):
        out[out.index(flag) + 1] = value  # the first: the manager's own, before the user's args
    return out


@pytest.mark.parametrize(("config", "name"), [({}, "tiny-a"), ({"servedModelName": "chat-a"}, "chat-a")])
def test_kubernetes_args_make_the_server_answer_with_the_local_name(tmp_path: Path, config: dict[str, Any],
                                                                    name: str) -> None:
    args = rendered_args({**config, "args": TINY_ARGS})
    assert args[:2] == ["--model", "/models"] and args[-len(TINY_ARGS):] == TINY_ARGS
    port = free_port()
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen([str(LLAMA_SERVER), *here(args, write_tiny_gguf(tmp_path / "w.gguf"), port)],
                              stdout=log, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: server.poll() is not None or healthy(base_url), timeout=60, message="llama-server up")
        assert server.poll() is None, (tmp_path / "server.log").read_text()
        model = make_model("tiny-a", backend="llamacpp", source="pvc://weights/tiny-a.gguf", config=config)
        sent = backend_model_name(model)  # what the in-cluster proxy rewrites the request's model to
        status, answer = post_chat(base_url, sent)
        assert status == 200, answer
        assert sent == answer["model"] == name  # not "/models" (the path it loads) nor "/tiny-a.gguf"
    finally:
        server.kill()
        server.wait(30)
        log.close()


def test_kubernetes_args_end_with_the_users_args_and_a_bogus_flag_stops_the_server(tmp_path: Path) -> None:
    args = rendered_args({"args": [*TINY_ARGS, BOGUS]})
    assert args[-len(TINY_ARGS) - 1:] == [*TINY_ARGS, BOGUS]
    command = [str(LLAMA_SERVER), *here(args, write_tiny_gguf(tmp_path / "w.gguf"), free_port())]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1 and REFUSED in done.stdout + done.stderr


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeProcess]:
    docs = [model_manifest(name, write_tiny_gguf(tmp_path / name / "model.gguf"), None, {"args": args})
            for name, args in (("tiny-a", TINY_ARGS), ("bogus", [*TINY_ARGS, BOGUS]))]
    manifests = write_manifests(tmp_path / "models" / "models.yaml", docs).parent
    # a budget far beyond the client's timeout: an answer at all means it did not wait for it
    process = ServeProcess.start(manifests, serve_env(tmp_path / "state", PROXY_COLD_START_TIMEOUT="10m"))
    yield process
    process.stop()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flexinfer.cli.main", *args], capture_output=True, text=True,
                          timeout=120, check=False)


def test_local_answers_with_the_served_name_and_a_refused_flag_fails_visibly(serve: ServeProcess) -> None:
    status, answer = post_chat(serve.url, "tiny-a")
    assert status == 200 and answer["model"] == "tiny-a", answer

    status, answer = post_chat(serve.url, "bogus")
    assert status == 503, answer
    assert answer["error"]["code"] == "activation_failed" and REFUSED in answer["error"]["message"], answer

    rows = json.loads(cli("ps", "-o", "json", "--url", serve.url).stdout)["models"]
    bogus = next(row for row in rows if row["name"] == "bogus")
    assert bogus["phase"] == "Failed" and REFUSED in bogus["last_error"].splitlines()[0], bogus
    table = cli("ps", "--url", serve.url).stdout
    assert REFUSED in next(line for line in table.splitlines() if " bogus " in line), table
    loaded = cli("load", "bogus", "--url", serve.url)
    assert loaded.returncode == 1 and REFUSED in loaded.stderr, loaded.stderr
