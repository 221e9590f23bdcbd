"""Journey step 9: `helm uninstall` with Models present, as the runbook's uninstall section says
(docs/operations/rocm-gfx1100.md), its commands run as written.

The examples/cpu-node pair (one of them Ready, its weights staged into the node's tmpfs) and a pinned Model run
when the release is uninstalled. The chart's pre-delete hook stops the manager and every model first: afterwards
no model pod runs, no tmpfs cleanup Job or hook object is left, the Ready model's tmpfs on the node is empty,
and the Models are still there without the finalizer, so `kubectl delete mdl --all -A` removes them at once.
(The defect: the manager went first; the Models kept the finalizer, their pods kept the GPU, and deleting them
hung until someone patched the finalizer away.) The release stays uninstalled for the steps after this one.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from support.helm_chart import Helm
from support.kube_testbed import REPO_ROOT, ensure_kubectl
from support.real_node import (
    EXAMPLE_DIR,
    NAMESPACE,
    WEIGHTS_CLAIM,
    RealNode,
    record,
    remove_created,
    runbook_command,
    wait_for,
    write_example_weights,
)

EXAMPLES_NS = "flexinfer-examples"
PINNED = f"""
apiVersion: ai.flexinfer/v1alpha2
kind: Model
metadata: {{name: pinned, namespace: {NAMESPACE}}}
spec:
  backend: llamacpp
  source: pvc://{WEIGHTS_CLAIM}/tiny-b.gguf
  serverless: {{enabled: false}}
  resources: {{requests: {{cpu: 50m, memory: 64Mi}}, limits: {{memory: 1Gi}}}}
"""
MANAGED = "app.kubernetes.io/managed-by=flexinfer"


@pytest.fixture(scope="module")
def running(node: RealNode, release: str, weights: str) -> Iterator[None]:
    """The example pair in a namespace of its own (weights where its README puts them) and a pinned Model."""
    node.kubectl("create", "namespace", EXAMPLES_NS, check=False)
    created = write_example_weights(EXAMPLES_NS)
    node.kubectl("apply", "-n", EXAMPLES_NS, "-f", str(EXAMPLE_DIR))
    node.apply(PINNED)
    try:
        yield
    finally:
        for namespace in (EXAMPLES_NS, NAMESPACE):
            node.kubectl("delete", "mdl", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False)
        node.kubectl("delete", "namespace", EXAMPLES_NS, "--wait=false", check=False)
        remove_created(created)


def sh(node: RealNode, command: str, timeout: float = 120.0) -> str:
    env = {**os.environ, "KUBECONFIG": str(node.kubeconfig),
           "PATH": f"{ensure_kubectl().parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=REPO_ROOT, capture_output=True, text=True,
                          env=env, timeout=timeout, check=False)
    assert proc.returncode == 0, f"{command!r} exited {proc.returncode}: {proc.stderr}"
    return proc.stdout


def items(node: RealNode, *args: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = node.get(*args)["items"]
    return found


def names(objects: list[dict[str, Any]]) -> list[str]:
    return sorted(f"{o['metadata'].get('namespace', '')}/{o['metadata']['name']}" for o in objects)


@pytest.mark.timeout(900)
def test_uninstall_with_models_present_leaves_nothing_running(node: RealNode, helm: Helm, running: None) -> None:
    ip = node.get("service", "flexinfer-proxy", "-n", NAMESPACE)["spec"]["clusterIP"]
    client = OpenAI(base_url=f"http://{ip}/v1", api_key="unused", timeout=300, max_retries=0)
    client.chat.completions.create(model="tiny-a", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    wait_for(lambda: node.get("mdl", "pinned", "-n", NAMESPACE).get("status", {}).get("phase") == "Ready", 240,
             "the pinned Model Ready")
    tmpfs = Path("/dev/shm/flexinfer") / EXAMPLES_NS / "tiny-a"
    assert (tmpfs / "model.gguf").is_file()
    assert len(items(node, "pods", "-A", "-l", MANAGED)) >= 2

    uninstall = shlex.split(runbook_command("helm uninstall"))
    assert uninstall[:2] == ["helm", "uninstall"]
    began = time.monotonic()
    helm.run(*uninstall[1:], "--timeout", "300s", timeout=330)
    record("helm uninstall with Models present", time.monotonic() - began)

    assert items(node, "pods", "-A", "-l", MANAGED) == []  # no model pod, no cleanup pod
    assert items(node, "jobs", "-A", "-l", "flexinfer.ai/tmpfs-cleanup") == []
    assert items(node, "jobs,serviceaccounts", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=uninstall") == []
    assert items(node, "deployments,services", "-A", "-l", MANAGED) == []
    assert not tmpfs.exists(), "the Ready model's tmpfs copy was not emptied"
    listing = sh(node, runbook_command("kubectl get mdl"))
    models = items(node, "mdl", "-A")
    assert names(models) == [f"{EXAMPLES_NS}/tiny-a", f"{EXAMPLES_NS}/tiny-b", f"{NAMESPACE}/pinned"], listing
    assert all("flexinfer.ai/model-cleanup" not in (m["metadata"].get("finalizers") or []) for m in models)

    began = time.monotonic()
    sh(node, runbook_command("kubectl delete mdl"), timeout=60)
    record("kubectl delete mdl --all -A after the uninstall", time.monotonic() - began)
    assert items(node, "mdl", "-A") == []
