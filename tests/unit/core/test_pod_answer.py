"""Tests for flexinfer.core.pod_answer: what the manager asks a starting pod, and when the answer counts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from flexinfer.api.model import ModelStatus
from flexinfer.core.model_status.build import DeploymentFacts, ReadySource
from flexinfer.core.pod_answer import (
    answered_at,
    health_target,
    kubelet_ready,
    pod_endpoint,
    ready_by_answer,
    ready_from,
    run_key,
    with_pod_endpoint,
)

T0 = datetime(2026, 12, 4, 12, 0, 0, tzinfo=UTC)


def stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(*, ip: str | None = "10.88.0.7", ready: bool = False, since: datetime = T0, running: bool = True,
        probe: dict[str, Any] | None = None, deleting: bool = False, restarts: int = 0) -> dict[str, Any]:
    get = {"path": "/health", "port": "http"} if probe is None else probe
    meta: dict[str, Any] = {"name": "m-1"}
    if deleting:
        meta["deletionTimestamp"] = stamp(T0)
    status: dict[str, Any] = {
        "conditions": [{"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": stamp(since)}],
        "containerStatuses": [{"name": "model", "restartCount": restarts,
                               "state": {"running": {"startedAt": stamp(T0)}} if running else {"waiting": {}}}]}
    if ip:
        status["podIP"] = ip
    return {"metadata": meta, "status": status, "spec": {"containers": [
        {"name": "model", "ports": [{"name": "http", "containerPort": 8080}], "readinessProbe": {"httpGet": get}}]}}


def test_the_target_is_the_pods_own_readiness_path_and_port_while_it_is_not_ready() -> None:
    target = health_target(pod())
    assert target is not None and target.url == "http://10.88.0.7:8080/health"
    assert target.key == run_key(pod()) and target.key != run_key(pod(restarts=1)), "one answer per container run"
    assert health_target(pod(probe={"path": "healthz", "port": 9000})).url == "http://10.88.0.7:9000/healthz"
    assert health_target(pod(ip="fd00::7")).url == "http://[fd00::7]:8080/health"
    for nothing in (pod(ready=True), pod(ip=None), pod(running=False), pod(deleting=True),
                    pod(probe={"path": "/health", "port": "http", "scheme": "HTTPS"}), pod(probe={"path": "/x"})):
        assert health_target(nothing) is None
    assert health_target(None) is None


def starting(pod_body: dict[str, Any], state: dict[str, Any] | None, **status: Any) -> dict[str, Any]:
    """``pod_body`` with its model container's status replaced (``None``: no status reported yet)."""
    body = {**pod_body, "status": {**pod_body["status"]}}
    body["status"]["containerStatuses"] = [] if state is None else [
        {"name": "model", "restartCount": 0, "state": state, **status}]
    return body


def test_a_pod_is_asked_from_its_address_on_before_the_kubelet_reports_the_container_running() -> None:
    """The kubelet reports a started container only at its next relist; the server may listen before that."""
    running_key = run_key(pod())
    for early in (starting(pod(), None), starting(pod(), {"waiting": {"reason": "ContainerCreating"}}),
                  starting(pod(), {"waiting": {"reason": "PodInitializing"}})):
        target = health_target(early)
        assert target is not None and target.url == "http://10.88.0.7:8080/health"
        assert target.key == running_key, "an answer before the running report counts once it arrives"
        assert answered_at(pod(), {target.key: T0}) == T0
    assert health_target(starting(pod(ip=None), {"waiting": {"reason": "ContainerCreating"}})) is None
    for ended in (starting(pod(), {"terminated": {"exitCode": 1}}),
                  starting(pod(), {"waiting": {"reason": "CrashLoopBackOff"}}, restartCount=2,
                           lastState={"terminated": {"exitCode": 1}}),
                  starting(pod(), {"waiting": {"reason": "ContainerCreating"}}, restartCount=1,
                           lastState={"terminated": {"exitCode": 137}}),
                  starting(pod(), {"waiting": {"reason": "ImagePullBackOff"}}),
                  starting(pod(), {"waiting": {"reason": "CreateContainerConfigError"}})):
        assert health_target(ended) is None and run_key(ended) is None
        assert answered_at(ended, {str(running_key): T0}) is None, "a crashed run's answer no longer counts"


def test_an_answer_counts_for_the_container_run_it_was_given_by() -> None:
    answered = T0 + timedelta(seconds=1.5)
    key = run_key(pod())
    assert key is not None
    assert answered_at(pod(since=T0 + timedelta(seconds=3)), {key: answered}) == answered, (
        "the kubelet's first status (Ready False, stamped after the answer) does not undo it")
    assert answered_at(pod(deleting=True), {key: answered}) is None
    assert answered_at(pod(restarts=1), {key: answered}) is None, "an answer of the container's previous run"
    assert kubelet_ready(pod(ready=True)) and not kubelet_ready(pod())


def test_an_answer_counts_the_pod_ready_and_is_the_ready_instant() -> None:
    live = DeploymentFacts(replicas=1, ready_replicas=0, unavailable_replicas=1)
    assert ready_by_answer(live, T0) == DeploymentFacts(1, 1, 0)
    assert ready_by_answer(live, None) == live and ready_by_answer(DeploymentFacts(0, 0, 0), T0).ready_replicas == 0
    assert ready_from(pod(), None, T0) == ReadySource("Pod", "m-1", T0)
    assert ready_from(pod(ready=True, since=T0 + timedelta(seconds=2)), None, T0).since == T0 + timedelta(seconds=2)
    assert ready_from(pod(), None, None) is None


def test_the_pod_endpoint_is_published_only_for_one_ready_pod_that_says_so() -> None:
    ready, source = ModelStatus(phase="Ready"), ReadySource("Pod", "m-1", T0)
    assert with_pod_endpoint(ready, pod(), 1, source).pod_endpoint == "http://10.88.0.7:8080" == pod_endpoint(pod())
    published = with_pod_endpoint(ready, pod(), 1, source)
    assert with_pod_endpoint(published, pod(), 2, source).pod_endpoint is None, "several replicas: the Service"
    assert with_pod_endpoint(published, pod(), 1, ReadySource("Deployment", "m", T0)).pod_endpoint is None
    assert with_pod_endpoint(published, pod(), 1, None).pod_endpoint is None
    assert with_pod_endpoint(published.model_copy(update={"phase": "Loading"}), pod(), 1, source).pod_endpoint is None
    assert with_pod_endpoint(published, pod(deleting=True), 1, source).pod_endpoint is None
