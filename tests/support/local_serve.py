"""Run ``flexinfer serve`` as a real child process for integration tests and benchmarks.

``ServeProcess.start(manifest_dir, env)`` launches ``flexinfer serve -f DIR --port 0`` (a ``CliProcess``),
waits for its ``listening on URL`` line and returns the handle; ``stop()`` sends SIGTERM and waits. Also:
Model manifest writing and Prometheus text helpers (histogram sample counts).
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from support.cli_process import CliProcess

TESTS_DIR = Path(__file__).resolve().parents[1]


def model_manifest(name: str, source: Path, group: str | None = None, config: dict[str, Any] | None = None,
                   **spec: Any) -> dict[str, Any]:
    """A ``Model`` document (backend llamacpp unless ``spec`` says otherwise)."""
    body: dict[str, Any] = {"backend": "llamacpp", "source": source.resolve().as_uri(), **spec}
    if group:
        body["gpu"] = {"shared": group}
    if config:
        body["config"] = config
    return {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model", "metadata": {"name": name}, "spec": body}


def write_manifests(path: Path, documents: Sequence[dict[str, Any]]) -> Path:
    """Write a multi-document YAML file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return path


def fake_server_command(*extra: str) -> list[str]:
    """A ``spec.config.command`` running ``support.fake_openai`` (``PYTHONPATH`` must include tests/)."""
    return [sys.executable, "-m", "support.fake_openai", "--port", "{port}", *extra]


def serve_env(state_dir: Path, **overrides: str) -> dict[str, str]:
    """The environment for ``serve``: fast swaps, logs under ``state_dir``, tests importable (in front of the
    caller's ``PYTHONPATH``, which the child keeps, so it runs the same ``flexinfer`` as the test)."""
    paths = [str(TESTS_DIR), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "FLEXINFER_STATE_DIR": str(state_dir), "FLEXINFER_SWAP_MIN_HOLD": "0s",
           "FLEXINFER_SHM_ROOT": str(state_dir / "shm"), "PYTHONPATH": os.pathsep.join(paths)}
    env.update(overrides)
    return env


class ServeProcess(CliProcess):
    """A running ``flexinfer serve`` child."""

    @classmethod
    def start(cls, manifests: Path, env: Mapping[str, str], timeout: float = 60.0,
              extra: Sequence[str] = ()) -> ServeProcess:
        serve = cls(["serve", "-f", str(manifests), "--port", "0", *extra], env)
        try:
            serve.listening(timeout)
        except AssertionError:
            serve.stop()
            raise
        return serve


def histogram_count(metrics_text: str, name: str, **labels: str) -> float:
    """Sum of ``<name>_count`` samples whose labels include ``labels``."""
    total = 0.0
    for line in metrics_text.splitlines():
        if not line.startswith(name + "_count"):
            continue
        head, value = line.rsplit(" ", 1)
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def wait_for(predicate: Any, timeout: float = 30.0, interval: float = 0.05) -> None:
    """Poll ``predicate()`` until true; ``AssertionError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached before the deadline")
        time.sleep(interval)


def start_shared_pair(tmp_path: Path, group: str, names: Sequence[str] = ("left", "right"),
                      server_args: Sequence[str] = (), **env: str) -> ServeProcess:
    """``flexinfer serve`` with one fake model server per name, all in the shared GPU ``group``."""
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"w")
    documents = [model_manifest(name, weights, group, {"command": fake_server_command(
        "--model-name", name, *server_args)}) for name in names]
    manifests = write_manifests(tmp_path / "models" / "models.yaml", documents)
    return ServeProcess.start(manifests.parent, serve_env(tmp_path / "state", PROXY_COLD_START_TIMEOUT="60s", **env))


def chat(base_url: str, model: str) -> dict[str, Any]:
    """One non-streaming chat completion; asserts a 200 with choices and returns the body."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = urllib.request.Request(f"{base_url}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200
        answer: dict[str, Any] = json.loads(response.read())
    assert answer["choices"]
    return answer
