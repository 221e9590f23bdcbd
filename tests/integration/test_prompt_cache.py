"""A llama.cpp model's prompt cache survives a swap: ``flexinfer serve`` with two tiny models on the real
``llama-server`` in one GPU group.

The first model answers a prompt, is swapped out (its slot saved into its cache directory) and back in (the
slot restored in the ``restore`` stage before any request reaches it): the same prompt sent again is not
prefilled again (the server's ``timings.prompt_n`` is the one token after the cached prefix,
``timings.cache_n`` the rest). A model with ``spec.config.promptCache: false`` prefills everything again. A
cache that is truncated, or was saved for another model file, is skipped with a log line and the request is
answered as if there had been none. ``flexinfer ps -o wide`` and ``/admin/status`` show each server's
measured memory, as its log reported it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.llama_server import TINY_ARGS, needs_llama_server
from support.local_serve import ServeProcess, model_manifest, serve_env, write_manifests
from support.polling import wait_until

pytestmark = [pytest.mark.integration, needs_llama_server]
PROMPT = "hello world the a user " * 6  # ~130 tokens with the chat template, well inside the 512 context


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeProcess]:
    from support.tiny_gguf import write_tiny_gguf

    documents = [
        model_manifest("tiny-a", write_tiny_gguf(tmp_path / "a" / "model.gguf", seed=0), "g", {"args": TINY_ARGS}),
        model_manifest("tiny-b", write_tiny_gguf(tmp_path / "b" / "model.gguf", seed=1), "g",
                       {"args": TINY_ARGS, "promptCache": False}),
    ]
    process = ServeProcess.start(write_manifests(tmp_path / "models" / "models.yaml", documents).parent,
                                 serve_env(tmp_path / "state"))
    yield process
    process.stop()


def chat(url: str, model: str, content: str = PROMPT) -> dict[str, Any]:
    """One chat (one token generated); returns the server's ``timings`` (``prompt_n``, ``cache_n``)."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 1,
                       "temperature": 0}).encode()
    request = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200
        answer: dict[str, Any] = json.loads(response.read())
    return answer["timings"]


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def cache_dir(tmp_path: Path, model: str) -> Path:
    """Where a model that is not staged keeps its cache: under the state directory ``serve_env`` set."""
    return tmp_path / "state" / "prompt-cache" / "default" / model


def swap_out_and_back(url: str, model: str, other: str) -> dict[str, Any]:
    """Send the prompt to ``model``, then to ``other`` (a swap), then to ``model`` again (a swap back):
    the timings of the first and the last answer."""
    first = chat(url, model)
    chat(url, other, "hi")
    return {"first": first, "again": chat(url, model)}


def test_a_swapped_out_model_gets_its_prompt_cache_back(serve: ServeProcess, tmp_path: Path) -> None:
    seen = swap_out_and_back(serve.url, "tiny-a", "tiny-b")
    full = seen["first"]["prompt_n"]
    assert full > 100 and seen["first"]["cache_n"] == 0, seen
    assert seen["again"]["prompt_n"] <= 2 and seen["again"]["cache_n"] >= full - 2, seen  # not prefilled again
    assert "model default/tiny-a: saved the prompt cache of 1 slot(s)" in serve.log, serve.log
    assert "model default/tiny-a: restored the prompt cache of 1 slot(s)" in serve.log, serve.log
    assert not list(cache_dir(tmp_path, "tiny-a").iterdir())  # consumed by the restore
    activations = get(serve.url + "/ui/api/status")["activations"]
    swapped_back = [a for a in activations if a["model"] == "default/tiny-a" and a["kind"] == "swap"]
    assert swapped_back and "restore" in {s["stage"] for s in swapped_back[-1]["stages"]}, activations

    off = swap_out_and_back(serve.url, "tiny-b", "tiny-a")  # promptCache: false
    assert off["again"]["prompt_n"] == off["first"]["prompt_n"] > 100, off
    assert "tiny-b: saved the prompt cache" not in serve.log and not cache_dir(tmp_path, "tiny-b").exists()


