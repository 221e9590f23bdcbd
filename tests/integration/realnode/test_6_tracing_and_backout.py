"""Journey steps 6 and 7: tracing turned on with `helm upgrade`, pointing at a real OTLP receiver the pods
reach (on the node IP); the manager's `model.reconcile` spans and the proxy's request spans arrive, and the
proxy continues a client's `traceparent`. Then the backout of docs/operations/rocm-gfx1100.md: `helm
upgrade` with tracing off removes the env and rolls the pods; `helm rollback` restores the traced release;
a Ready model keeps serving, from the same pod, across every restart of the manager and the proxy.
The session ends on the release as installed (a last rollback to revision 1's values)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI

from support.helm_chart import CHART_DIR, Helm
from support.otlp_receiver import OTLPReceiver
from support.real_node import NAMESPACE, RELEASE, WEIGHTS_CLAIM, RealNode, wait_for

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
MODEL = f"""
apiVersion: ai.flexinfer/v1alpha2
kind: Model
metadata: {{name: traced, namespace: {NAMESPACE}}}
spec:
  backend: llamacpp
  source: HF://example/traced-GGUF
  serverless: {{enabled: true, idleTimeout: 5m}}
"""
STEADY = f"""
apiVersion: ai.flexinfer/v1alpha2
kind: Model
metadata: {{name: steady, namespace: {NAMESPACE}}}
spec:
  backend: llamacpp
  source: pvc://{WEIGHTS_CLAIM}/tiny-b.gguf
  serverless: {{enabled: true, idleTimeout: 30m, coldStartTimeout: 240s}}
  resources: {{requests: {{cpu: 50m, memory: 64Mi}}, limits: {{memory: 1Gi}}}}
"""


def steady_serves(node: RealNode) -> str:
    """One chat request for the `steady` Model through the proxy; returns the name of the pod serving it."""
    ip = node.get("service", "flexinfer-proxy", "-n", NAMESPACE)["spec"]["clusterIP"]
    client = OpenAI(base_url=f"http://{ip}/v1", api_key="unused", timeout=300, max_retries=0)
    reply = client.chat.completions.create(model="steady", max_tokens=2, messages=[{"role": "user", "content": "x"}])
    assert reply.choices[0].finish_reason in ("length", "stop")
    pods = node.get("pods", "-n", NAMESPACE, "-l", "flexinfer.ai/model=steady")["items"]
    return ",".join(sorted(p["metadata"]["name"] for p in pods))


def manager_env(node: RealNode) -> dict[str, Any]:
    spec = node.get("deployment", "flexinfer-controller", "-n", NAMESPACE)["spec"]["template"]["spec"]
    return {e["name"]: e.get("value") for e in spec["containers"][0].get("env", [])}


def pod_names(node: RealNode) -> set[str]:
    """The release's live (not terminating) manager and proxy pods."""
    pods = node.get("pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/instance={RELEASE}")["items"]
    return {p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")}


def revision(helm: Helm) -> int:
    history = json.loads(helm.run("history", RELEASE, "-n", NAMESPACE, "-o", "json").stdout)
    return int(history[-1]["revision"])


def upgrade(helm: Helm, *values: str) -> None:
    sets = [arg for value in values for arg in ("--set", value)]
    helm.run("upgrade", RELEASE, str(CHART_DIR), "-n", NAMESPACE, "--reuse-values", *sets, "--wait",
             "--timeout", "300s", timeout=330)


def background_request(node: RealNode) -> int:
    """A request the proxy answers at once (a background request never starts a model), with a traceparent."""
    ip = node.get("service", "flexinfer-proxy", "-n", NAMESPACE)["spec"]["clusterIP"]
    body = json.dumps({"model": "traced", "messages": [{"role": "user", "content": "hi"}]}).encode()
    req = urllib.request.Request(f"http://{ip}/v1/chat/completions", data=body, method="POST", headers={
        "Content-Type": "application/json", "traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01",
        "X-FlexInfer-Internal-Workload-Class": "background"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


@pytest.fixture(scope="module")
def receiver(node: RealNode, release: str, weights: str) -> Iterator[OTLPReceiver]:
    node.apply(STEADY)
    with OTLPReceiver(host=node.env["FLEXINFER_NODE_IP"]) as receiver:
        yield receiver
    node.kubectl("delete", "mdl", "traced", "steady", "-n", NAMESPACE, "--wait=true", "--timeout=60s", check=False)


def test_tracing_reaches_a_real_receiver_and_backs_out(node: RealNode, helm: Helm, receiver: OTLPReceiver) -> None:
    serving = steady_serves(node)  # a model that keeps serving, on the same pod, across every restart below
    installed = revision(helm)
    upgrade(helm, "observability.tracing.enabled=true", f"observability.tracing.otlpEndpoint={receiver.endpoint}")
    traced = revision(helm)
    env = manager_env(node)
    assert env["FLEXINFER_OTEL_ENABLED"] == "true" and env["OTEL_EXPORTER_OTLP_ENDPOINT"] == receiver.endpoint

    node.apply(MODEL)
    reconcile = wait_for(lambda: [s for s in receiver.spans() if s.name.endswith(".reconcile")
                                  and s.attributes.get("k8s.name") == "traced"], 60, "a reconcile span")
    assert reconcile[0].resource["service.name"] == "flexinfer-manager"
    wait_for(lambda: background_request(node) == 503, 60, "the proxy to know the traced Model (503 not ready)")
    handled = wait_for(lambda: [s for s in receiver.spans() if s.name == "proxy.handle_request"
                                and s.trace_id == TRACE_ID], 30, "the proxy's request span")
    assert handled[0].parent_span_id == CLIENT_SPAN and handled[0].resource["service.name"] == "flexinfer-proxy"

    # Backout: tracing off removes the env and rolls both pods; rollback restores the traced revision.
    before = pod_names(node)
    upgrade(helm, "observability.tracing.enabled=false")
    assert "FLEXINFER_OTEL_ENABLED" not in manager_env(node)
    assert not before & pod_names(node), "the pods were not rolled"
    assert steady_serves(node) == serving
    helm.run("rollback", RELEASE, str(traced), "-n", NAMESPACE, "--wait", "--timeout", "300s", timeout=330)
    assert manager_env(node)["FLEXINFER_OTEL_ENABLED"] == "true"
    assert steady_serves(node) == serving
    helm.run("rollback", RELEASE, str(installed), "-n", NAMESPACE, "--wait", "--timeout", "300s", timeout=330)
    assert "FLEXINFER_OTEL_ENABLED" not in manager_env(node)
    assert steady_serves(node) == serving
