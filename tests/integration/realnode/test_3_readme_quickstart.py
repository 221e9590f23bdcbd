"""Journey step 3: README's Kubernetes quickstart, verbatim, on the installed release (its `helm install`
line is the session's install, see conftest). The example Models in `default` are served by the proxy
installed in flexinfer-system (the namespace mismatch the quickstart once had). They ask for a gfx1100 node this
node is not, so a request for one fails within seconds naming the scheduler's reason, and `kubectl get mdl`
shows it (issue #23, defect 6); deleting them creates no tmpfs cleanup Job, since they never ran anywhere (a Job
pinned to their node selector's `gfx1100-0` stayed Pending forever).

Then the quickstart's block for any node, examples/cpu-node: two llama.cpp Models sharing a group, their
weights in the `Local` cache directories where the example's README puts them. Each answers with its own name,
stages only its own file into the persistent tmpfs (handed to the loader's user first: the hostPath is created
root-owned), a swap back finds its copy in place, and deleting the Models empties both tmpfs directories on this
node with cleanup Jobs that then delete themselves. A cleanup Job for a node that has left the cluster (where a
shared model last ran) cannot run: it fails at its deadline and then deletes itself too."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from support.kube_testbed import REPO_ROOT, ensure_kubectl
from support.real_node import (
    EXAMPLE_DIR,
    NAMESPACE,
    RealNode,
    readme_quickstart,
    record,
    remove_created,
    wait_for,
    write_example_weights,
)

EXAMPLES = {"qwen25-7b-chat", "qwen25-coder-7b"}
FAIL_FAST_S = 30.0
"""An unschedulable model's waiting request is answered within this (its cold-start budget is 120 s)."""


