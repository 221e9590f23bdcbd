"""Journey step 5, continued: the runbook's rollout of the global flash-loader over shared models that are
running, and its backout, with the runbook's own commands (docs/operations/rocm-gfx1100.md, rollout step 3 and
the backout section).

Two llama.cpp Models share a group, their weights one file each on a claim that holds four (the `Memory`
strategy, a shared model's default: the flash-loader comes from the global default). With one of them Ready,
`helm upgrade --reuse-values --set controller.runtime.flashLoader.enabled=true` restarts it at once, as the
runbook says: its new pod hands the node's `/dev/shm/flexinfer/<ns>/<model>` (created root-owned by the kubelet)
to the loader's user, stages that model's file alone, and serves. The other one stages at its activation; a swap
back finds the copy in place. Models on the same claim outside the pair stage only their own file too: not
shared (into a memory emptyDir) and shared (`SharedPVC`; into the node's hostPath, handed to
the loader first). The backout restarts the running model without the loader.
(The report this covers: the flash-loader crash-looped with `Permission denied` on every shared model and staged
the whole claim.)
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from support.helm_chart import CHART_DIR, Helm
from support.real_node import (
    NAMESPACE,
    WEIGHTS_CLAIM,
    RealNode,
    record,
    runbook_command,
    shared_models_manifest,
    wait_for,
)
from support.tiny_gguf import write_tiny_gguf

PAIR = {"flash-a": 100, "flash-b": 200}
TMPFS = Path("/dev/shm/flexinfer") / NAMESPACE
LOADER_UID = 65532
SINGLES = {
    # name: (spec.gpu, spec.cache, source, the staged file)
    "flash-solo": ("{}", f"{{strategy: SharedPVC, pvcName: {WEIGHTS_CLAIM}}}", "file:///models/flash-b.gguf",
                   "flash-b.gguf"),
    "flash-cpu-pvc": ("{shared: flash-cpu}", f"{{strategy: SharedPVC, pvcName: {WEIGHTS_CLAIM}}}",
                      "file:///models/flash-b.gguf", "flash-b.gguf"),
}
"""Models outside the pair, each on the claim of four files: one not shared (its tmpfs a memory emptyDir), one
shared in a group of its own (the node's hostPath; `runtimeProfile: cpu` keeps it off the one `amd.com/gpu` the
pair holds). A non-shared model on a `Local` cache is test_5_flash_loader.py's; `Memory` is the pair's."""


def single_manifest(name: str) -> str:
    gpu, cache, source, _ = SINGLES[name]
    return f"""
apiVersion: ai.flexinfer/v1alpha2
kind: Model
metadata: {{name: {name}, namespace: {NAMESPACE}}}
spec:
  backend: llamacpp
  source: {source}
  gpu: {gpu}
  cache: {cache}
  config: {{runtimeProfile: cpu}}
  serverless: {{enabled: true, idleTimeout: 10m, coldStartTimeout: 240s}}
  resources: {{requests: {{cpu: 50m, memory: 64Mi}}, limits: {{memory: 1Gi}}}}
"""


def run_helm(helm: Helm, command: str) -> None:
    """A `helm …` line of the runbook, run with the session's helm (the chart path is the repository's)."""
    args = shlex.split(command)
    assert args[0] == "helm" and "charts/flexinfer" in args, command
    args = [str(CHART_DIR) if arg == "charts/flexinfer" else arg for arg in args[1:]]
    helm.run(*args, "--timeout", "300s", timeout=330)


@pytest.fixture(scope="module")
def pair(node: RealNode, weights: str) -> Iterator[None]:
    """flash-a and flash-b (one shared group) on the weights claim, which then holds four models' files."""
    folder = node.state_dir / "weights"
    for seed, name in enumerate(PAIR, start=3):
        write_tiny_gguf(folder / f"{name}.gguf", seed=seed).chmod(0o644)
    node.apply(shared_models_manifest(PAIR))
    wait_for(lambda: all(phase(node, m) == "Idle" for m in PAIR), 60, "both Models Idle")
    yield
    node.kubectl("delete", "mdl", *PAIR, *SINGLES, "-n", NAMESPACE, "--wait=true", "--timeout=120s", check=False)


def phase(node: RealNode, model: str) -> str | None:
    value: str | None = node.get("mdl", model, "-n", NAMESPACE).get("status", {}).get("phase")
    return value


def live_pod(node: RealNode, model: str) -> dict[str, Any] | None:
    pods = node.get("pods", "-n", NAMESPACE, "-l", f"flexinfer.ai/model={model}")["items"]
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    return live[0] if len(live) == 1 else None


def ready_pod(node: RealNode, model: str) -> dict[str, Any] | None:
    pod = live_pod(node, model)
    ready = pod is not None and any(c["type"] == "Ready" and c["status"] == "True"
                                    for c in pod["status"].get("conditions", []))
    return pod if ready and phase(node, model) == "Ready" else None


def settled(node: RealNode, model: str) -> dict[str, Any]:
    """The model's pod once the kubelet also says it is Ready: the manager asks the server itself, so a reply can
    come before the kubelet's next probe."""
    pod: dict[str, Any] = wait_for(lambda: ready_pod(node, model), 30, f"{model}'s pod Ready (the kubelet's probe)")
    return pod


