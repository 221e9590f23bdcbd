"""Status derivation from a Deployment and the newest pod (spec §3.6, §3.8) and the status merge patch."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flexinfer.api.model import ModelStatus
from flexinfer.core.model_status.build import (
    DeploymentFacts,
    StatusInputs,
    build_status,
    derive_phase,
    endpoint,
    failed_status,
    loading_detail,
    newest_pod,
    status_patch,
)
from support.resource_builders import make_model

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(("desired", "facts", "state", "phase"), [
    (1, DeploymentFacts(1, 1, 0), "Preempted", "Preempted"),
    (0, DeploymentFacts(1, 1, 0), None, "Idle"),
    (1, None, None, "Pending"),
    (1, DeploymentFacts(1, 1, 0), "Active", "Ready"),
    (1, DeploymentFacts(1, 0, 1), None, "Loading"),
    (1, DeploymentFacts(1, 0, 0), None, "Pending"),
])
def test_phase_from_desired_replicas_group_state_and_deployment(
        desired: int, facts: DeploymentFacts | None, state: str | None, phase: str) -> None:
    assert derive_phase(desired, facts, state) == phase


def test_deployment_facts_read_spec_and_status() -> None:
    body = {"spec": {"replicas": 1}, "status": {"readyReplicas": 1, "unavailableReplicas": 2}}
    assert DeploymentFacts.from_body(body) == DeploymentFacts(1, 1, 2)
    assert DeploymentFacts.from_body(None) is None


def _pod(init: list[dict[str, Any]] | None = None, main: list[dict[str, Any]] | None = None,
         created: str = "2026-01-01T00:00:00Z", name: str = "p") -> dict[str, Any]:
    return {"metadata": {"name": name, "creationTimestamp": created},
            "status": {"initContainerStatuses": init or [], "containerStatuses": main or []}}


@pytest.mark.parametrize(("pod", "substage", "fragment"), [
    (_pod(init=[{"name": "flash-loader", "state": {"waiting": {"reason": "ErrImagePull", "message": "no auth"}}}]),
     "ImagePulling", "pulling image for init container flash-loader: no auth"),
    (_pod(init=[{"name": "flash-loader", "state": {"running": {}}, "ready": False}]),
     "LoadingWeights", "flash-loader"),
    (_pod(main=[{"name": "model", "state": {"waiting": {"reason": "ContainerCreating"}}}]),
     "Initializing", "ContainerCreating"),
    (_pod(main=[{"name": "model", "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "exit 1"}}}]),
     "Initializing", "CrashLoopBackOff exit 1"),
    (_pod(main=[{"name": "model", "state": {"running": {}}, "ready": False}]),
     "Initializing", "readiness probe not passing yet"),
])
def test_loading_substage_from_container_states(pod: dict[str, Any], substage: str, fragment: str) -> None:
    detail = loading_detail(pod)
    assert detail is not None and detail.substage == substage and fragment in detail.message


def test_a_running_flash_loader_names_its_log_and_the_server_waiting_for_it_does_not() -> None:
    staging = loading_detail(_pod(init=[{"name": "flash-loader", "state": {"running": {}}, "ready": False}],
                                  main=[{"name": "model", "state": {"waiting": {"reason": "PodInitializing"}}}]))
    assert staging is not None and staging.log_container == "flash-loader"
    other = loading_detail(_pod(init=[{"name": "setup", "state": {"running": {}}, "ready": False}]))
    assert other is not None and other.log_container is None


def test_unscheduled_pod_and_long_messages() -> None:
    unscheduled = {"type": "PodScheduled", "status": "False", "message": "Insufficient amd.com/gpu"}
    pod = {"status": {"conditions": [unscheduled]}}
    detail = loading_detail(pod)
    assert detail is not None and "Insufficient amd.com/gpu" in detail.message
    long = _pod(main=[{"name": "model", "state": {"waiting": {"reason": "X", "message": "y" * 400 + "\nmore"}}}])
    detail = loading_detail(long)
    assert detail is not None and len(detail.message) == 160
    assert loading_detail(None) is None


def test_newest_pod_wins() -> None:
    old, new = _pod(name="a", created="2026-01-01T00:00:00Z"), _pod(name="b", created="2026-01-01T00:00:05Z")
    assert newest_pod([new, old]) is new
    assert newest_pod([]) is None


def test_status_conditions_keep_transition_time_when_only_the_reason_changes() -> None:
    model = make_model("m", gpu={"vendor": "amd", "shared": "g"})
    pending = build_status(model, StatusInputs(phase="Pending", now=T0))
    assert pending.endpoint == "http://m.default.svc:8000" == endpoint(model)
    model = model.model_copy(update={"status": pending})
    idle = build_status(model, StatusInputs(phase="Idle", now=T0 + timedelta(seconds=5)))
    ready_cond = next(c for c in idle.conditions if c.type == "Ready")
    assert (ready_cond.reason, ready_cond.last_transition_time) == ("WaitingForActivation", T0)
    model = model.model_copy(update={"status": idle})
    ready = build_status(model, StatusInputs(phase="Ready", now=T0 + timedelta(seconds=9)))
    assert next(c for c in ready.conditions if c.type == "Ready").last_transition_time == T0 + timedelta(seconds=9)


def test_loading_progress_time_moves_only_when_the_substage_or_message_changes() -> None:
    from flexinfer.core.model_status.build import LoadingDetail

    model = make_model("m")
    detail = LoadingDetail("LoadingWeights", "staging")
    first = build_status(model, StatusInputs(phase="Loading", now=T0, loading=detail))
    model = model.model_copy(update={"status": first})
    same = build_status(model, StatusInputs(phase="Loading", now=T0 + timedelta(seconds=30), loading=detail))
    assert first.loading_progress_at == same.loading_progress_at == T0
    later = build_status(model, StatusInputs(phase="Loading", now=T0 + timedelta(seconds=40),
                                             loading=LoadingDetail("HealthCheckPending", "probing")))
    assert later.loading_progress_at == T0 + timedelta(seconds=40)


def test_status_patch_is_empty_when_unchanged_and_removes_cleared_fields() -> None:
    model = make_model("m")
    status = build_status(model, StatusInputs(phase="Idle", now=T0))
    assert status_patch(status, status) == {}
    patch = status_patch(ModelStatus(), status)
    assert patch["phase"] == "Idle" and all(c.get("message") is None for c in patch["conditions"])
    with_message = status.model_copy(update={"message": "x"})
    assert status_patch(with_message, status) == {"message": None}


def test_the_reported_demand_is_kept_in_status() -> None:
    """The proxies' newest ``lastActiveTime`` (folded into the status the manager builds) is written, so it
    outlives the proxy pods whose reports carried it."""
    status = build_status(make_model("m"), StatusInputs(phase="Ready", now=T0))
    reported = status.model_copy(update={"last_active_time": T0})
    assert set(status_patch(status, reported)) == {"lastActiveTime"}
    assert status_patch(reported, reported) == {}


def test_failed_status_names_the_field() -> None:
    failed = failed_status(ModelStatus(), 3, "spec.source: must start with HF://", T0)
    condition = next(c for c in failed.conditions if c.type == "ConfigValid")
    assert (failed.phase, condition.status, condition.reason) == ("Failed", "False", "ValidationFailed")
    assert "spec.source" in condition.message and condition.observed_generation == 3