def run(node: RealNode, command: str) -> str:
    env = {**os.environ, "KUBECONFIG": str(node.kubeconfig),
           "PATH": f"{ensure_kubectl().parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=REPO_ROOT, capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert proc.returncode == 0, f"{command!r} exited {proc.returncode}: {proc.stderr}"
    return proc.stdout


@pytest.fixture
def quickstart(node: RealNode, release: str) -> Iterator[dict[str, str]]:
    outputs = {c: run(node, c) for c in readme_quickstart() if not c.startswith("helm install ")}
    yield outputs
    node.kubectl("delete", "-f", str(REPO_ROOT / "examples" / "gfx1100-shared"), "--wait=true", "--timeout=120s",
                 check=False)


def proxy_model_ids(node: RealNode) -> set[str]:
    ip = node.get("service", "flexinfer-proxy", "-n", NAMESPACE)["spec"]["clusterIP"]
    with urllib.request.urlopen(f"http://{ip}/v1/models", timeout=10) as resp:
        return {m["id"] for m in json.load(resp)["data"]}


def test_the_quickstart_runs_and_its_examples_are_served(node: RealNode, quickstart: dict[str, str]) -> None:
    listing = next(out for c, out in quickstart.items() if c.startswith("kubectl get mdl"))
    assert all(name in listing for name in EXAMPLES)
    wait_for(lambda: proxy_model_ids(node) >= EXAMPLES, 60, "the proxy to list the example Models")


def test_an_unschedulable_example_fails_its_request_fast_and_kubectl_shows_why(
        node: RealNode, quickstart: dict[str, str]) -> None:
    ip = node.get("service", "flexinfer-proxy", "-n", NAMESPACE)["spec"]["clusterIP"]
    wait_for(lambda: proxy_model_ids(node) >= EXAMPLES, 60, "the proxy to list the example Models")
    client = openai.OpenAI(base_url=f"http://{ip}/v1", api_key="unused", timeout=300, max_retries=0)
    began = time.monotonic()
    with pytest.raises(openai.APIStatusError) as failure:
        client.chat.completions.create(model="qwen25-7b-chat", max_tokens=4,
                                       messages=[{"role": "user", "content": "hello"}])
    waited = time.monotonic() - began
    record("unschedulable example: request -> 503", waited)
    message = str(failure.value.body)
    assert failure.value.status_code == 503 and "Unschedulable" in message and "didn't match" in message, message
    assert waited < FAIL_FAST_S, f"answered after {waited:.1f}s"
    listing = run(node, "kubectl get mdl -A")
    line = next(row for row in listing.splitlines() if "qwen25-7b-chat" in row)
    assert "Failed" in line and "Unschedulable" in line and "didn't match" in line, listing
    events = node.get("events", "-n", "default", "--field-selector",
                      "involvedObject.name=qwen25-7b-chat,reason=Unschedulable")["items"]
    assert events and events[0]["type"] == "Warning", events


def cleanup_jobs(node: RealNode, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = node.get("jobs", "-n", namespace, "-l", "flexinfer.ai/tmpfs-cleanup")["items"]
    return items


def test_deleting_examples_that_never_ran_leaves_no_cleanup_job(node: RealNode, quickstart: dict[str, str]) -> None:
    run(node, "kubectl delete -f examples/gfx1100-shared/ --wait=true --timeout=60s")
    assert node.get("mdl", "-n", "default")["items"] == []
    assert cleanup_jobs(node, "default") == []  # it used to be two Jobs Pending forever on gfx1100-0


TMPFS = Path("/dev/shm/flexinfer/default")
LOADER_UID = 65532
SWAP_S = 120.0
"""A swap's longest wait here: the other model's 15 s hold, a pod stop and a start with staging."""


@pytest.fixture
def cpu_example(node: RealNode, release: str) -> Iterator[None]:
    """The example's weights where its README puts them (removed afterwards), and its Models removed at the end."""
    created = write_example_weights("default")
    try:
        yield
    finally:
        node.kubectl("delete", "-f", str(EXAMPLE_DIR), "--wait=true", "--timeout=120s", check=False)
        remove_created(created)


def live_pod(node: RealNode, model: str) -> dict[str, Any] | None:
    pods = node.get("pods", "-n", "default", "-l", f"flexinfer.ai/model={model}")["items"]
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    return live[0] if len(live) == 1 else None


def loader_log(node: RealNode, pod: dict[str, Any]) -> str:
    return node.kubectl("logs", pod["metadata"]["name"], "-n", "default", "-c", "flash-loader").stdout


def ask(client: openai.OpenAI, model: str) -> str:
    began = time.monotonic()
    reply = client.chat.completions.create(model=model, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    record(f"cpu-node example: {model} (request -> reply)", time.monotonic() - began)
    assert reply.choices[0].finish_reason in ("length", "stop")
    return reply.model


@pytest.mark.timeout(900)
def test_the_cpu_node_example_runs_swaps_and_cleans_up(node: RealNode, cpu_example: None) -> None:
    outputs = [run(node, command) for command in readme_quickstart(1)]
    assert "tiny-a" in outputs[-1] and "tiny-b" in outputs[-1], outputs
    wait_for(lambda: proxy_model_ids(node) >= {"tiny-a", "tiny-b"}, 60, "the proxy to list the example's Models")
    ip = node.get("service", "flexinfer-proxy", "-n", NAMESPACE)["spec"]["clusterIP"]
    client = openai.OpenAI(base_url=f"http://{ip}/v1", api_key="unused", timeout=300, max_retries=0)

    assert ask(client, "tiny-a") == "tiny-a"  # the Model's name, not the file the server loads
    pod = live_pod(node, "tiny-a")
    assert pod is not None
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["flash-tmpfs-owner", "flash-loader"]
    assert "copied 1 files" in loader_log(node, pod)  # model.gguf alone
    staged = TMPFS / "tiny-a"
    assert [p.name for p in staged.iterdir()] == ["model.gguf"]
    assert staged.stat().st_uid == LOADER_UID and (staged / "model.gguf").stat().st_uid == LOADER_UID

    assert ask(client, "tiny-b") == "tiny-b"  # a swap: tiny-a's pod stops, its copy stays in RAM
    wait_for(lambda: live_pod(node, "tiny-a") is None, 60, "tiny-a's pod gone")
    assert (staged / "model.gguf").is_file() and (TMPFS / "tiny-b" / "model.gguf").is_file()
    assert ask(client, "tiny-a") == "tiny-a"  # swapped back in: the copy is reused
    back = live_pod(node, "tiny-a")
    assert back is not None and back["metadata"]["name"] != pod["metadata"]["name"]
    assert "copied 0 files" in loader_log(node, back) and "skipped 1 unchanged" in loader_log(node, back)

    for model in ("tiny-a", "tiny-b"):
        gpu = node.get("mdl", model, "-n", "default")["status"]["gpu"]
        assert gpu["node"] == node.env["FLEXINFER_NODE_NAME"]
    run(node, "kubectl delete -f examples/cpu-node/ --wait=true --timeout=120s")  # as its README says
    began = time.monotonic()
    wait_for(lambda: not any((TMPFS / m).exists() for m in ("tiny-a", "tiny-b")), 120, "both tmpfs copies removed")
    record("cpu-node example: delete -> tmpfs emptied", time.monotonic() - began)
    jobs = cleanup_jobs(node, "default")
    assert sorted(j["metadata"]["name"] for j in jobs) == ["tiny-a-tmpfs-cleanup", "tiny-b-tmpfs-cleanup"]
    for job in jobs:
        terms = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms[0]["matchFields"][0]["values"] == [node.env["FLEXINFER_NODE_NAME"]]
    wait_for(lambda: cleanup_jobs(node, "default") == [], 240, "the cleanup Jobs to delete themselves (TTL)", 2.0)
    record("cpu-node example: delete -> cleanup Jobs gone", time.monotonic() - began)


GHOST = "ghost"
GHOST_MANIFEST = f"""
apiVersion: ai.flexinfer/v1alpha2
kind: Model
metadata: {{name: {GHOST}, namespace: default}}
spec:
  backend: llamacpp
  source: file:///models/model.gguf
  gpu: {{shared: ghost-group}}
  cache: {{strategy: Local}}
  config: {{runtimeProfile: cpu}}
  serverless: {{enabled: true, idleTimeout: 10m}}
"""
"""A shared model that last ran on a node which has left the cluster (its ``status.gpu.node`` says so)."""
GONE_NODE = "gone-node"
ENDS_S = 120 + 60
"""The cleanup Job's deadline (120 s) or TTL (120 s), plus the Job and TTL controllers' own delay."""


def job_failed(job: dict[str, Any]) -> str:
    """The reason of a Job's ``Failed=True`` condition (``""`` while it has none)."""
    return next((c.get("reason") or "?" for c in job.get("status", {}).get("conditions", [])
                 if c["type"] == "Failed" and c["status"] == "True"), "")


def ghost_jobs(node: RealNode) -> list[dict[str, Any]]:
    return [j for j in cleanup_jobs(node, "default") if j["metadata"]["name"] == f"{GHOST}-tmpfs-cleanup"]


@pytest.mark.timeout(600)
def test_a_cleanup_job_for_a_node_that_is_gone_ends_on_its_own(node: RealNode, release: str) -> None:
    node.apply(GHOST_MANIFEST)
    try:
        wait_for(lambda: node.get("mdl", GHOST, "-n", "default").get("status", {}).get("phase") == "Idle", 60,
                 "the Model Idle")
        node.kubectl("patch", "mdl", GHOST, "-n", "default", "--subresource=status", "--type=merge",
                     "-p", json.dumps({"status": {"gpu": {"node": GONE_NODE}}}))
    finally:
        node.kubectl("delete", "mdl", GHOST, "-n", "default", "--wait=true", "--timeout=60s")
    [job] = ghost_jobs(node)
    terms = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms[0]["matchFields"][0]["values"] == [GONE_NODE]

    began = time.monotonic()
    reason = wait_for(lambda: next((job_failed(j) for j in ghost_jobs(node)), "deleted"), ENDS_S,
                      "the cleanup Job to fail at its deadline", 2.0)
    record("cleanup Job for a gone node: delete -> Failed", time.monotonic() - began)
    assert reason == "DeadlineExceeded", reason
    pods = node.get("pods", "-n", "default", "-l", f"flexinfer.ai/tmpfs-cleanup={GHOST}")["items"]
    assert [p for p in pods if not p["metadata"].get("deletionTimestamp")] == []  # its Pending pod removed
    wait_for(lambda: ghost_jobs(node) == [], ENDS_S, "the failed cleanup Job to delete itself (TTL)", 2.0)
    record("cleanup Job for a gone node: delete -> Job gone", time.monotonic() - began)
