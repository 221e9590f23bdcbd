"""Journey step 8: the manager's cold-start samples end when the server answered, and a server that dies and is
restarted in place is one more sample (issue #25, items 2 and 3; issue #28, Ready without probe periods).

A pinned llama.cpp Model (`serverless.enabled: false`: the manager starts it at once and keeps its replica)
cold-starts; this test watches the API itself (`ApiWatch`: Deployment, Pod and Model changes as they arrive) and
reads the model server's own log (`kubectl logs --timestamps`: containerd's time of each line). The manager asks
the starting pod's server itself (every 0.1 s), so its sample — `status.activation.decidedAt` plus the
histogram's value — ends when the server first answered: not before the log line that says it serves, at most
`ANSWER_S` after it (or after the pod showed its container running, which the kubelet reports up to a second
late), and never later than the pod's `Ready` transition as this test's watch saw it (the kubelet
writes that at its next probe, up to a probe period later; the sample used to end there).

Then the server is killed in its container (SIGTERM to PID 1; the kubelet restarts the container, the pod and
its replica stay): the Model goes Ready → Loading → Ready, and the manager records one more cold-start sample,
from the moment it saw the model go to when the restarted server answered, its stages adding up to it. It used
to record nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from flexinfer.core.manifests.deployment import READINESS_PROBE_PERIOD_S, STARTUP_PROBE_PERIOD_S
from support.real_node import (
    NAMESPACE,
    WEIGHTS_CLAIM,
    ApiWatch,
    RealNode,
    manager_metrics_text,
    pod_ready,
    record,
    wait_for,
)

MODEL = "tiny-ready"
MANIFEST = f"""
apiVersion: ai.flexinfer/v1alpha2
kind: Model
metadata: {{name: {MODEL}, namespace: {NAMESPACE}}}
spec:
  backend: llamacpp
  source: pvc://{WEIGHTS_CLAIM}/tiny-a.gguf
  serverless: {{enabled: false}}
  resources: {{requests: {{cpu: 50m, memory: 64Mi}}, limits: {{memory: 1Gi}}}}
"""
TRUTH_S = 0.05
"""Clock slack between this test's watch, containerd's log stamps and the manager."""
ANSWER_S = 0.5
"""Longest time from the server saying it serves, and the pod showing its container running, to the manager's
answered health request: one 0.1 s interval, the request, and a loaded 2-core machine's scheduling."""
PROBES_S = STARTUP_PROBE_PERIOD_S + READINESS_PROBE_PERIOD_S + 1.0
"""Longest time from the server saying it serves to the kubelet's Ready: a startup probe period, a readiness
period (the kubelet may wait one after the startup probe passes), and a second for the kubelet's status write."""
SERVING_LINES = ("model loaded", "listening on", "server is listening", "Uvicorn running on")
"""What a model server logs once it answers its health check (llama.cpp's llama-server; llama-cpp-python)."""
COLD = "flexinfer_model_cold_start_duration_seconds"
STAGE = "flexinfer_model_startup_stage_duration_seconds"


@pytest.fixture(scope="module")
def watch(node: RealNode, weights: str) -> Iterator[ApiWatch]:
    """The test's own API watch, connected before the Model exists; the Model is deleted at the end."""
    with ApiWatch(node) as api_watch:
        yield api_watch
    node.kubectl("delete", "mdl", MODEL, "-n", NAMESPACE, "--wait=true", "--timeout=120s", check=False)


class WallClock:
    """Turns ``ApiWatch``'s monotonic receipt times into wall-clock times (the manager's clock on this host)."""

    def __init__(self) -> None:
        self.offset = time.time() - time.monotonic()

    def wall(self, monotonic: float) -> datetime:
        return datetime.fromtimestamp(monotonic + self.offset, UTC)


def ready_again(watch: ApiWatch, after: float) -> float | None:
    """When this test's watch saw the pod turn Ready after ``after``: its first not-Ready change, then Ready."""
    gone = watch.first(after, "Pod", MODEL, lambda pod: not pod_ready(pod))
    return None if gone is None else watch.first(gone, "Pod", MODEL, pod_ready)


def decided_after(watch: ApiWatch, after: float) -> datetime | None:
    """``decidedAt`` of the first activation the Model's status showed after ``after`` (monotonic)."""
    with watch.lock:
        events = list(watch.events)
    for at, kind, obj in events:
        activation = (obj.get("status") or {}).get("activation") or {}
        if at >= after and kind == "Model" and obj["metadata"]["name"] == MODEL and activation.get("decidedAt"):
            return datetime.fromisoformat(activation["decidedAt"])
    return None


def phase(node: RealNode) -> str | None:
    value: str | None = node.get("mdl", MODEL, "-n", NAMESPACE).get("status", {}).get("phase")
    return value


def the_pod(node: RealNode) -> dict[str, Any]:
    items: list[dict[str, Any]] = node.get("pods", "-n", NAMESPACE, "-l", f"flexinfer.ai/model={MODEL}")["items"]
    assert len(items) == 1, [p["metadata"]["name"] for p in items]
    return items[0]


def serving_since(node: RealNode, pod: str) -> datetime:
    """When the model server's current container logged that it serves (containerd's timestamp of the last such
    line: llama-server says its HTTP server "is listening" before it loads the model, then again once it serves)."""
    lines = node.kubectl("logs", pod, "-c", "model", "-n", NAMESPACE, "--timestamps").stdout.splitlines()
    stamps = [line.split(" ", 1)[0] for line in lines if any(word in line for word in SERVING_LINES)]
    assert stamps, f"the model server never said it serves; its log ends: {lines[-10:]}"
    return datetime.fromisoformat(stamps[-1])


