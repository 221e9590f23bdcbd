"""The proxy dispatcher's view of the watch cache (``flexinfer.cluster_proxy.dispatch_sync``): the Model
projection and the rule for a model leaving Ready in the cluster."""

from __future__ import annotations

from typing import Any

import pytest

from flexinfer.api.conventions import ENDPOINT_OVERRIDE_ANNOTATION as OVERRIDE
from flexinfer.api.model import Model
from flexinfer.cluster_proxy.dispatch_sync import dispatch_model, left_ready
from support.fake_model_api import model_body


def model(phase: str | None, endpoint: str | None = "http://m.default.svc:8000", **meta: Any) -> Model:
    doc = model_body("m", phase=phase, **meta)
    if endpoint is not None and phase is not None:
        doc["status"]["endpoint"] = endpoint
    return Model.model_validate(doc)


def test_dispatch_model_drops_the_group_and_keeps_the_serverless_spec_as_stored() -> None:
    serverless = {"minReplicas": 1, "idleTimeout": "1m", "coldStartTimeout": "90s"}
    original = Model.model_validate(model_body("m", gpu={"shared": "gpu0", "priority": 300}, serverless=serverless))
    projected = dispatch_model(original)
    assert projected.group is None and projected.priority == 300
    assert projected.spec.serverless == original.spec.serverless


@pytest.mark.parametrize(("old", "new", "left"), [
    (model("Ready"), model("Ready"), False),
    (model("Ready"), model("Preempted"), True),
    (model("Ready"), None, True),
    (model("Ready"), model("Ready", "http://other:8000"), True),
    (model("Loading"), model("Idle"), False),
    (model("Idle"), None, False),
])
def test_left_ready_is_not_ready_any_more_or_ready_elsewhere(old: Model, new: Model | None, left: bool) -> None:
    assert left_ready(old, new, override=False) is left


def test_with_the_override_the_annotated_endpoint_decides() -> None:
    old = model("Ready", annotations={OVERRIDE: "http://127.0.0.1:9000"})
    moved = model("Ready", annotations={OVERRIDE: "http://127.0.0.1:9001"})
    assert left_ready(old, moved, override=True) and not left_ready(old, moved, override=False)


def member(phase: str, group_endpoint: str | None) -> Model:
    """A member of a group that runs in a group pod, as the manager mirrors it."""
    doc = model_body("m", phase=phase, gpu={"shared": "gpu0"})
    doc["status"]["sharedGroup"] = {"groupName": "gpu0", "strategy": "TimeSliced", "groupEndpoint": group_endpoint}
    if phase == "Ready":
        doc["status"]["podEndpoint"] = group_endpoint
    return Model.model_validate(doc)


@pytest.mark.parametrize(("old", "new", "left"), [
    (member("Ready", "http://10.0.0.7:8080"), member("Idle", "http://10.0.0.7:8080"), False),
    (member("Idle", "http://10.0.0.7:8080"), member("Loading", "http://10.0.0.7:8080"), False),
    (member("Idle", "http://10.0.0.7:8080"), member("Idle", None), True),
    (member("Ready", "http://10.0.0.7:8080"), member("Failed", "http://10.0.0.7:8080"), False),
    (member("Idle", "http://10.0.0.7:8080"), member("Idle", "http://10.0.0.9:8080"), True),
    (member("Idle", None), member("Idle", "http://10.0.0.7:8080"), False),
])
def test_a_group_pods_member_is_forwarded_to_the_pod_while_it_runs(old: Model, new: Model, left: bool) -> None:
    """A swap inside the group pod (Ready → Idle there) keeps the proxy forwarding to the pod, as does a start that
    failed there (the pod answers and retries it); the pod going away or moving sends the next request through
    demand again."""
    assert left_ready(old, new, override=False) is left
