"""Journey step 7: models that can never become Ready fail their callers fast, naming the cause (issue #23,
defect 6). A llama.cpp Model whose weights file is missing crashes at start (CrashLoopBackOff); so does one whose
`spec.config.args` carry a flag llama-server does not know (the args reach it unchanged, and its own message is
what the caller reads); one whose image has a typo cannot be pulled (ImagePullBackOff; no registry is reachable
from the node). Neither sets a
`coldStartTimeout`, so a waiting request's budget is the chart's 10 minutes: it must get a 503 naming the cause
within a minute instead, the Model must be Failed with the cause on its `Ready` condition and in `kubectl get
mdl`, and a Warning event named after the cause must be on the Model. (The unschedulable case is the
quickstart's example Model, step 3.)"""

from __future__ import annotations

import time
from collections.abc import Iterator

import openai
import pytest

from support.real_node import LLAMACPP_IMAGE, NAMESPACE, WEIGHTS_CLAIM, RealNode, record

FAIL_FAST_S = 60.0
"""Longest acceptable wait for the 503 (two crashes of a server include the kubelet's 10 s back-off)."""
TYPO_IMAGE = LLAMACPP_IMAGE.replace("llamacpp-server", "llamacpp-sever")
BROKEN = f"""
apiVersion: ai.flexinfer/v1alpha2
kind: Model
metadata: {{name: tiny-crash, namespace: {NAMESPACE}}}
spec:
  backend: llamacpp
  source: pvc://{WEIGHTS_CLAIM}/missing.gguf
  serverless: {{enabled: true, idleTimeout: 10m}}
  resources: {{requests: {{cpu: 50m, memory: 64Mi}}, limits: {{memory: 1Gi}}}}
---
apiVersion: ai.flexinfer/v1alpha2
kind: Model
metadata: {{name: tiny-bogus, namespace: {NAMESPACE}}}
spec:
  backend: llamacpp
  source: pvc://{WEIGHTS_CLAIM}/tiny-a.gguf
  config: {{args: ["--bogus-flag"]}}
  serverless: {{enabled: true, idleTimeout: 10m}}
  resources: {{requests: {{cpu: 50m, memory: 64Mi}}, limits: {{memory: 1Gi}}}}
---
apiVersion: ai.flexinfer/v1alpha2
kind: Model
metadata: {{name: tiny-typo, namespace: {NAMESPACE}}}
spec:
  backend: llamacpp
  image: {TYPO_IMAGE}
  source: pvc://{WEIGHTS_CLAIM}/tiny-a.gguf
  serverless: {{enabled: true, idleTimeout: 10m}}
  resources: {{requests: {{cpu: 50m, memory: 64Mi}}, limits: {{memory: 1Gi}}}}
"""
CASES = [("tiny-crash", "CrashLoopBackOff", "crashed"), ("tiny-bogus", "CrashLoopBackOff", "--bogus-flag"),
         ("tiny-typo", "ImagePullBackOff", "llamacpp-sever")]


@pytest.fixture(scope="module")
def broken(node: RealNode, weights: str) -> Iterator[None]:
    node.apply(BROKEN)
    yield
    node.kubectl("delete", "mdl", "tiny-crash", "tiny-bogus", "tiny-typo", "-n", NAMESPACE, "--wait=true",
                 "--timeout=120s", check=False)


@pytest.mark.parametrize(("model", "reason", "words"), CASES, ids=[c[0] for c in CASES])
def test_a_model_that_cannot_start_fails_its_waiting_request_fast(node: RealNode, broken: None, model: str,
                                                                  reason: str, words: str) -> None:
    ip = node.get("service", "flexinfer-proxy", "-n", NAMESPACE)["spec"]["clusterIP"]
    client = openai.OpenAI(base_url=f"http://{ip}/v1", api_key="unused", timeout=900, max_retries=0)
    began = time.monotonic()
    with pytest.raises(openai.APIStatusError) as failure:
        client.chat.completions.create(model=model, max_tokens=4, messages=[{"role": "user", "content": "hello"}])
    waited = time.monotonic() - began
    record(f"{model}: request -> 503", waited)
    message = str(failure.value.body)
    print(f"\n{model}: 503 after {waited:.1f}s: {message}")
    assert failure.value.status_code == 503 and reason in message and words in message, message
    assert waited < FAIL_FAST_S, f"answered after {waited:.1f}s"

    status = node.get("mdl", model, "-n", NAMESPACE)["status"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert status["phase"] == "Failed" and (ready["status"], ready["reason"]) == ("False", reason), status
    listing = node.kubectl("get", "mdl", model, "-n", NAMESPACE).stdout
    assert "Failed" in listing and reason in listing and words in listing, listing
    events = node.get("events", "-n", NAMESPACE, "--field-selector", f"involvedObject.name={model},reason={reason}")
    assert events["items"] and events["items"][0]["type"] == "Warning", events

    began = time.monotonic()
    with pytest.raises(openai.APIStatusError) as again:  # the next caller learns it at once
        client.chat.completions.create(model=model, max_tokens=4, messages=[{"role": "user", "content": "hello"}])
    assert again.value.status_code == 503 and reason in str(again.value.body)
    assert time.monotonic() - began < 5.0
