"""``flexinfer serve`` as the engine of a group pod: a real process with ``--no-watch`` and its own admin token
takes its configuration through ``PUT /admin/manifests`` and reports its cold starts and swaps on
``GET /admin/lifecycle``, with llama.cpp's real ``llama-server`` serving tiny GGUF models.

- The admin token (``--admin-token-file``) and the API token (``PROXY_AUTH_*``) each open only their routes.
- ``config.revision`` is that of the file at start, then of each accepted push.
- A pushed pair in one shared group serves; its cold starts (every activation) and swaps are listed in order
  with the times the process's own histograms hold, and polled with ``after``.
- An invalid push is a 422 naming ``pushed:line:column`` for every problem, and the models keep serving from
  the same server processes; the same text again is ``unchanged``; a push without a model removes it (404).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from flexinfer.core.manifest_revision import manifest_revision
from support.llama_server import TINY_ARGS, needs_llama_server
from support.local_serve import ServeProcess, histogram_count, model_manifest, serve_env, write_manifests
from support.tiny_gguf import write_tiny_gguf

pytestmark = [pytest.mark.integration, needs_llama_server]
ADMIN, API = "admin-s3cret", "api-s3cret"


def call(url: str, token: str | None, method: str = "GET", body: bytes | None = None) -> tuple[int, Any]:
    """One request; (status, decoded JSON body, or the text for a non-JSON answer)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if body is not None:
        headers["Content-Type"] = "application/json" if body.startswith(b"{") else "application/yaml"
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            status, text = response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        status, text = error.code, error.read().decode()
    return status, json.loads(text) if text.startswith(("{", "[")) else text


def chat(url: str, model: str) -> Any:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4})
    status, answer = call(url + "/v1/chat/completions", API, "POST", body.encode())
    assert status == 200, answer
    return answer


def tiny(tmp_path: Path, name: str, seed: int, **config: Any) -> dict[str, Any]:
    weights = tmp_path / "weights" / name / "model.gguf"
    if not weights.exists():
        write_tiny_gguf(weights, seed=seed)
    return model_manifest(name, weights, "pod", {"args": TINY_ARGS, **config})


def pids(url: str) -> dict[str, int | None]:
    status, body = call(url + "/admin/status", ADMIN)
    assert status == 200, body
    return {m["name"]: m["pid"] for m in body["models"]}


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeProcess]:
    manifests = write_manifests(tmp_path / "group" / "models.yaml", [tiny(tmp_path, "tiny-a", 0)])
    token_file = tmp_path / "admin-token"
    token_file.write_text(ADMIN + "\n")
    env = serve_env(tmp_path / "state", PROXY_AUTH_ENABLED="true", PROXY_AUTH_TOKEN=API)
    process = ServeProcess(["serve", "-f", str(manifests), "--no-watch", "--port", "0",
                            "--admin-token-file", str(token_file)], env)
    try:
        process.listening()
        yield process
    finally:
        process.stop()


def test_each_token_opens_only_its_routes_and_the_revision_is_the_file(serve: ServeProcess, tmp_path: Path) -> None:
    for token in (None, API, ADMIN + "x"):
        status, body = call(serve.url + "/admin/status", token)
        assert status == 401 and body["error"]["code"] == "invalid_api_key", (token, body)
    assert call(serve.url + "/admin/lifecycle", API)[0] == 401
    assert call(serve.url + "/admin/manifests", API, "PUT", b"")[0] == 401
    assert call(serve.url + "/v1/models", ADMIN)[0] == 401, "the admin token is not the API's"
    assert call(serve.url + "/v1/models", API)[0] == 200
    status, body = call(serve.url + "/admin/status", ADMIN)
    assert status == 200
    revision = manifest_revision((tmp_path / "group" / "models.yaml").read_bytes())
    assert body["config"]["revision"] == revision and body["config"]["reloads"] == 0
    assert ADMIN not in serve.log and API not in serve.log, "tokens are never logged"


