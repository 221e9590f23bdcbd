"""Journey step 5: the flash-loader rollout step. `helm upgrade --set controller.runtime.flashLoader.enabled=true`
turns the global default on; a non-shared Local-cache Model whose weights are on the hostPath PV gets the
`flash-loader` init container, which really stages the weights into the memory emptyDir, and the llama.cpp
server loads them from there. A matching ModelCache's concurrency and tmpfsSizeLimit are visible in the pod
(init container env, the emptyDir's size as `df` sees it).

The same upgrade caps each flash-loader's copy rate (`controller.runtime.flashLoader.maxRate`) and lowers the
proxy's stall deadline (`proxy.timeouts.stall`): a Model whose weights are a 56 MiB file stages for about 56 s,
more than twice the deadline, and its request still succeeds, because the manager keeps moving the Model's
`loadingProgressAt` from the flash-loader's progress lines. The upgrade is undone at the end."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from openai import OpenAI

from support.helm_chart import CHART_DIR, Helm
from support.real_node import NAMESPACE, RELEASE, WEIGHTS_MANIFEST, ApiWatch, RealNode, record, wait_for
from support.tiny_gguf import Dimensions, write_tiny_gguf

MODEL = "tiny-flash"
SIZE_LIMIT_MI = 64
SLOW_MODEL = "slow-flash"
SLOW_CLAIM = "slow-weights"
SLOW_DIMS = Dimensions(embd=768, layers=2, ff=2048)
SLOW_MI = 56
"""The size of a model of ``SLOW_DIMS`` (f32 weights), MiB rounded up: staged at MAX_RATE_MI, about as many s."""
MAX_RATE_MI = 1
STALL_S = 20
UPGRADE = ("controller.runtime.flashLoader.enabled=true", f"controller.runtime.flashLoader.maxRate={MAX_RATE_MI}Mi",
           f"proxy.timeouts.stall={STALL_S}s")
UNDO = ("controller.runtime.flashLoader.enabled=false", "controller.runtime.flashLoader.maxRate=",
        "proxy.timeouts.stall=2m")


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


def upgrade(helm: Helm, *values: str) -> None:
    sets = [arg for value in values for arg in ("--set", value)]
    helm.run("upgrade", RELEASE, str(CHART_DIR), "-n", NAMESPACE, "--reuse-values", *sets, "--wait",
             "--timeout", "300s", timeout=330)


@pytest.fixture(scope="module")
def flash_release(helm: Helm, release: str) -> Iterator[None]:
    upgrade(helm, *UPGRADE)
    yield
    upgrade(helm, *UNDO)


@pytest.fixture(scope="module")
def flash_model(node: RealNode, weights: str, flash_release: None) -> Iterator[None]:
    node.apply(manifests(weights))
    yield
    node.kubectl("delete", "mdl", MODEL, "-n", NAMESPACE, "--wait=true", "--timeout=120s", check=False)
    node.kubectl("delete", "modelcache", f"{MODEL}-cache", "-n", NAMESPACE, "--timeout=60s", check=False)


def model_pod(node: RealNode, model: str = MODEL) -> dict[str, Any]:
    pods = node.get("pods", "-n", NAMESPACE, "-l", f"flexinfer.ai/model={model}")["items"]
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    assert len(live) == 1, [p["metadata"]["name"] for p in pods]
    return live[0]


def reported_pod(node: RealNode, model: str = MODEL) -> dict[str, Any]:
    """The model's pod once the kubelet reports its model container running (the manager asks the server itself,
    so the reply can come before the kubelet's relist reports the flash-loader finished and the server started)."""
    def reported() -> dict[str, Any] | None:
        found = model_pod(node, model)
        models = [c for c in found["status"].get("containerStatuses", []) if c["name"] == "model"]
        return found if models and "running" in models[0].get("state", {}) else None
    pod: dict[str, Any] = wait_for(reported, 30, f"the kubelet reporting {model}'s model container running")
    return pod


def proxy_client(node: RealNode) -> OpenAI:
    ip = node.get("service", "flexinfer-proxy", "-n", NAMESPACE)["spec"]["clusterIP"]
    return OpenAI(base_url=f"http://{ip}/v1", api_key="unused", timeout=300, max_retries=0)


def test_the_flash_loader_stages_weights_into_tmpfs(node: RealNode, flash_model: None) -> None:
    client = proxy_client(node)
    began = time.monotonic()
    reply = client.chat.completions.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    record("cold start with flash-loader (request -> reply)", time.monotonic() - began)
    assert reply.choices[0].finish_reason in ("length", "stop")

    pod = reported_pod(node)
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


