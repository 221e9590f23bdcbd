"""Journey step 5: the flash-loader rollout step. `helm upgrade --set controller.runtime.flashLoader.enabled=true`
turns the global default on; a non-shared Local-cache Model whose weights are on the hostPath PV gets the
`flash-loader` init container, which really stages the weights into the memory emptyDir, and the llama.cpp
server loads them from there. A matching ModelCache's concurrency and tmpfsSizeLimit are visible in the pod
(init container env, the emptyDir's size as `df` sees it). The upgrade is undone at the end."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI

from support.helm_chart import CHART_DIR, Helm
from support.real_node import NAMESPACE, RELEASE, RealNode, record

MODEL = "tiny-flash"
SIZE_LIMIT_MI = 64


def manifests(claim: str) -> str:
    return f"""
apiVersion: ai.flexinfer/v1alpha2
kind: Model
metadata: {{name: {MODEL}, namespace: {NAMESPACE}}}
spec:
  backend: llamacpp
  source: pvc://{claim}/tiny-a.gguf
  cache: {{strategy: Local}}
  serverless: {{enabled: true, idleTimeout: 10m, coldStartTimeout: 240s}}
  resources: {{requests: {{cpu: 50m, memory: 64Mi}}, limits: {{memory: 1Gi}}}}
---
apiVersion: ai.flexinfer/v1alpha1
kind: ModelCache
metadata: {{name: {MODEL}-cache, namespace: {NAMESPACE}}}
spec:
  source: pvc://{claim}/tiny-a.gguf
  storageStrategy: NodeLocal
  flashLoader: {{enabled: true, concurrency: 3, tmpfsSizeLimit: {SIZE_LIMIT_MI}Mi}}
"""


def upgrade(helm: Helm, value: str) -> None:
    helm.run("upgrade", RELEASE, str(CHART_DIR), "-n", NAMESPACE, "--reuse-values", "--set", value, "--wait",
             "--timeout", "300s", timeout=330)


@pytest.fixture(scope="module")
def flash_model(node: RealNode, helm: Helm, weights: str) -> Iterator[None]:
    upgrade(helm, "controller.runtime.flashLoader.enabled=true")
    node.apply(manifests(weights))
    yield
    node.kubectl("delete", "mdl", MODEL, "-n", NAMESPACE, "--wait=true", "--timeout=120s", check=False)
    node.kubectl("delete", "modelcache", f"{MODEL}-cache", "-n", NAMESPACE, "--timeout=60s", check=False)
    upgrade(helm, "controller.runtime.flashLoader.enabled=false")


def model_pod(node: RealNode) -> dict[str, Any]:
    pods = node.get("pods", "-n", NAMESPACE, "-l", f"flexinfer.ai/model={MODEL}")["items"]
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    assert len(live) == 1, [p["metadata"]["name"] for p in pods]
    return live[0]


def test_the_flash_loader_stages_weights_into_tmpfs(node: RealNode, flash_model: None) -> None:
    ip = node.get("service", "flexinfer-proxy", "-n", NAMESPACE)["spec"]["clusterIP"]
    client = OpenAI(base_url=f"http://{ip}/v1", api_key="unused", timeout=300, max_retries=0)
    began = time.monotonic()
    reply = client.chat.completions.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    record("cold start with flash-loader (request -> reply)", time.monotonic() - began)
    assert reply.choices[0].finish_reason in ("length", "stop")

    pod = model_pod(node)
    spec = pod["spec"]
    loader = next(c for c in spec["initContainers"] if c["name"] == "flash-loader")
    assert {e["name"]: e.get("value") for e in loader["env"]}["FLASH_CONCURRENCY"] == "3"
    init_state = pod["status"]["initContainerStatuses"][0]["state"]["terminated"]
    assert init_state["exitCode"] == 0
    tmpfs = next(v for v in spec["volumes"] if v["name"] == "flash-tmpfs")
    assert tmpfs["emptyDir"] == {"medium": "Memory", "sizeLimit": f"{SIZE_LIMIT_MI}Mi"}
    mount = next(m for m in spec["containers"][0]["volumeMounts"] if m["mountPath"] == "/models")
    assert mount["name"] == "flash-tmpfs"

    name = pod["metadata"]["name"]
    log = node.kubectl("logs", name, "-n", NAMESPACE, "-c", "flash-loader").stdout
    assert "flash-load:" in log, log
    df = node.kubectl("exec", name, "-n", NAMESPACE, "-c", "model", "--", "df", "-k", "/models").stdout.splitlines()
    filesystem, blocks = df[-1].split()[:2]
    assert filesystem == "tmpfs" and int(blocks) == SIZE_LIMIT_MI * 1024, df
    staged = node.kubectl("exec", name, "-n", NAMESPACE, "-c", "model", "--", "stat", "-c", "%s", "/models").stdout
    assert int(staged) > 0
    assert "running" in {c["name"]: c for c in pod["status"]["containerStatuses"]}["model"]["state"]
