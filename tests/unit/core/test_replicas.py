"""Tests for flexinfer.core.replicas (spec §3.2 desired replicas and per-model timeouts)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from flexinfer.api.model import Model
from flexinfer.core.replicas import cold_start_timeout_seconds, desired_replicas, idle_timeout_seconds

NOW = datetime(2025, 1, 1, tzinfo=UTC)


def model(status: dict[str, Any] | None = None, **spec: Any) -> Model:
    body = {"backend": "llamacpp", "source": "file:///m.gguf", **spec}
    return Model.model_validate({"metadata": {"name": "m"}, "spec": body, "status": status or {}})


def desired(m: Model, in_flight: bool = False) -> int:
    return desired_replicas(m, NOW, in_flight=in_flight)


def ago(seconds: float) -> str:
    return (NOW - timedelta(seconds=seconds)).isoformat()


def test_timeouts_default_and_override() -> None:
    assert idle_timeout_seconds(model()) == 300
    assert idle_timeout_seconds(model(backend="comfyui")) == 600
    assert idle_timeout_seconds(model(serverless={"idleTimeout": "90s"})) == 90
    assert cold_start_timeout_seconds(model(), 60) == 60
    assert cold_start_timeout_seconds(model(serverless={"coldStartTimeout": "2m"}), 60) == 120


def test_rules_in_order() -> None:
    queued = model({"sharedGroup": {"state": "Queued"}, "lastActiveTime": ago(1)}, gpu={"shared": "g"})
    assert desired(queued) == 0
    assert desired(model(serverless={"enabled": False})) == 1
    assert desired(model()) == 0
    assert desired(model(serverless={"minReplicas": 2})) == 2
    assert desired(model(config={"warmPolicy": "primary"})) == 1
    assert desired(model({"phase": "Loading", "lastActiveTime": ago(3600)})) == 1, "never reap mid-load"
    assert desired(model({"phase": "Ready", "lastActiveTime": ago(301)})) == 0
    assert desired(model({"phase": "Ready", "lastActiveTime": ago(299)})) == 1
    active = model({"sharedGroup": {"state": "Active"}, "lastActiveTime": ago(1)}, gpu={"shared": "g"})
    assert desired(active) == 1


def test_a_model_is_not_idle_while_requests_are_in_flight_or_just_after_it_became_ready() -> None:
    """idleTimeout 15 s; the request that woke the model waited 20 s for it (its lastActiveTime is 20 s old)."""
    def ready(since: float) -> dict[str, Any]:
        return {"phase": "Ready", "lastActiveTime": ago(20),
                "conditions": [{"type": "Ready", "status": "True", "reason": "BackendReady",
                                "lastTransitionTime": ago(since)}]}
    short = {"serverless": {"idleTimeout": "15s"}}
    assert desired(model(ready(0.5), **short)) == 1, "Ready half a second ago: not idle yet"
    assert desired(model(ready(16), **short)) == 0, "idle for the whole timeout since Ready"
    assert desired(model(ready(16), **short), in_flight=True) == 1, "a proxy reports requests in flight"