def restarted(node: RealNode, model: str, before: dict[str, Any], what: str) -> dict[str, Any]:
    """The Ready pod of ``model`` that replaced ``before`` (on timeout: the Models, pods and manager log)."""
    try:
        pod: dict[str, Any] = wait_for(lambda: (pod := ready_pod(node, model)) and pod["metadata"]["name"] !=
                                       before["metadata"]["name"] and pod, 240, what)
        return pod
    except AssertionError as error:
        state = "\n".join(node.kubectl(*args, check=False).stdout for args in (
            ("get", "mdl,pods", "-n", NAMESPACE, "-o", "wide"),
            ("logs", "deploy/flexinfer-controller", "-n", NAMESPACE, "--tail=80")))
        raise AssertionError(f"{error}\n{state}") from None


def init_names(pod: dict[str, Any]) -> list[str]:
    return [c["name"] for c in pod["spec"].get("initContainers", [])]


def loader_log(node: RealNode, pod: dict[str, Any]) -> str:
    return node.kubectl("logs", pod["metadata"]["name"], "-n", NAMESPACE, "-c", "flash-loader").stdout


def ask(node: RealNode, model: str) -> str:
    ip = node.get("service", "flexinfer-proxy", "-n", NAMESPACE)["spec"]["clusterIP"]
    client = OpenAI(base_url=f"http://{ip}/v1", api_key="unused", timeout=300, max_retries=0)
    reply = client.chat.completions.create(model=model, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].finish_reason in ("length", "stop")
    return reply.model


def staged_alone(model: str, file: str = "") -> None:
    """The node's tmpfs of ``model`` holds its one file (default ``<model>.gguf``), owned by the loader's user."""
    folder, file = TMPFS / model, file or f"{model}.gguf"
    assert sorted(p.name for p in folder.iterdir()) == [file]
    assert folder.stat().st_uid == LOADER_UID and (folder / file).stat().st_uid == LOADER_UID


@pytest.mark.timeout(900)
def test_turning_it_on_restarts_a_running_shared_model_which_stages_its_own_file(
        node: RealNode, helm: Helm, pair: None) -> None:
    assert ask(node, "flash-a") == "flash-a"
    before = settled(node, "flash-a")
    assert init_names(before) == []

    began = time.monotonic()
    run_helm(helm, runbook_command("helm upgrade", "flashLoader.enabled=true"))
    after = restarted(node, "flash-a", before, "flash-a restarted with the flash-loader, Ready")
    record("flash-loader on: upgrade -> running shared model Ready again", time.monotonic() - began)
    assert init_names(after) == ["flash-tmpfs-owner", "flash-loader"]
    assert "copied 1 files" in loader_log(node, after), loader_log(node, after)  # not the claim's four
    staged_alone("flash-a")
    assert ask(node, "flash-a") == "flash-a"

    assert ask(node, "flash-b") == "flash-b"  # a swap: flash-b stages at its activation
    b = live_pod(node, "flash-b")
    assert b is not None and "copied 1 files" in loader_log(node, b)
    staged_alone("flash-b")
    assert ask(node, "flash-a") == "flash-a"  # swapped back in: its copy is still there
    back = live_pod(node, "flash-a")
    assert back is not None and back["metadata"]["name"] != after["metadata"]["name"]
    log = loader_log(node, back)
    assert "copied 0 files" in log and "skipped 1 unchanged" in log, log


@pytest.mark.timeout(300)
@pytest.mark.parametrize("model", list(SINGLES))
def test_a_model_on_a_shared_claim_stages_only_its_own_file(node: RealNode, pair: None, model: str) -> None:
    gpu, _, _, file = SINGLES[model]
    shared = "shared" in gpu
    node.apply(single_manifest(model))
    assert ask(node, model) == model
    pod = live_pod(node, model)
    assert pod is not None
    assert init_names(pod) == (["flash-tmpfs-owner", "flash-loader"] if shared else ["flash-loader"])
    loader = pod["spec"]["initContainers"][-1]
    assert [m["mountPath"] for m in loader["volumeMounts"]] == [f"/src/{file}", "/models"]
    assert "copied 1 files" in loader_log(node, pod), loader_log(node, pod)
    tmpfs = next(v for v in pod["spec"]["volumes"] if v["name"] == "flash-tmpfs")
    if shared:
        assert tmpfs["hostPath"]["path"] == str(TMPFS / model)
        staged_alone(model, file)
    else:
        assert tmpfs["emptyDir"]["medium"] == "Memory"


@pytest.mark.timeout(600)
def test_the_backout_restarts_the_running_model_without_the_loader(node: RealNode, helm: Helm, pair: None) -> None:
    # The group's higher-priority member holds the GPU.
    assert ask(node, "flash-b") == "flash-b"
    before = settled(node, "flash-b")
    assert init_names(before) == ["flash-tmpfs-owner", "flash-loader"]
    run_helm(helm, runbook_command("helm upgrade", "flashLoader.enabled=false"))
    after = restarted(node, "flash-b", before, "flash-b restarted without the flash-loader, Ready")
    assert init_names(after) == []
    assert ask(node, "flash-b") == "flash-b"