SLOW_MODEL_MANIFEST = f"""
apiVersion: ai.flexinfer/v1alpha2
kind: Model
metadata: {{name: {SLOW_MODEL}, namespace: {NAMESPACE}}}
spec:
  backend: llamacpp
  source: pvc://{SLOW_CLAIM}/slow.gguf
  cache: {{strategy: Local, flashLoader: {{enabled: true, concurrency: 1, tmpfsSizeLimit: 128Mi}}}}
  serverless: {{enabled: true, idleTimeout: 10m, coldStartTimeout: 240s}}
  resources: {{requests: {{cpu: 50m, memory: 64Mi}}, limits: {{memory: 1Gi}}}}
"""


@pytest.fixture
def slow_model(node: RealNode, flash_release: None) -> Iterator[None]:
    """A llama.cpp model of about SLOW_MI MiB, on its own hostPath volume (the flash-loader stages the model's own
    file, not the rest of a volume: the weights themselves must be big)."""
    path = node.state_dir / SLOW_CLAIM
    path.mkdir(exist_ok=True)
    path.chmod(0o755)
    weights = write_tiny_gguf(path / "slow.gguf", seed=1, dims=SLOW_DIMS)
    weights.chmod(0o644)
    assert (SLOW_MI - 1) << 20 < weights.stat().st_size <= SLOW_MI << 20, weights.stat().st_size
    node.apply(WEIGHTS_MANIFEST.format(claim=SLOW_CLAIM, path=path, namespace=NAMESPACE))
    wait_for(lambda: node.get("pvc", SLOW_CLAIM, "-n", NAMESPACE)["status"].get("phase") == "Bound", 60,
             "the slow weights claim to be bound")
    node.apply(SLOW_MODEL_MANIFEST)
    yield
    node.kubectl("delete", "mdl", SLOW_MODEL, "-n", NAMESPACE, "--wait=true", "--timeout=120s", check=False)
    node.kubectl("delete", "pvc", SLOW_CLAIM, "-n", NAMESPACE, "--wait=false", check=False)
    node.kubectl("delete", "pv", f"flexinfer-{SLOW_CLAIM}", "--wait=false", check=False)


def stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_a_staging_longer_than_the_stall_deadline_does_not_fail_requests(node: RealNode, slow_model: None) -> None:
    proxy = node.get("deployment", "flexinfer-proxy", "-n", NAMESPACE)["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"]: e.get("value") for e in proxy["env"]}["PROXY_STALL_TIMEOUT"] == f"{STALL_S}s"
    with ApiWatch(node) as watch:
        began = time.monotonic()
        reply = proxy_client(node).chat.completions.create(
            model=SLOW_MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
        record(f"cold start, {SLOW_MI // MAX_RATE_MI} s staging (request -> reply)", time.monotonic() - began)
        assert reply.choices[0].finish_reason in ("length", "stop")
        with watch.lock:
            statuses = [obj.get("status", {}) for _, kind, obj in watch.events
                        if kind == "Model" and obj["metadata"]["name"] == SLOW_MODEL]

    pod = reported_pod(node, SLOW_MODEL)
    loader = next(c for c in pod["spec"]["initContainers"] if c["name"] == "flash-loader")
    assert {e["name"]: e.get("value") for e in loader["env"]}["FLASH_MAX_RATE"] == f"{MAX_RATE_MI}Mi"
    ran = pod["status"]["initContainerStatuses"][0]["state"]["terminated"]
    staged_for = stamp(ran["finishedAt"]) - stamp(ran["startedAt"])
    assert ran["exitCode"] == 0 and staged_for >= 2 * STALL_S, ran

    # What kept the proxy waiting: the progress stamps the manager wrote from the flash-loader's log.
    progress = sorted({stamp(s["loadingProgressAt"]) for s in statuses
                       if s.get("loadingSubstage") == "LoadingWeights" and s.get("loadingProgressAt")})
    messages = {s.get("message") for s in statuses if s.get("loadingSubstage") == "LoadingWeights"}
    assert len(progress) >= 3 and any("staging weights into tmpfs:" in str(m) for m in messages), messages
    gaps = [later - earlier for earlier, later in itertools.pairwise(progress)]
    assert max(gaps) < STALL_S, gaps
