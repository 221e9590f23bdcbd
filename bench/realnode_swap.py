"""Real-node cold start and swap, split into stages (``hack/kube-node``; root; changes the host until ``down``).

Run by hand (``sudo .venv/bin/python bench/realnode_swap.py --rounds 3``); prints figures, asserts nothing. A
round after the first starts once both Models idled out (no hold applies to a group with nothing Ready).
Uses the node if it is up (else starts it and stops it at the end), the images ``hack/build-images`` builds,
the chart installed as in tests/integration/realnode, and two tiny llama.cpp Models in one shared group on
the node's single ``amd.com/gpu`` (tiny-b has the higher priority). Each round: with both Idle, a request for
tiny-a (cold start), then one for tiny-b (swap). Times come from a watch on the API server (received by this
process, ~ms resolution) and from the runtime's timestamp on the server's log line that says it listens:

    request → demand report       the proxy's ``ModelDemand`` report of the request (``lastActiveTime``) lands
    → loser preempted             swap only: the manager's election marks the loser Preempted
    → loser scaled to 0           swap only: the manager reads the proxies' reports afresh (none in flight: no
                                  drain to wait for) and scales the loser's Deployment to zero
    → loser's containers exited   swap only: the kubelet stops the loser's containers and reports them exited
    → loser's pod gone            swap only: the manager deletes the exited pod at once (the winner is scaled
                                  up only then, so its pod never waits out the scheduler's back-off)
    → Deployment scaled           the manager scales the winner's Deployment up
    → pod created                 ReplicaSet controller
    → scheduled (back-off)        scheduler; a pod Pending on the device would wait out its back-off here
    → container running           kubelet + containerd (sandbox, image present, container start)
    → server listening            llama.cpp server start (model load), from its log
    → Model Ready                 the manager's own health request answered (or the kubelet's probe), status
    → reply (kube-proxy)          proxy notices Ready and forwards (its in-flight report, the drain gate, was
                                  written while the request waited; a Ready version the watch delivered after
                                  the read that followed it needs no other write or read), to the pod's
                                  address (through the Service only with ``controller.podEndpoints=false``,
                                  where kube-proxy's programming shows here), one token generated

A stage whose mark comes before the previous one counts zero. Printed apart: "winner Active" (request → the
winner's status says Active: written after the writes on the path, so not a stage), "in-flight report vs Ready"
(when the proxy's in-flight report for the request landed, from Model Ready: negative when it was written while the
request waited) and "pod Ready (kubelet)" (when the kubelet's probe saw the
server, after it listened: what readiness cost before the manager asked the pod itself). FlexInfer's own part is
the stages its processes (proxy, manager) and their API writes take: demand report, loser preempted, loser scaled
to 0, loser's pod gone (unless the kubelet reported no exited containers: then it removed the pod itself and
the stage is its own), Deployment scaled, Model Ready and reply, less "of reply: model server" (the model server's
answer as the proxy timed it, ``upstream=`` in its access log: the first token of a just-started llama-server, 7
to 41 ms here; at most the reply stage, which this process starts when its own watch shows Ready, after the proxy's
did); the rest is Kubernetes' and the server's time. "same, with the server's answer" keeps it in, as earlier
tables did.
The API server's own time for each write on the path is in its audit log when the node was started with
``FLEXINFER_NODE_AUDIT_LOG`` (``hack/kube-node``; docs/performance.md).

``--mode group`` runs the same rounds with the group in group-pod mode (``controller.groupStrategies``
TimeSliced; the members' image is ``hack/build-images group``'s, FlexInfer with llama-server). A round then
starts with the group pod scaled to zero (every member idled out), so the first request is the group pod's cold
start; the second is a swap inside the running pod:

    request → Deployment scaled   proxy demand → the manager scales the group pod's Deployment to 1
    → pod created, scheduled, container running   as above (the pod requests the GPU once)
    → pod answers                 ``flexinfer serve`` in the pod listens and the manager publishes it
                                  (``sharedGroup.groupEndpoint``); the proxy forwards the held request
    → reply                       the pod's engine starts llama-server, one token generated

A swap inside the pod is one stage, request → reply (the pod's engine drains, stops and starts servers); the
engine's own swap time (the ``flexinfer_model_swap_duration_seconds`` sample the manager replays) is printed
beside it, and the rest is the proxy's forwarding.

For a cold start it also prints, apart from the stages: "serve's own start (in the pod)" (exec → listening, as
``flexinfer serve`` reports it on its ``listening on`` line), "of pod answers: serve starting" (how much of it came
after the kubelet's running report, so on the request's path: the rest ran while the kubelet had not reported the
container yet), "of reply: llama-server's start" (the pod's ``server_start`` + ``health`` stage samples on its own
/metrics) and "of reply: llama-server's answer" (``upstream=`` of the pod's access log line for the request).
FlexInfer's part is the manager's decision, the "pod answers" stage and the reply stage less llama-server's start
and answer; "same, serve's whole start counted" counts serve's start in full, as if none of it had overlapped the
kubelet's report.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import time
import urllib.request
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support import real_node
from support.real_node import NAMESPACE, ApiWatch, RealNode, wait_for

SERVING_LINES = ("server is listening", "listening on", "Uvicorn running on")
"""What a model server logs once it serves (llama.cpp's llama-server; llama-cpp-python)."""
HOLD_S = 15.0
"""The chart's ``swap.minHold``: a Ready holder keeps the GPU this long. The swap's request is sent once tiny-a has
held it that long, so the figures are the swap's own, not the hold's."""
IDLE_TIMEOUT = "30s"
"""Both Models idle out this long after their last request, so every round starts with no model server running
(and nothing counts as demand for a model nobody asked for since)."""
STAGES = ("demand report", "loser preempted", "loser scaled to 0", "loser's containers exited", "loser's pod gone",
          "Deployment scaled", "pod created", "scheduled (back-off)", "container running", "server listening",
          "Model Ready", "reply (kube-proxy)")
LOSER_STAGES = STAGES[1:5]
OWN = ("demand report", "loser preempted", "loser scaled to 0", "loser's pod gone", "Deployment scaled", "Model Ready",
       "reply (kube-proxy)")
"""The stages FlexInfer's own code spends (the rest is Kubernetes, the runtime and the model server)."""


def condition(obj: dict[str, Any], kind: str) -> bool:
    return any(c["type"] == kind and c["status"] == "True" for c in obj.get("status", {}).get("conditions", []))


def running(obj: dict[str, Any]) -> bool:
    return any("running" in c.get("state", {}) and c["name"] == "model"
               for c in obj.get("status", {}).get("containerStatuses", []))


def logged_at(line: str, monotonic_now: float) -> float:
    """When a ``kubectl logs --timestamps`` line was written (the runtime's stamp), on this process's monotonic
    clock."""
    stamp = datetime.fromisoformat(line.split(maxsplit=1)[0][:26] + "+00:00").timestamp()
    return monotonic_now - (time.time() - stamp)


def access_upstream(lines: list[str], request_id: str) -> float | None:
    """``upstream=`` (the model server's time) of the access log line for ``request_id``: ``None`` while that
    line is not in ``lines`` (it is written once the reply has been sent), NaN when nothing was forwarded."""
    found = next((line for line in lines if f"request_id={request_id}" in line and " upstream=" in line), None)
    if found is None:
        return None
    value = found.split(" upstream=", 1)[1].split(" ", 1)[0]  # "0.004s", or "-"
    return math.nan if value == "-" else float(value.removesuffix("s"))


def sample_sum(text: str, name: str, model: str, *labels: str) -> float:
    """The sum of the ``name`` samples for ``model`` in a /metrics exposition, only those with one of ``labels``
    (``key="value"``) when given."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and f'model="{model}"' in line
               and (not labels or any(label in line for label in labels)))


def listening_at(node: RealNode, model: str, monotonic_now: float) -> float | None:
    """The runtime's timestamp of the server's line that says it listens, on this process's monotonic clock."""
    out = node.kubectl("logs", "-n", NAMESPACE, "-l", f"flexinfer.ai/model={model}", "-c", "model",
                       "--timestamps", "--tail", "200", check=False).stdout
    for line in out.splitlines():
        if any(words in line for words in SERVING_LINES):
            return logged_at(line, monotonic_now)
    return None


def reported(model: str, field: str, since: float = 0.0) -> Callable[[dict[str, Any]], bool]:
    """A proxy's ModelDemand report holding ``field`` for ``model`` (a time no older than wall time ``since``)."""
    def holds(obj: dict[str, Any]) -> bool:
        value = str(((obj.get("spec", {}).get("models") or {}).get(model) or {}).get(field) or "")
        return bool(value) and datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() >= since
    return holds


def group_state(state: str) -> Callable[[dict[str, Any]], bool]:
    return lambda obj: (obj.get("status", {}).get("sharedGroup") or {}).get("state") == state


def exited(obj: dict[str, Any]) -> bool:
    statuses = obj.get("status", {}).get("containerStatuses") or []
    return bool(statuses) and all("terminated" in c.get("state", {}) for c in statuses)


def measure(node: RealNode, watcher: ApiWatch, base: str, model: str, loser: str | None) -> dict[str, float]:
    sent, sent_wall = time.monotonic(), time.time()
    body = json.dumps({"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}).encode()
    req = urllib.request.Request(f"{base}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        resp.read()
        request_id = resp.headers.get("X-Request-ID", "")
    reply = time.monotonic()
    listening = listening_at(node, model, time.monotonic())
    marks = {
        "demand report": watcher.first(sent, "ModelDemand", None, reported(model, "lastActiveTime", sent_wall - 0.01)),
        "Deployment scaled": watcher.first(sent, "Deployment", model, lambda o: o["spec"].get("replicas") == 1),
        "pod created": watcher.first(sent, "Pod", model, lambda o: True),
        "scheduled (back-off)": watcher.first(sent, "Pod", model, lambda o: condition(o, "PodScheduled")),
        "container running": watcher.first(sent, "Pod", model, running),
        "server listening": listening,
        "Model Ready": watcher.first(sent, "Model", model, lambda o: o.get("status", {}).get("phase") == "Ready"),
        "reply (kube-proxy)": reply,
    }
    if loser is not None:
        marks |= {
            "loser preempted": watcher.first(sent, "Model", loser, group_state("Preempted")),
            "loser scaled to 0": watcher.first(sent, "Deployment", loser, lambda o: o["spec"].get("replicas") == 0),
            "loser's containers exited": watcher.first(sent, "Pod", loser, exited),
            "loser's pod gone": watcher.first(sent, "Pod", loser, lambda o: o.get("watchEventType") == "DELETED"),
        }
    out, previous = {}, sent
    for stage in STAGES:
        at = marks.get(stage)
        if at is None:
            out[stage] = 0.0 if loser is None and stage in LOSER_STAGES else math.nan
            continue
        out[stage] = max(0.0, at - previous)
        previous = max(previous, at)
    wait_for(lambda: watcher.first(sent, "Pod", model, lambda o: condition(o, "Ready")) is not None, 30,
             f"{model}'s pod Ready (kubelet)")  # it now comes after the reply
    kubelet = watcher.first(sent, "Pod", model, lambda o: condition(o, "Ready"))
    out["pod Ready (kubelet)"] = kubelet - listening if kubelet is not None and listening is not None else math.nan
    decided = watcher.first(sent, "Model", model, group_state("Active"))
    out["winner Active"] = decided - sent if decided is not None else math.nan
    ready = marks["Model Ready"]
    in_flight = watcher.first(sent, "ModelDemand", None, reported(model, "inFlightAt", sent_wall - 0.01))
    out["in-flight report vs Ready"] = in_flight - ready if in_flight is not None and ready else math.nan
    out["total"] = reply - sent
    # Without the exited report the manager had nothing to reap: the kubelet removed the pod itself (after the
    # server's own shutdown), so that stage was not FlexInfer's.
    reaped = loser is None or marks.get("loser's containers exited") is not None
    with_answer = sum(out[stage] for stage in OWN if reaped or stage != "loser's pod gone")
    out["of reply: model server"] = upstream_seconds(node, request_id)
    # The reply stage starts when this process saw Ready, after the proxy did: the server's answer counts out of it
    # only as far as the stage goes.
    out["FlexInfer's part"] = with_answer - min(out["reply (kube-proxy)"], out["of reply: model server"])
    out["same, with the server's answer"] = with_answer
    return out


def upstream_seconds(node: RealNode, request_id: str) -> float:
    """How long the model server took to answer the request (from the proxy forwarding it to the answer's end:
    ``upstream=`` of the proxy's access log line for ``request_id``): the server's time, not FlexInfer's."""
    def answer() -> list[float] | None:  # a list: an answer of 0.0 s is found too
        logs = node.kubectl("logs", "-n", NAMESPACE, "deploy/flexinfer-proxy", "--tail", "400", check=False).stdout
        seconds = access_upstream(logs.splitlines(), request_id)
        return None if seconds is None else [seconds]
    found: list[float] = wait_for(answer, 10, f"the proxy's access log line for request {request_id}")
    return found[0]


GROUP_POD = f"flexinfer-group-{real_node.SHARED_GROUP}"
GROUP_STAGES = ("Deployment scaled", "pod created", "scheduled (back-off)", "container running", "pod answers",
                "reply")
GROUP_OWN = ("Deployment scaled", "pod answers")
"""In group-pod mode FlexInfer's own stages of a cold start: the manager's decision, and the time from the kubelet's
running report until the manager sees the pod answer and publishes it (``flexinfer serve``'s start when it outlasts
that report, the manager's asks, its status write). Of the reply stage, FlexInfer's part is what is left after the
pod's llama-server started (the pod's ``server_start`` and ``health`` stage samples) and answered (``upstream=`` of
the pod's access log line for the request): the proxy's and the pod's forwarding and the pod engine's own steps."""
SERVE_STARTED = re.compile(r"flexinfer serve: listening on .*started in ([0-9.]+) s")
"""``flexinfer serve``'s line once it listens, with its own start-up (exec → listening; the kernel's record)."""
SERVER_START_STAGES = ("server_start", "health")
"""The pod engine's startup stages that are llama-server's own start: spawned → port open → health answers."""


def group_running(obj: dict[str, Any]) -> bool:
    return any("running" in c.get("state", {}) for c in obj.get("status", {}).get("containerStatuses", []))


def forwarded(obj: dict[str, Any]) -> bool:
    return bool((obj.get("status", {}).get("sharedGroup") or {}).get("groupEndpoint"))


def chat(base: str, model: str) -> tuple[float, str]:
    """One request through the proxy; returns when the reply arrived (``time.monotonic``) and its request id."""
    body = json.dumps({"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}).encode()
    req = urllib.request.Request(f"{base}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        resp.read()
        return time.monotonic(), resp.headers.get("X-Request-ID", "")


def group_pod_log(node: RealNode) -> list[str]:
    """The group pod's ``flexinfer`` container log, each line with the runtime's timestamp first."""
    out: str = node.kubectl("logs", "-n", NAMESPACE, "-l", f"flexinfer.ai/model={GROUP_POD}", "-c", "flexinfer",
                            "--timestamps", "--tail", "2000", check=False).stdout
    return out.splitlines()


def serve_started(lines: list[str], monotonic_now: float) -> tuple[float, float] | None:
    """From the group pod's log: when ``flexinfer serve`` listened (this process's monotonic clock) and how long
    its own start took, or ``None`` when the line is not there."""
    for line in lines:
        found = SERVE_STARTED.search(line)
        if found:
            return logged_at(line, monotonic_now), float(found[1])
    return None


def pod_server_start(node: RealNode, model: str) -> float:
    """Seconds the group pod's llama-server took to start for ``model``: the sums of its ``server_start`` and
    ``health`` stage samples on the pod's own /metrics (the pod is new at each cold start: these are this start's)."""
    pods = node.get("pods", "-n", NAMESPACE, "-l", f"flexinfer.ai/model={GROUP_POD}")["items"]
    with urllib.request.urlopen(f"http://{pods[0]['status']['podIP']}:8080/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sample_sum(text, "flexinfer_model_startup_stage_duration_seconds_sum", model,
                      *(f'stage="{stage}"' for stage in SERVER_START_STAGES))


def logged(node: RealNode, request_id: str) -> list[str] | None:
    """The group pod's log once it holds the access log line for ``request_id``."""
    lines = group_pod_log(node)
    return lines if access_upstream(lines, request_id) is not None else None


def measure_group(node: RealNode, watcher: ApiWatch, base: str, model: str, cold: bool) -> dict[str, float]:
    sent = time.monotonic()
    reply, request_id = chat(base, model)
    if not cold:
        return {"reply": reply - sent, "total": reply - sent}
    marks = {
        "Deployment scaled": watcher.first(sent, "Deployment", GROUP_POD, lambda o: o["spec"].get("replicas") == 1),
        "pod created": watcher.first(sent, "Pod", GROUP_POD, lambda o: True),
        "scheduled (back-off)": watcher.first(sent, "Pod", GROUP_POD, lambda o: condition(o, "PodScheduled")),
        "container running": watcher.first(sent, "Pod", GROUP_POD, group_running),
        "pod answers": watcher.first(sent, "Model", model, forwarded),
        "reply": reply,
    }
    out, previous = {}, sent
    for stage in GROUP_STAGES:
        at = marks[stage]
        out[stage] = math.nan if at is None else max(0.0, at - previous)
        previous = previous if at is None else max(previous, at)
    out["total"] = reply - sent
    lines = wait_for(lambda: logged(node, request_id), 10, f"the group pod's access log line for {request_id}")
    serve = serve_started(lines, time.monotonic())
    listened, out["serve's own start (in the pod)"] = serve if serve is not None else (math.nan, math.nan)
    running_at = marks["container running"]
    out["of pod answers: serve starting"] = (
        min(out["pod answers"], max(0.0, listened - running_at)) if serve is not None and running_at else math.nan)
    out["of reply: llama-server's start"] = pod_server_start(node, model)
    answer = access_upstream(lines, request_id)
    out["of reply: llama-server's answer"] = math.nan if answer is None else answer
    server = out["of reply: llama-server's start"] + out["of reply: llama-server's answer"]
    out["FlexInfer's part"] = sum(out[stage] for stage in GROUP_OWN) + max(out["reply"] - server, 0.0)  # NaN stays
    out["same, serve's whole start counted"] = (out["FlexInfer's part"] - out["of pod answers: serve starting"]
                                                + out["serve's own start (in the pod)"])
    return out


def swap_seconds(node: RealNode, model: str) -> float:
    """The sum of the manager's swap samples for ``model`` (the pod's engine's own swap times, replayed)."""
    return sample_sum(real_node.manager_metrics_text(node), "flexinfer_model_swap_duration_seconds_sum", model)


def group_idle(node: RealNode) -> None:
    """Until every member idled out and the group pod is gone (scale to zero)."""
    wait_for(lambda: not node.get("pods", "-n", NAMESPACE, "-l", f"flexinfer.ai/model={GROUP_POD}")["items"], 240,
             "no group pod")


def setup(node: RealNode, mode: str = "default") -> str:
    names = ("flexinfer", "llamacpp", "group") if mode == "group" else ("flexinfer", "llamacpp")
    tars = real_node.build_images(*names)
    node.import_images(*tars)
    values = ((f"controller.groupStrategies.{real_node.SHARED_GROUP}=TimeSliced",
               f"controller.runtime.backendImages.llamacpp={real_node.GROUP_IMAGE}") if mode == "group" else ())
    real_node.install_chart(node, *values)
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
    parser.add_argument("--mode", choices=("default", "group"), default="default",
                        help="default: one Deployment per Model; group: the group runs in one group pod")
    args = parser.parse_args()
    reason = real_node.unavailable_reason()
    if reason:
        print(reason)
        return 1
    node = real_node.start()
    try:
        base = setup(node, args.mode)
        if args.mode == "group":
            group_rounds(node, base, args.rounds)
            return 0
        results: dict[str, list[dict[str, float]]] = {"cold start tiny-a": [], "swap tiny-a → tiny-b": []}
        with ApiWatch(node, demands=True) as watcher:  # closed before the node goes down
            for _ in range(args.rounds):
                idle(node)
                results["cold start tiny-a"].append(measure(node, watcher, base, "tiny-a", None))
                time.sleep(HOLD_S)  # the hold is policy, not part of a swap
                results["swap tiny-a → tiny-b"].append(measure(node, watcher, base, "tiny-b", "tiny-a"))
        for what, rounds in results.items():
            print(f"\n{what} ({len(rounds)} rounds), median seconds (each round)")
            for stage in (*STAGES, "winner Active", "in-flight report vs Ready", "pod Ready (kubelet)", "total",
                          "of reply: model server", "FlexInfer's part", "same, with the server's answer"):
                each = " ".join(f"{r[stage]:.3f}" for r in rounds)
                print(f"  {stage:<30} {statistics.median(r[stage] for r in rounds):7.3f}   ({each})")
    finally:
        if node.started:
            real_node.stop()
    return 0


def group_rounds(node: RealNode, base: str, rounds: int) -> None:
    results: dict[str, list[dict[str, float]]] = {"cold start tiny-a (group pod absent)": [],
                                                  "swap tiny-a → tiny-b (inside the pod)": []}
    with ApiWatch(node) as watcher:
        for _ in range(rounds):
            group_idle(node)
            results["cold start tiny-a (group pod absent)"].append(measure_group(node, watcher, base, "tiny-a", True))
            time.sleep(HOLD_S)  # the hold is policy, not part of a swap
            before = swap_seconds(node, "tiny-b")
            swap = measure_group(node, watcher, base, "tiny-b", False)
            wait_for(lambda b=before: swap_seconds(node, "tiny-b") > b, 30, "the pod's swap sample")
            swap["engine swap (pod)"] = swap_seconds(node, "tiny-b") - before
            results["swap tiny-a → tiny-b (inside the pod)"].append(swap)
    for what, measured in results.items():
        print(f"\n{what} ({len(measured)} rounds), median seconds (each round)")
        for stage in measured[0]:
            each = " ".join(f"{r[stage]:.3f}" for r in measured)
            print(f"  {stage:<36} {statistics.median(r[stage] for r in measured):7.3f}   ({each})")


if __name__ == "__main__":
    sys.exit(main())