def container_running(pod: dict[str, Any], restarts: int | None = None) -> bool:
    """The pod shows its model container running (the kubelet reports it up to a second after it started), in its
    ``restarts``-th run when given."""
    return any(c["name"] == "model" and "running" in c.get("state", {})
               and (restarts is None or c.get("restartCount") == restarts)
               for c in pod["status"].get("containerStatuses", []))


def manager_samples(node: RealNode) -> dict[tuple[str, str], float]:
    """``(sample name, stage or "")`` → value for MODEL, from the manager pod's /metrics (the host reaches pods; the
    Ready one: an earlier test's rollout may leave an old manager pod terminating)."""
    text = manager_metrics_text(node)
    return {(s.name, s.labels.get("stage", "")): s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.labels.get("model") == MODEL and "le" not in s.labels}


def sample_count(node: RealNode) -> float:
    return manager_samples(node).get((f"{COLD}_count", ""), 0.0)


def test_a_cold_start_ends_within_50ms_of_the_pod_turning_ready(node: RealNode, watch: ApiWatch) -> None:
    clock, began = WallClock(), time.monotonic()
    node.apply(MANIFEST)
    wait_for(lambda: phase(node) == "Ready", 240, f"{MODEL} Ready")
    wait_for(lambda: sample_count(node) == 1, 30, "the manager's cold-start sample")
    decided = decided_after(watch, began)
    # The pod is created not Ready; the kubelet's Ready comes at its next probe, after the manager's.
    wait_for(lambda: ready_again(watch, began) is not None, 30, "the kubelet's pod Ready on the watch")
    ready_seen = ready_again(watch, began)
    assert decided is not None and ready_seen is not None
    truth = clock.wall(ready_seen)
    took = manager_samples(node)[(f"{COLD}_sum", "")]
    ready = decided + timedelta(seconds=took)
    serving = serving_since(node, the_pod(node)["metadata"]["name"])
    runs = watch.first(began, "Pod", MODEL, container_running)
    assert runs is not None
    asked = max(serving, clock.wall(runs))  # the manager asks once the pod shows its container running
    record("cold start decision -> pod Ready (watched)", (truth - decided).total_seconds())
    record("cold start: manager's Ready - server serving", (ready - serving).total_seconds())
    record("cold start: watched pod Ready - manager's Ready", (truth - ready).total_seconds())
    slack = timedelta(seconds=TRUTH_S)  # containerd stamps a line when it reads it from the server's pipe
    assert serving - slack <= ready <= asked + timedelta(seconds=ANSWER_S), (serving, asked, ready)
    assert ready <= truth + slack, ("the manager's Ready came after the kubelet's", ready, truth)
    assert truth <= serving + timedelta(seconds=PROBES_S), (serving, truth)


def test_a_server_killed_and_restarted_in_place_is_one_more_cold_start_sample(node: RealNode,
                                                                              watch: ApiWatch) -> None:
    if sample_count(node) != 1:  # this test alone: the cold start first
        node.apply(MANIFEST)
        wait_for(lambda: phase(node) == "Ready" and sample_count(node) == 1, 240, f"{MODEL} Ready, one sample")
    before = manager_samples(node)
    pod = the_pod(node)
    name, restarts = pod["metadata"]["name"], pod["status"]["containerStatuses"][0]["restartCount"]
    clock, killed = WallClock(), time.monotonic()
    node.kubectl("exec", name, "-c", "model", "-n", NAMESPACE, "--", "sh", "-c", "kill -TERM 1")
    wait_for(lambda: sample_count(node) == 2, 120, "a second cold-start sample after the restart")

    after = the_pod(node)
    assert after["metadata"]["name"] == name, "restarted in place: the same pod, its replica kept"
    assert after["status"]["containerStatuses"][0]["restartCount"] == restarts + 1
    decided = decided_after(watch, killed)
    wait_for(lambda: ready_again(watch, killed) is not None, 30, "the kubelet's pod Ready on the watch")
    ready_seen = ready_again(watch, killed)
    assert decided is not None and ready_seen is not None
    assert clock.wall(killed) <= decided <= clock.wall(killed) + timedelta(seconds=10), "decided as it was seen"
    samples = manager_samples(node)
    took = samples[(f"{COLD}_sum", "")] - before[(f"{COLD}_sum", "")]
    ready, truth = decided + timedelta(seconds=took), clock.wall(ready_seen)
    record("restart: seen going -> pod Ready (watched)", (truth - decided).total_seconds())
    stages = {stage: value - before.get((name_, stage), 0.0) for (name_, stage), value in samples.items()
              if name_ == f"{STAGE}_sum"}
    assert sum(stages.values()) == pytest.approx(took, abs=0.002), stages
    serving = max(serving_since(node, name), clock.wall(killed))
    runs = watch.first(killed, "Pod", MODEL, lambda pod: container_running(pod, restarts + 1))
    assert runs is not None
    asked = max(serving, clock.wall(runs))
    record("restart: manager's Ready - server serving", (ready - serving).total_seconds())
    slack = timedelta(seconds=TRUTH_S)
    assert serving - slack <= ready <= asked + timedelta(seconds=ANSWER_S), (serving, asked, ready)
    assert ready <= truth + slack, ("the manager's Ready came after the kubelet's", ready, truth)
