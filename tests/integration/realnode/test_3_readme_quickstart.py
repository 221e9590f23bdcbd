"""Journey step 3: README's Kubernetes quickstart, verbatim, on the installed release (its `helm install`
line is the session's install, see conftest). The example Models in `default` are served by the proxy
installed in flexinfer-system (the namespace mismatch the quickstart once had). They ask for a gfx1100 node this
node is not, so a request for one fails within seconds naming the scheduler's reason, and `kubectl get mdl`
shows it (issue #23, defect 6)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator

import openai
import pytest

from support.kube_testbed import REPO_ROOT, ensure_kubectl
from support.real_node import NAMESPACE, RealNode, readme_quickstart, record, wait_for

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
