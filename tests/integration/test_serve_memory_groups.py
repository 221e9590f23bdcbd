"""``flexinfer serve`` with a group that packs by memory, end to end with llama.cpp's real ``llama-server``.

- Three tiny GGUF models in one group and a budget that holds all three: requests alternate between them and
  after each first start nothing is stopped or swapped; ``flexinfer ps`` shows all three Ready, each with the
  need its server reported, and the group's memory under the table.
- A budget that holds two: the third evicts the least recently used one, and only that one; the eviction is
  counted, logged with its reason, and the evicted model comes back on its next request.
- A model whose server dies at start with llama.cpp's allocation failure (a real process that prints it and
  exits) gets the group's residents evicted and one retry, then fails with its need and the budget; a model
  larger than the whole budget is refused at once, and ``auto`` without a known GPU size stops ``serve``
  naming the group.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from support.cli_process import CliProcess
from support.llama_server import TINY_ARGS, needs_llama_server
from support.local_serve import ServeProcess, histogram_count, model_manifest, serve_env, write_manifests
from support.polling import wait_until
from support.tiny_gguf import write_tiny_gguf

pytestmark = [pytest.mark.integration, needs_llama_server]
OOM_SERVER = [sys.executable, "-c", "import sys; print('llama_init_from_model: failed to initialize the context: "
              "failed to allocate buffer for kv cache', flush=True); sys.exit(1)"]


def fetch(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        body = response.read().decode()
    return json.loads(body) if body.startswith(("{", "[")) else body


def chat(url: str, model: str) -> tuple[int, str]:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4})
    request = urllib.request.Request(url + "/v1/chat/completions", body.encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def ps(url: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "flexinfer.cli.main", "ps", "--url", url, *args],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def tiny(tmp_path: Path, name: str, seed: int) -> dict[str, Any]:
    return model_manifest(name, write_tiny_gguf(tmp_path / name / "model.gguf", seed=seed), "tiny",
                          {"args": TINY_ARGS})


@pytest.fixture
def serve_with(tmp_path: Path) -> Iterator[Callable[..., ServeProcess]]:
    started: list[ServeProcess] = []

    def start(documents: list[dict[str, Any]], *budget: str) -> ServeProcess:
        manifests = write_manifests(tmp_path / "models" / "models.yaml", documents)
        extra = [arg for entry in budget for arg in ("--group-memory", entry)]
        serve = ServeProcess.start(manifests.parent, serve_env(tmp_path / "state"), extra=extra)
        started.append(serve)
        return serve

    yield start
    for serve in started:
        serve.stop()


def test_three_models_that_fit_serve_alternately_without_a_swap_after_each_first_start(
        serve_with: Callable[..., ServeProcess], tmp_path: Path) -> None:
    names = ["tiny-a", "tiny-b", "tiny-c"]
    serve = serve_with([tiny(tmp_path, name, seed) for seed, name in enumerate(names)], "tiny=64Mi")
    for name in names * 3:
        status, body = chat(serve.url, name)
        assert status == 200, body
    metrics = fetch(serve.url + "/metrics")
    for name in names:
        assert histogram_count(metrics, "flexinfer_model_cold_start_duration_seconds", model=name) == 1
        assert histogram_count(metrics, "flexinfer_model_swap_duration_seconds", model=name) == 0
    assert "server stopped" not in serve.log and "preempts" not in serve.log
    models = json.loads(ps(serve.url, "-o", "json"))["models"]
    assert {m["name"]: m["phase"] for m in models} == dict.fromkeys(names, "Ready")
    for model in models:  # llama-server's own figures, with weights, KV cache and compute buffers
        assert model["need"]["source"] == "measured" and 1 < model["need"]["mib"] < 8, model
    table = ps(serve.url, "-o", "wide")
    assert table.count("Ready") == 3 and table.count("(measured)") == 3
    assert "memory: group default/tiny:" in table and "of 64.0 MiB, 3 running; evictions: 0 make room, 0 out " \
                                                      "of memory" in table


def test_a_budget_for_two_evicts_only_the_least_recently_used_and_says_why(
        serve_with: Callable[..., ServeProcess], tmp_path: Path) -> None:
    serve = serve_with([tiny(tmp_path, name, seed) for seed, name in enumerate(["tiny-a", "tiny-b", "tiny-c"])],
                       "tiny=6Mi")
    for name in ("tiny-a", "tiny-b", "tiny-a", "tiny-c"):
        status, body = chat(serve.url, name)
        assert status == 200, body
    phases = {m["name"]: m["phase"] for m in fetch(serve.url + "/admin/status")["models"]}
    assert phases == {"tiny-a": "Ready", "tiny-b": "Preempted", "tiny-c": "Ready"}
    assert "model default/tiny-b: server stopped after" in serve.log
    assert "(evicted from GPU group default/tiny to make room for default/tiny-c (needs" in serve.log
    metrics = fetch(serve.url + "/metrics")
    assert 'flexinfer_sharedgroup_evictions_total{group="tiny",namespace="default",reason="make_room"} 1.0' \
        in metrics
    status, body = chat(serve.url, "tiny-b")  # back on demand, evicting the least recently used again
    assert status == 200, body
    groups = fetch(serve.url + "/admin/status")["groups"]
    assert groups[0]["models"] == ["default/tiny-b", "default/tiny-c"] and groups[0]["budget_mib"] == 6.0


def test_an_out_of_memory_start_evicts_the_residents_retries_once_then_names_need_and_budget(
        serve_with: Callable[..., ServeProcess], tmp_path: Path) -> None:
    docs = [tiny(tmp_path, "tiny-a", 0), tiny(tmp_path, "tiny-b", 1)]
    weights = tmp_path / "oom.gguf"
    weights.write_bytes(b"w")
    docs.append(model_manifest("greedy", weights, None, {"command": OOM_SERVER},
                               gpu={"shared": "tiny", "vramEstimateMB": 2}))
    docs.append(model_manifest("huge", weights, None, {"command": OOM_SERVER},
                               gpu={"shared": "tiny", "vramEstimateMB": 50}))
    serve = serve_with(docs, "tiny=16Mi")
    for name in ("tiny-a", "tiny-b"):
        assert chat(serve.url, name)[0] == 200
    status, body = chat(serve.url, "greedy")
    assert status == 503, body
    message = json.loads(body)["error"]["message"]
    assert "out of memory starting model default/greedy: it needs 2 MiB (declared), GPU group default/tiny has a " \
           "budget of 16 MiB (0 MiB held by other models)" in message and "failed to allocate" in message
    starts = [line for line in serve.log.splitlines() if "model default/greedy: server started" in line]
    assert len(starts) == 2, "one retry, after the residents were evicted"
    phases = {m["name"]: m["phase"] for m in fetch(serve.url + "/admin/status")["models"]}
    assert phases["tiny-a"] == phases["tiny-b"] == "Preempted" and phases["greedy"] == "Failed"
    status, body = chat(serve.url, "huge")
    assert status == 503 and "needs 50 MiB (declared) but GPU group default/tiny has a memory budget of 16 MiB" \
        in json.loads(body)["error"]["message"]
    assert "model default/huge: server started" not in serve.log
    metrics = fetch(serve.url + "/metrics")
    assert 'flexinfer_sharedgroup_evictions_total{group="tiny",namespace="default",reason="out_of_memory"} 2.0' \
        in metrics


def test_auto_without_a_known_gpu_size_stops_serve_naming_the_group(tmp_path: Path) -> None:
    manifests = write_manifests(tmp_path / "models" / "models.yaml", [tiny(tmp_path, "tiny-a", 0)])
    env = {**serve_env(tmp_path / "state"), "PATH": str(Path(sys.executable).parent)}  # no GPU tools either
    serve = CliProcess(["serve", "-f", str(manifests.parent), "--port", "0", "--group-memory", "tiny=auto"], env)
    assert serve.finish() == 1
    wait_until(lambda: "error:" in serve.log, 5, "the error line")
    assert "group memory for tiny: auto needs the memory of its GPU, but no GPU was found; give a size " \
           "(e.g. tiny=24Gi)" in serve.log


def test_the_status_page_draws_the_groups_memory_as_a_bar(
        serve_with: Callable[..., ServeProcess], tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    from support.browser import headless_chromium, keep_screenshot

    serve = serve_with([tiny(tmp_path, "tiny-a", 0), tiny(tmp_path, "tiny-b", 1)], "tiny=16Mi")
    for name in ("tiny-a", "tiny-b"):
        assert chat(serve.url, name)[0] == 200
    used = wait_until(lambda: fetch(serve.url + "/admin/status")["groups"][0]["used_mib"] or None, 30,
                      "both measured")
    with headless_chromium(tmp_path) as driver:
        driver.get(serve.url + "/ui")
        label = wait_until(lambda: [e.text for e in driver.find_elements(
            By.CSS_SELECTOR, '#memory li[data-group="default/tiny"] .memory-label') if "2 running" in e.text], 30,
            "the group's memory bar")
        assert label[0].endswith("used, 0.0 MiB loading, of 16 MiB (2 running, 0 evicted)"), label
        bar = driver.find_element(By.CSS_SELECTOR, '#memory li[data-group="default/tiny"] .membar')
        fill = driver.find_element(By.CSS_SELECTOR, '#memory li[data-group="default/tiny"] .used')
        assert abs(fill.size["width"] / bar.size["width"] - used / 16) < 0.02
        needs = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#models tbody td:last-child")]
        assert len(needs) == 2 and all(text.endswith("(measured)") for text in needs), needs
        keep_screenshot(driver, tmp_path, "memory-groups.png")
