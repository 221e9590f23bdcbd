"""Real-node cold start and swap, split into stages (``hack/kube-node``; root; changes the host until ``down``).

Run by hand (``sudo .venv/bin/python bench/realnode_swap.py --rounds 3``); prints figures, asserts nothing. A
round after the first starts once both Models idled out (no hold applies to a group with nothing Ready).
Uses the node if it is up (else starts it and stops it at the end), the images ``hack/build-images`` builds,
the chart installed as in tests/integration/realnode, and two tiny llama.cpp Models in one shared group on
the node's single ``amd.com/gpu`` (tiny-b has the higher priority). Each round: with both Idle, a request for
tiny-a (cold start), then one for tiny-b (swap). Times come from a watch on the API server (received by this
process, ~ms resolution) and from the runtime's timestamp on the server's "Uvicorn running" log line:

    request → Deployment scaled   the decision (proxy demand → manager election → scale)
    → pod created                 ReplicaSet controller
    → pod scheduled               scheduler (for a swap: includes Pending on the GPU while the loser drains)
    → container running           kubelet + containerd (sandbox, image present, container start)
    → server listening            llama.cpp server start (model load), from its log
    → pod Ready                   readiness detection (probe period)
    → Model Ready                 manager status update
    → reply                       proxy notices Ready, forwards; one token generated

The control-plane overhead is decision + (Model Ready → reply) + (pod Ready → Model Ready): FlexInfer's own
part, on top of Kubernetes' and the server's time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support import real_node
from support.real_node import NAMESPACE, ApiWatch, RealNode, wait_for

IDLE_TIMEOUT = "15s"
"""Both Models idle out this long after their last request, so every round starts with no model server running
(and nothing counts as demand for a model nobody asked for since)."""
STAGES = ("decision", "pod created", "scheduled", "container running", "server listening", "pod Ready",
          "Model Ready", "reply")


def condition(obj: dict[str, Any], kind: str) -> bool:
    return any(c["type"] == kind and c["status"] == "True" for c in obj.get("status", {}).get("conditions", []))


def running(obj: dict[str, Any]) -> bool:
    return any("running" in c.get("state", {}) and c["name"] == "model"
               for c in obj.get("status", {}).get("containerStatuses", []))


def listening_at(node: RealNode, model: str, monotonic_now: float) -> float | None:
    """The runtime's timestamp of the server's "Uvicorn running" line, on this process's monotonic clock."""
    out = node.kubectl("logs", "-n", NAMESPACE, "-l", f"flexinfer.ai/model={model}", "-c", "model",
                       "--timestamps", "--tail", "200", check=False).stdout
    for line in out.splitlines():
        if "Uvicorn running" in line:
            stamp = datetime.fromisoformat(line.split()[0][:26] + "+00:00").timestamp()
            return monotonic_now - (time.time() - stamp)
    return None


def measure(node: RealNode, watcher: ApiWatch, base: str, model: str) -> dict[str, float]:
    sent = time.monotonic()
    body = json.dumps({"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}).encode()
    req = urllib.request.Request(f"{base}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        resp.read()
    reply = time.monotonic()
    marks = {
        "decision": watcher.first(sent, "Deployment", model, lambda o: o["spec"].get("replicas") == 1),
        "pod created": watcher.first(sent, "Pod", model, lambda o: True),
        "scheduled": watcher.first(sent, "Pod", model, lambda o: condition(o, "PodScheduled")),
        "container running": watcher.first(sent, "Pod", model, running),
        "server listening": listening_at(node, model, time.monotonic()),
        "pod Ready": watcher.first(sent, "Pod", model, lambda o: condition(o, "Ready")),
        "Model Ready": watcher.first(sent, "Model", model, lambda o: o.get("status", {}).get("phase") == "Ready"),
        "reply": reply,
    }
    out, previous = {}, sent
    for stage in STAGES:
        at = marks[stage]
        if at is None:
            out[stage] = float("nan")
            continue
        out[stage] = max(0.0, at - previous)
        previous = max(previous, at)
    out["total"] = reply - sent
    out["overhead"] = out["decision"] + out["Model Ready"] + out["reply"]
    return out


def setup(node: RealNode) -> str:
    tars = real_node.build_images("flexinfer", "llamacpp")
    node.import_images(*tars)
    real_node.install_chart(node)
    real_node.create_weights(node)
    node.apply(real_node.shared_models_manifest())
    for model in ("tiny-a", "tiny-b"):
        node.kubectl("patch", "mdl", model, "-n", NAMESPACE, "--type", "merge", "-p",
                     json.dumps({"spec": {"serverless": {"idleTimeout": IDLE_TIMEOUT}}}))
    ip = node.get("service", "flexinfer-proxy", "-n", NAMESPACE)["spec"]["clusterIP"]
    return f"http://{ip}"


def idle(node: RealNode) -> None:
    """Until both Models idled out (``IDLE_TIMEOUT``) and their pods are gone: the next round starts from an empty
    card (the election's hold only keeps a Ready holder, so none applies then)."""
    wait_for(lambda: not node.get("pods", "-n", NAMESPACE, "-l", "flexinfer.ai/model")["items"], 180, "no model pods")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    reason = real_node.unavailable_reason()
    if reason:
        print(reason)
        return 1
    node = real_node.start()
    try:
        base = setup(node)
        results: dict[str, list[dict[str, float]]] = {"cold start tiny-a": [], "swap tiny-a → tiny-b": []}
        with ApiWatch(node) as watcher:  # closed before the node goes down
            for _ in range(args.rounds):
                idle(node)
                results["cold start tiny-a"].append(measure(node, watcher, base, "tiny-a"))
                results["swap tiny-a → tiny-b"].append(measure(node, watcher, base, "tiny-b"))
        for what, rounds in results.items():
            print(f"\n{what} ({len(rounds)} rounds), median seconds")
            for stage in (*STAGES, "total", "overhead"):
                print(f"  {stage:<20} {statistics.median(r[stage] for r in rounds):7.3f}")
    finally:
        if node.started:
            real_node.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
