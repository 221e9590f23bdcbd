"""The llamacpp backend on the real ``llama-server``, measured through ``flexinfer serve``, in one run:

1. local swap request → reply: two tiny models (generated, ~0.5 MB) in one GPU group, each request for the
   model that is not loaded (the swap: drain, stop, start, health check, answer);
2. local cold start request → reply: the same tiny model unloaded before each request;
3. time to first token of a ~2,000-token prompt sent again after the model was swapped out and back in, with
   the prompt-cache restore (``spec.config.promptCache``, the default) and without it (``false``), next to
   the same prompt sent again to a server that was never swapped out. The model is generated large enough
   that prefill dominates (embedding 512, 8 layers, feed-forward 2048, f32: 135 MB; ~1.2-1.8 s of prefill on
   two cores). Each measured request asks for one token without streaming, so its reply time is its time to
   first token; "after load" loads the model back first (``flexinfer load``), "on demand" lets the request
   itself swap it back in.

Rows 1 and 2 are repeated with llama-cpp-python's server (``spec.config.llamacppServer: python``) when it is
installed, for the figures before the change. Prints a table; asserts nothing. Run:

    PATH=~/.cache/flexinfer/bin:$PATH .venv/bin/python bench/llama_server_swap.py [--rounds 10]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.llama_server import PYTHON_SERVER, TINY_ARGS
from support.local_serve import ServeProcess, model_manifest, serve_env, write_manifests
from support.tiny_gguf import Dimensions, write_tiny_gguf

LARGE = Dimensions(embd=512, layers=8, ff=2048, ctx=4096)
LARGE_ARGS = ["--ctx-size", "4096"]
PROMPT = " ".join(["hello world the a user"] * 90)  # 1,998 tokens with the tiny vocabulary and template


def post(url: str, body: dict[str, Any] | None = None, timeout: float = 300) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body or {}).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def ask(url: str, model: str, content: str = "hi") -> tuple[float, dict[str, Any]]:
    """Seconds from send to the whole reply (one token), and the server's timings."""
    started = time.perf_counter()
    answer = post(url + "/v1/chat/completions", {"model": model, "max_tokens": 1, "temperature": 0,
                                                 "messages": [{"role": "user", "content": content}]})
    return time.perf_counter() - started, answer.get("timings", {})


def serve(workdir: Path, documents: list[dict[str, Any]]) -> ServeProcess:
    manifests = write_manifests(workdir / "models" / "models.yaml", documents).parent
    return ServeProcess.start(manifests, serve_env(workdir / "state"), extra=("--no-access-log",))


def swap_and_cold(workdir: Path, config: dict[str, Any], rounds: int) -> tuple[list[float], list[float]]:
    """(swap reply times, cold-start reply times) for two tiny models with ``config``."""
    documents = [model_manifest(name, write_tiny_gguf(workdir / name / "model.gguf", seed=seed), "g", config)
                 for seed, name in enumerate(("tiny-a", "tiny-b"))]
    process = serve(workdir, documents)
    try:
        ask(process.url, "tiny-a")  # the first start (cold) is not a swap
        swaps = [ask(process.url, model)[0] for model in ["tiny-b", "tiny-a"] * rounds]
        colds = []
        for _ in range(rounds):
            post(f"{process.url}/admin/models/tiny-a/unload")
            colds.append(ask(process.url, "tiny-a")[0])
    finally:
        process.stop()
    return swaps, colds


def time_to_first_token(workdir: Path, rounds: int) -> dict[str, list[tuple[float, dict[str, Any]]]]:
    """Reply times (and the server's timings) of the long prompt sent again: never swapped, swapped with and
    without the restore."""
    weights = write_tiny_gguf(workdir / "large" / "model.gguf", dims=LARGE)
    documents = [
        model_manifest("large", weights, "g", {"args": LARGE_ARGS}),
        model_manifest("large-nocache", weights, "g", {"args": LARGE_ARGS, "promptCache": False}),
        model_manifest("other", write_tiny_gguf(workdir / "other" / "model.gguf"), "g", {"args": TINY_ARGS}),
    ]
    process = serve(workdir, documents)
    out: dict[str, list[tuple[float, dict[str, Any]]]] = {key: [] for key in (
        "first (full prefill)", "never swapped", "restore, after load", "restore, on demand",
        "no restore, after load", "no restore, on demand")}
    try:
        for index in range(rounds):
            prompt = f"{index} {PROMPT}"  # a new prefix each round: nothing cached from the round before
            for model, label in (("large", "restore"), ("large-nocache", "no restore")):
                out["first (full prefill)"].append(ask(process.url, model, prompt))
                out["never swapped"].append(ask(process.url, model, prompt))
                ask(process.url, "other")  # swapped out
                post(f"{process.url}/admin/models/other/unload")  # a load waits for a free group
                post(f"{process.url}/admin/models/{model}/load?wait=true")
                out[f"{label}, after load"].append(ask(process.url, model, prompt))
                ask(process.url, "other")  # swapped out again
                out[f"{label}, on demand"].append(ask(process.url, model, prompt))
    finally:
        process.stop()
    return out


def row(label: str, samples: list[float]) -> str:
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return (f"  {label:<40} n={len(samples):<3} median {statistics.median(samples):7.3f} s   p90 {p90:7.3f} s   "
            f"max {max(samples):7.3f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--ttft-rounds", type=int, default=3)
    args = parser.parse_args()
    servers = {"llama-server": {"args": TINY_ARGS}}
    if importlib.util.find_spec("llama_cpp") is not None:
        servers["python -m llama_cpp.server"] = PYTHON_SERVER
    with tempfile.TemporaryDirectory(prefix="flexinfer-bench-") as tmp:
        print("local swap and cold start, request -> reply (tiny models, goal <= 0.25 s and <= 0.2 s)")
        for index, (name, config) in enumerate(servers.items()):
            swaps, colds = swap_and_cold(Path(tmp) / f"tiny{index}", config, args.rounds)
            print(row(f"{name}: swap", swaps))
            print(row(f"{name}: cold start", colds))
        print(f"time to first token, {len(PROMPT)} characters (~2,000 tokens) sent again "
              "(goal <= 1.3 x never swapped)")
        ttft = time_to_first_token(Path(tmp) / "large", args.ttft_rounds)
        baseline = statistics.median(seconds for seconds, _ in ttft["never swapped"])
        for label, samples in ttft.items():
            seconds = [took for took, _ in samples]
            prefilled = statistics.median(timings.get("prompt_n", 0) for _, timings in samples)
            print(row(label, seconds) + f"   {statistics.median(seconds) / baseline:5.2f} x   "
                  f"prefilled {prefilled:.0f} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
