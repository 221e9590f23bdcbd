"""Journey step 4b: the shared group in group-pod mode (issue #28): one pod holds the node's `amd.com/gpu` and runs
`flexinfer serve` over three llama.cpp Models, which swap inside it.

The release is upgraded as docs/operations/rocm-gfx1100.md says (`controller.groupStrategies.<group>=TimeSliced`,
the members' image the group image `hack/build-images group` builds: FlexInfer with llama-server). Through the
proxy's ClusterIP, with the official `openai` client: three models answer in turn while a long stream is in
flight (nothing lost), all in one pod that never restarts and requests the GPU once; `kubectl get mdl` shows each
member's phase; the manager's `/metrics` has the seed's cold-start and swap histograms from the pod's figures. The
group pod goes to zero once every member idled out and comes back for the next request; killing it mid-stream
gives the client an answer or an error (never a hang) and the group converges; the manager killed mid-swap does not
stop the swap. Backing out (`Exclusive`, the llama.cpp image again) removes the group pod and the members run in
their own pods again. The release's values are restored at the end.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from support import real_node
from support.helm_chart import CHART_DIR, Helm
from support.real_node import (
    GROUP_IMAGE,
    LLAMACPP_IMAGE,
    NAMESPACE,
    RELEASE,
    SHARED_GROUP,
    RealNode,
    manager_metrics,
    manager_pod,
    record,
    wait_for,
)

MODELS = ("tiny-a", "tiny-b", "tiny-c")
GROUP_POD = f"flexinfer-group-{SHARED_GROUP}"
IDLE_TIMEOUT_S = 20
REQUEST_TIMEOUT_S = 300.0
SERVERLESS = f"{{enabled: true, idleTimeout: {IDLE_TIMEOUT_S}s, coldStartTimeout: 240s}}"


def upgrade(helm: Helm, *values: str) -> None:
    sets = [arg for value in values for arg in ("--set", value)]
    helm.run("upgrade", RELEASE, str(CHART_DIR), "-n", NAMESPACE, "--reuse-values", *sets, "--wait",
             "--timeout", "300s", timeout=330)


@pytest.fixture(scope="module")
def group_mode(node: RealNode, helm: Helm, weights: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    saved = tmp_path_factory.mktemp("values") / "values.json"
    saved.write_text(helm.run("get", "values", RELEASE, "-n", NAMESPACE, "-o", "json").stdout)
    node.import_images(*real_node.build_images("group"))
    real_node.create_weights(node, MODELS)
    upgrade(helm, f"controller.groupStrategies.{SHARED_GROUP}=TimeSliced",
            f"controller.runtime.backendImages.llamacpp={GROUP_IMAGE}")
    node.apply(real_node.shared_models_manifest({"tiny-a": 100, "tiny-b": 200, "tiny-c": 150}, SERVERLESS))
    wait_for(lambda: all(phase(node, m) == "Idle" for m in MODELS), 60, "the three Models Idle")
    try:
        yield
    finally:
        node.kubectl("delete", "mdl", *MODELS, "-n", NAMESPACE, "--wait=true", "--timeout=120s", check=False)
        restore(helm, saved)


def restore(helm: Helm, saved: Path) -> None:
    helm.run("upgrade", RELEASE, str(CHART_DIR), "-n", NAMESPACE, "-f", str(saved), "--wait", "--timeout", "300s",
             timeout=330)


def status(node: RealNode, model: str) -> dict[str, Any]:
    out: dict[str, Any] = node.get("mdl", model, "-n", NAMESPACE).get("status", {})
    return out


def phase(node: RealNode, model: str) -> str | None:
    return status(node, model).get("phase")


def group_pods(node: RealNode) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = node.get("pods", "-n", NAMESPACE, "-l", f"flexinfer.ai/model={GROUP_POD}")["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def replicas(node: RealNode) -> int:
    return int(node.get("deployment", GROUP_POD, "-n", NAMESPACE)["spec"].get("replicas") or 0)


def client(node: RealNode) -> OpenAI:
    ip = node.get("service", "flexinfer-proxy", "-n", NAMESPACE)["spec"]["clusterIP"]
    return OpenAI(base_url=f"http://{ip}/v1", api_key="unused", timeout=REQUEST_TIMEOUT_S, max_retries=0)


def chat(node: RealNode, model: str) -> str:
    reply = client(node).chat.completions.create(model=model, max_tokens=4, temperature=0,
                                                 messages=[{"role": "user", "content": "hello"}])
    assert reply.choices[0].finish_reason in ("length", "stop")
    return reply.model


class Stream(threading.Thread):
    """A long streaming chat through the proxy: the text it got, and the error it ended with (if any)."""

    def __init__(self, node: RealNode, model: str, max_tokens: int = 400) -> None:
        super().__init__(daemon=True)
        self.client, self.model, self.max_tokens = client(node), model, max_tokens
        self.text: list[str] = []
        self.error: BaseException | None = None
        self.first = threading.Event()

    def run(self) -> None:
        try:
            chunks = self.client.chat.completions.create(
                model=self.model, max_tokens=self.max_tokens, temperature=0, stream=True,
                messages=[{"role": "user", "content": "tell me a long story"}])
            for chunk in chunks:
                if chunk.choices:
                    self.text.append(chunk.choices[0].delta.content or "")
                    self.first.set()
        except BaseException as exc:  # the test reads it
            self.error = exc
        finally:
            self.first.set()


def test_three_models_swap_inside_one_pod_under_a_stream(node: RealNode, group_mode: None) -> None:
    began = time.monotonic()
    assert chat(node, "tiny-a") == "tiny-a"
    record("group pod cold start tiny-a (request -> reply)", time.monotonic() - began)
    (pod,) = group_pods(node)
    limits = pod["spec"]["containers"][0]["resources"].get("limits", {})
    assert limits.get("amd.com/gpu") == "1", limits

    stream = Stream(node, "tiny-a")
    stream.start()
    stream.first.wait(REQUEST_TIMEOUT_S)
    began = time.monotonic()
    assert chat(node, "tiny-b") == "tiny-b"  # waits for tiny-a's hold and its stream, then swaps inside the pod
    record("group pod swap tiny-a -> tiny-b under a stream (request -> reply)", time.monotonic() - began)
    stream.join(REQUEST_TIMEOUT_S)
    assert stream.error is None and "".join(stream.text), "the in-flight stream to tiny-a was cut"
    assert chat(node, "tiny-c") == "tiny-c"

    wait_for(lambda: phase(node, "tiny-c") == "Ready", 30, "tiny-c Ready in kubectl get mdl")
    assert {phase(node, m) for m in ("tiny-a", "tiny-b")} <= {"Preempted", "Idle"}
    assert [p["metadata"]["uid"] for p in group_pods(node)] == [pod["metadata"]["uid"]], "one pod, never restarted"
    assert all(c.get("restartCount", 0) == 0 for c in group_pods(node)[0]["status"]["containerStatuses"])
    for model in MODELS:
        assert status(node, model)["sharedGroup"]["strategy"] == "TimeSliced"
        assert not node.kubectl("get", "deployment", model, "-n", NAMESPACE, "--ignore-not-found", "-o",
                                "name").stdout.strip(), f"{model} has a Deployment of its own"

    def sampled() -> dict[tuple[str, str], float] | None:
        samples = manager_metrics(node)
        wanted = [("flexinfer_model_swap_duration_seconds_count", "tiny-b"),
                  ("flexinfer_model_swap_duration_seconds_count", "tiny-c"),
                  ("flexinfer_model_cold_start_duration_seconds_count", "tiny-a")]
        return samples if all(samples.get(k, 0) >= 1 for k in wanted) else None
    samples = wait_for(sampled, 30, "the pod's cold start and swaps in the manager's histograms")
    record("group pod swap tiny-b -> tiny-c (engine)", samples[("flexinfer_model_swap_duration_seconds_sum", "tiny-c")])


def test_the_group_pod_goes_to_zero_when_idle_and_comes_back(node: RealNode, group_mode: None) -> None:
    chat(node, "tiny-a")
    began = time.monotonic()
    wait_for(lambda: replicas(node) == 0 and not group_pods(node), 4 * IDLE_TIMEOUT_S + 60,
             "the group pod scaled to zero")
    record("group pod idle -> gone", time.monotonic() - began)
    assert {phase(node, m) for m in MODELS} == {"Idle"}
    assert all("groupEndpoint" not in status(node, m).get("sharedGroup", {}) for m in MODELS)
    began = time.monotonic()
    assert chat(node, "tiny-b") == "tiny-b"
    record("group pod back from zero, tiny-b (request -> reply)", time.monotonic() - began)
    assert replicas(node) == 1


def test_the_group_pod_killed_mid_stream_ends_the_stream_and_the_group_converges(node: RealNode,
                                                                                 group_mode: None) -> None:
    chat(node, "tiny-a")
    (pod,) = group_pods(node)
    stream = Stream(node, "tiny-a", max_tokens=2000)
    stream.start()
    assert stream.first.wait(REQUEST_TIMEOUT_S)
    node.kubectl("delete", "pod", pod["metadata"]["name"], "-n", NAMESPACE, "--grace-period=0", "--force",
                 "--wait=false")
    stream.join(60)
    assert not stream.is_alive(), "the stream hung after its pod was killed"
    record("killed mid-stream: " + ("error" if stream.error is not None else "completed"), 0.0)
    began = time.monotonic()
    assert chat(node, "tiny-a") == "tiny-a"  # a new pod from the ReplicaSet, linked by the manager
    record("group pod replaced, tiny-a (request -> reply)", time.monotonic() - began)
    (new,) = group_pods(node)
    assert new["metadata"]["uid"] != pod["metadata"]["uid"]
    wait_for(lambda: status(node, "tiny-a").get("sharedGroup", {}).get("groupEndpoint", "").startswith(
        f"http://{new['status']['podIP']}:"), 30, "tiny-a forwarded to the new pod")


def test_the_manager_killed_mid_swap_does_not_stop_the_swap(node: RealNode, group_mode: None) -> None:
    chat(node, "tiny-c")
    (pod,) = group_pods(node)
    manager = manager_pod(node)
    done: list[str] = []
    swap = threading.Thread(target=lambda: done.append(chat(node, "tiny-b")), daemon=True)
    swap.start()
    node.kubectl("delete", "pod", manager["metadata"]["name"], "-n", NAMESPACE, "--grace-period=0", "--force",
                 "--wait=false")
    swap.join(REQUEST_TIMEOUT_S)
    assert done == ["tiny-b"]
    wait_for(lambda: phase(node, "tiny-b") == "Ready" and phase(node, "tiny-c") in ("Preempted", "Idle"), 120,
             "the new manager's statuses converge to the pod's")
    assert [p["metadata"]["uid"] for p in group_pods(node)] == [pod["metadata"]["uid"]], "the pod was not replaced"


def test_backing_out_runs_the_members_in_their_own_pods_again(node: RealNode, helm: Helm, group_mode: None) -> None:
    upgrade(helm, f"controller.groupStrategies.{SHARED_GROUP}=Exclusive",
            f"controller.runtime.backendImages.llamacpp={LLAMACPP_IMAGE}")
    wait_for(lambda: not node.kubectl("get", "deployment", GROUP_POD, "-n", NAMESPACE, "--ignore-not-found", "-o",
                                      "name").stdout.strip(), 120, "the group pod's Deployment deleted")
    for model in MODELS:  # the members' spec still names no image: the chart's llama.cpp image applies again
        wait_for(lambda m=model: "groupEndpoint" not in status(node, m).get("sharedGroup", {}), 60,
                 f"{model} no longer forwarded to a group pod")
    began = time.monotonic()
    assert chat(node, "tiny-a") == "tiny-a"
    record("back to Exclusive, tiny-a in its own pod (request -> reply)", time.monotonic() - began)
    deployment = node.get("deployment", "tiny-a", "-n", NAMESPACE)
    assert json.dumps(deployment["spec"]["template"]["spec"]["containers"]).count(LLAMACPP_IMAGE) >= 1
