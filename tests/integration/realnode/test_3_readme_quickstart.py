"""Journey step 3: README's Kubernetes quickstart, verbatim, on the installed release (its `helm install`
line is the session's install, see conftest). The example Models in `default` are served by the proxy
installed in flexinfer-system (the namespace mismatch the quickstart once had)."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from collections.abc import Iterator

import pytest

from support.kube_testbed import REPO_ROOT, ensure_kubectl
from support.real_node import NAMESPACE, RealNode, readme_quickstart, wait_for

EXAMPLES = {"qwen25-7b-chat", "qwen25-coder-7b"}


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