def test_a_staged_model_keeps_its_cache_beside_the_staged_copy(tmp_path: Path) -> None:
    from support.tiny_gguf import write_tiny_gguf

    staged = {"strategy": "SharedPVC", "flashLoader": {"enabled": True}}
    documents = [
        model_manifest("tiny-a", write_tiny_gguf(tmp_path / "a" / "model.gguf", seed=0), "g", {"args": TINY_ARGS},
                       cache=staged),
        model_manifest("tiny-b", write_tiny_gguf(tmp_path / "b" / "model.gguf", seed=1), "g", {"args": TINY_ARGS}),
    ]
    serve = ServeProcess.start(write_manifests(tmp_path / "models" / "models.yaml", documents).parent,
                               serve_env(tmp_path / "state"))
    try:
        first = chat(serve.url, "tiny-a")
        chat(serve.url, "tiny-b", "hi")
        beside = tmp_path / "state" / "shm" / "default" / "tiny-a.prompt-cache"
        assert (beside / "flexinfer-prompt-cache.json").exists() and (beside / "slot-0.bin").exists()
        assert (tmp_path / "state" / "shm" / "default" / "tiny-a" / "model.gguf").exists()  # the staged copy
        again = chat(serve.url, "tiny-a")
        assert again["prompt_n"] <= 2 and again["cache_n"] >= first["prompt_n"] - 2, (first, again)
    finally:
        serve.stop()
    assert not cache_dir(tmp_path, "tiny-a").exists()


@pytest.mark.parametrize("spoil", ["truncate", "touch the model file"])
def test_a_cache_that_cannot_be_used_is_skipped_not_an_error(serve: ServeProcess, tmp_path: Path,
                                                            spoil: str) -> None:
    chat(serve.url, "tiny-a")
    chat(serve.url, "tiny-b", "hi")  # tiny-a saved
    directory = cache_dir(tmp_path, "tiny-a")
    wait_until((directory / "flexinfer-prompt-cache.json").exists, 10, "the saved manifest")
    if spoil == "truncate":
        slot = directory / "slot-0.bin"
        slot.write_bytes(slot.read_bytes()[:1000])
        reason = "is missing or not"
    else:
        weights = tmp_path / "a" / "model.gguf"
        info = weights.stat()
        os.utime(weights, ns=(info.st_atime_ns, info.st_mtime_ns + 10**9))
        reason = "it was saved for another model file"
    again = chat(serve.url, "tiny-a")
    assert again["prompt_n"] > 100 and again["cache_n"] == 0, again  # answered as if there were no cache
    assert "model default/tiny-a: " in serve.log and reason in serve.log, serve.log
    assert not (directory / "flexinfer-prompt-cache.json").exists()


def test_the_measured_memory_is_shown(serve: ServeProcess) -> None:
    chat(serve.url, "tiny-a", "hi")
    rows = {row["name"]: row for row in get(serve.url + "/admin/status")["models"]}
    memory = rows["tiny-a"]["memory"]
    assert memory["complete"] and memory["model_mib"] == pytest.approx(0.46, abs=0.01), memory
    assert memory["kv_mib"] > 0 and memory["compute_mib"] > 0 and memory["devices"] == {
        "host": memory["total_mib"]}, memory
    assert rows["tiny-b"]["memory"] is None  # never started
    done = subprocess.run([sys.executable, "-m", "flexinfer.cli.main", "ps", "-o", "wide", "--url", serve.url],
                          capture_output=True, text=True, timeout=60, check=True)
    wide = done.stdout
    assert f"{memory['total_mib']:.1f} MiB ({memory['model_mib']:.1f}+{memory['kv_mib']:.1f}+" in wide, wide


def test_a_removed_model_loses_its_cache(serve: ServeProcess, tmp_path: Path) -> None:
    chat(serve.url, "tiny-a")
    chat(serve.url, "tiny-b", "hi")  # tiny-a saved
    directory = cache_dir(tmp_path, "tiny-a")
    wait_until((directory / "flexinfer-prompt-cache.json").exists, 10, "the saved manifest")
    manifests = tmp_path / "models" / "models.yaml"
    kept = [doc for doc in yaml.safe_load_all(manifests.read_text()) if doc["metadata"]["name"] != "tiny-a"]
    write_manifests(manifests, kept)  # the file watch reloads it
    wait_until(lambda: not directory.exists(), 30, "the removed model's cache directory to go")
    assert not cache_dir(tmp_path, "tiny-b").exists()  # promptCache: false never made one