def test_pushed_models_serve_and_their_cold_starts_and_swaps_are_listed(serve: ServeProcess, tmp_path: Path) -> None:
    pair = yaml.safe_dump_all([tiny(tmp_path, "tiny-a", 0), tiny(tmp_path, "tiny-b", 1)], sort_keys=False).encode()
    status, config = call(serve.url + "/admin/manifests", ADMIN, "PUT", pair)
    assert status == 200, config
    assert (config["result"], config["trigger"], config["models"]) == ("applied", "push", 2)
    assert config["revision"] == manifest_revision(pair)

    for name in ("tiny-a", "tiny-b", "tiny-a"):
        assert chat(serve.url, name)["model"] == name
    status, window = call(serve.url + "/admin/lifecycle", ADMIN)
    events = window["events"]
    assert status == 200 and window["next"] == 5 and window["lost"] is False, window
    assert [(e["seq"], e["model"], e["kind"]) for e in events] == [  # every activation, and each swap after it
        (1, "default/tiny-a", "cold_start"), (2, "default/tiny-b", "cold_start"), (3, "default/tiny-b", "swap"),
        (4, "default/tiny-a", "cold_start"), (5, "default/tiny-a", "swap")]
    assert all(e["at"].endswith("Z") and e["seconds"] > 0 for e in events)
    metrics = call(serve.url + "/metrics", None)[1]
    for model in ("tiny-a", "tiny-b"):
        for kind in ("cold_start", "swap"):
            family = f"flexinfer_model_{kind}_duration_seconds"
            listed = [e["seconds"] for e in events if e["model"] == f"default/{model}" and e["kind"] == kind]
            assert histogram_count(metrics, family, model=model) == len(listed), (family, model)
            assert sum(listed) == pytest.approx(histogram_sum(metrics, family, model), abs=1e-9), (family, model)
    status, later = call(serve.url + "/admin/lifecycle?after=3", ADMIN)
    assert [e["seq"] for e in later["events"]] == [4, 5] and later["next"] == 5
    status, error = call(serve.url + "/admin/lifecycle?after=two", ADMIN)
    assert status == 400 and error["error"]["param"] == "after"

    running = pids(serve.url)
    invalid = pair.replace(b"- '1'\n", b"- '1'\n    startupTimeout: soon\n")
    assert invalid.count(b"startupTimeout: soon") == 2
    status, rejected = call(serve.url + "/admin/manifests", ADMIN, "PUT", invalid)
    assert status == 422 and rejected["error"]["type"] == "invalid_request_error"
    assert len(rejected["errors"]) == 2 and all(e.startswith("pushed:") for e in rejected["errors"])
    assert all("spec.config.startupTimeout: invalid duration 'soon'" in e for e in rejected["errors"])
    assert rejected["error"]["message"].startswith(rejected["errors"][0])
    status, body = call(serve.url + "/admin/status", ADMIN)
    assert body["config"]["result"] == "rejected" and body["config"]["revision"] == manifest_revision(pair)
    assert chat(serve.url, "tiny-a")["model"] == "tiny-a" and pids(serve.url) == running

    status, same = call(serve.url + "/admin/manifests", ADMIN, "PUT", pair)
    assert status == 200 and same["result"] == "unchanged" and pids(serve.url) == running

    only_a = json.dumps(tiny(tmp_path, "tiny-a", 0)).encode()
    status, config = call(serve.url + "/admin/manifests", ADMIN, "PUT", only_a)
    assert status == 200 and config["result"] == "applied" and config["revision"] == manifest_revision(only_a)
    assert pids(serve.url) == {"tiny-a": running["tiny-a"]}, "the untouched model kept its server"
    status, gone = call(serve.url + "/v1/chat/completions", API, "POST",
                        json.dumps({"model": "tiny-b", "messages": [{"role": "user", "content": "hi"}]}).encode())
    assert status == 404 and gone["error"]["code"] == "model_not_found"


def histogram_sum(metrics_text: str, name: str, model: str) -> float:
    """The ``<name>_sum`` sample of ``model``."""
    for line in metrics_text.splitlines():
        head, _, value = line.rpartition(" ")
        if head.startswith(name + "_sum{") and f'model="{model}"' in head:
            return float(value)
    raise AssertionError(f"no {name}_sum for {model}")
