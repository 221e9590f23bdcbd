"""The rule that turns a model server's pod into phase Failed (``flexinfer.core.model_status.pod_failure``): what
counts as terminal (Unschedulable, a failed pull in back-off, a crash loop) and what is a transient that must not
fail waiting requests (a first ``ErrImagePull``, one crash, a pod waiting for the GPU during its group's swap); and
the out-of-memory signature a group that packs by memory retries once (``out_of_memory_sign``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from flexinfer.api.model import ModelStatus
from flexinfer.core.model_status.pod_failure import (
    CRASHES_BEFORE_FAILED,
    DEVICE_SETTLE,
    PodFailure,
    crash_cause,
    device_held_by_group,
    out_of_memory_sign,
    pod_failure,
    shown_failure,
)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
GPU = {"limits": {"amd.com/gpu": "1", "memory": "1Gi"}}
Body = dict[str, Any]


def pod(*, containers: list[Body] | None = None, init: list[Body] | None = None, conditions: list[Body] | None = None,
        node: str | None = None, resources: Body | None = None) -> Body:
    spec: Body = {"containers": [{"name": "model", "resources": resources or GPU}]}
    if node:
        spec["nodeName"] = node
    status: Body = {"conditions": conditions or [], "containerStatuses": containers or []}
    if init is not None:
        status["initContainerStatuses"] = init
    return {"metadata": {"name": "m-1"}, "spec": spec, "status": status}


def waiting(reason: str, message: str = "", restarts: int = 0, name: str = "model", **extra: Any) -> Body:
    return {"name": name, "ready": False, "restartCount": restarts,
            "state": {"waiting": {"reason": reason, "message": message}}, **extra}


def unschedulable(message: str) -> list[Body]:
    return [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]


AFFINITY = "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity."
NO_GPU = "0/1 nodes are available: 1 Insufficient amd.com/gpu."


def test_an_unschedulable_pod_fails_with_the_schedulers_words() -> None:
    failure = pod_failure(pod(conditions=unschedulable(AFFINITY)))
    assert failure == PodFailure("Unschedulable", f"Unschedulable: {AFFINITY}")


def test_a_pod_waiting_for_the_gpu_during_its_groups_swap_is_not_failed() -> None:
    waiting_for_gpu = pod(conditions=unschedulable(NO_GPU))
    assert pod_failure(waiting_for_gpu, gpu_wait_expected=True) is None
    assert pod_failure(waiting_for_gpu) is not None, "nobody in the group holds the GPU: something else does"
    other_cause = pod(conditions=unschedulable(AFFINITY))
    assert pod_failure(other_cause, gpu_wait_expected=True) is not None, "a swap does not explain node affinity"
    cpu_only = pod(conditions=unschedulable("0/1 nodes are available: 1 Insufficient amd.com/gpu."),
                   resources={"limits": {"memory": "1Gi"}})
    assert pod_failure(cpu_only, gpu_wait_expected=True) is not None, "the pod does not even ask for a GPU"
    several = "0/3 nodes are available: 1 Insufficient amd.com/gpu, 2 node(s) didn't match node selector."
    assert pod_failure(pod(conditions=unschedulable(several)), gpu_wait_expected=True) is None


def test_a_bound_pod_is_not_unschedulable_even_while_its_condition_is_stale() -> None:
    assert pod_failure(pod(conditions=unschedulable(AFFINITY), node="node-1")) is None


def test_a_failed_pull_fails_once_the_kubelet_backs_off_not_at_the_first_error() -> None:
    refused = 'failed to pull and unpack image "docker.io/library/typo:1": connection refused'
    assert pod_failure(pod(containers=[waiting("ErrImagePull", refused)])) is None
    failure = pod_failure(pod(containers=[waiting("ImagePullBackOff", 'Back-off pulling image "typo:1"')]))
    assert failure is not None and failure.reason == "ImagePullBackOff"
    assert failure.message == 'ImagePullBackOff: container model: Back-off pulling image "typo:1"'
    invalid = pod_failure(pod(containers=[waiting("InvalidImageName", "couldn't parse image reference")]))
    assert invalid is not None and invalid.reason == "InvalidImageName"


def test_a_retried_pull_keeps_the_failure_already_shown() -> None:
    """After its back-off the kubelet pulls again (``ErrImagePull`` for a moment): the Model stays Failed instead
    of flipping to Loading and back with every retry."""
    retry = pod(containers=[waiting("ErrImagePull", "connection refused")])
    shown = ("ImagePullBackOff", "ImagePullBackOff: container model: Back-off pulling image")
    assert pod_failure(retry, previous=shown) == PodFailure(*shown)
    assert pod_failure(pod(containers=[{"name": "model", "ready": False, "state": {"running": {}}}]),
                       previous=shown) is None, "the image arrived and the server runs: the failure is over"


def test_one_crash_is_a_transient_the_second_in_a_row_fails_and_names_the_exit() -> None:
    crashed = {"lastState": {"terminated": {"reason": "Error", "exitCode": 1}}}
    once = pod(containers=[waiting("CrashLoopBackOff", "back-off 10s restarting failed container", 1, **crashed)])
    assert pod_failure(once) is None
    twice = pod(containers=[waiting("CrashLoopBackOff", "back-off 20s", CRASHES_BEFORE_FAILED, **crashed)])
    failure = pod_failure(twice)
    assert failure is not None and failure.reason == "CrashLoopBackOff" and failure.log_container == "model"
    assert failure.message == "CrashLoopBackOff: container model crashed 2 times (Error, exit code 1)"
    cause = failure.with_cause(crash_cause(["Traceback (most recent call last):", "  ...",
                                            "ValueError: Model path does not exist: /models/x.gguf", ""]))
    assert cause.message == ("CrashLoopBackOff: container model crashed 2 times: "
                             "ValueError: Model path does not exist: /models/x.gguf")
    assert cause.log_container is None and failure.with_cause(None) == failure


def test_a_crash_looping_container_restarted_stays_failed_until_ready() -> None:
    shown = ("CrashLoopBackOff", "CrashLoopBackOff: container model crashed 2 times (Error, exit code 1)")
    restarted = {"name": "model", "ready": False, "restartCount": 2, "state": {"running": {}}}
    assert pod_failure(pod(containers=[restarted]), previous=shown) == PodFailure(*shown)
    assert pod_failure(pod(containers=[{**restarted, "ready": True}]), previous=shown) is None
    assert pod_failure(pod(containers=[{**restarted, "restartCount": 1}]), previous=shown) is None


def test_a_crash_looping_init_container_and_a_missing_secret_fail_too() -> None:
    loader = waiting("CrashLoopBackOff", "", 3, name="flash-loader")
    failure = pod_failure(pod(init=[loader]))
    assert failure is not None and failure.message.startswith("CrashLoopBackOff: init container flash-loader crashed")
    config = pod_failure(pod(containers=[waiting("CreateContainerConfigError", 'secret "hf" not found')]))
    assert config is not None and config.message == 'CreateContainerConfigError: container model: secret "hf" not found'


def test_a_pod_being_deleted_or_absent_shows_no_failure() -> None:
    deleting = pod(conditions=unschedulable(AFFINITY))
    deleting["metadata"]["deletionTimestamp"] = "2026-03-01T12:00:00Z"
    assert pod_failure(deleting) is None and pod_failure(None) is None


def test_the_group_holds_the_device_while_another_member_has_a_pod_or_just_released_it() -> None:
    assert device_held_by_group("a", {"a": [{}], "b": [{}]}, {}, NOW)
    assert not device_held_by_group("a", {"a": [{}], "b": []}, {}, NOW)
    assert not device_held_by_group("a", {"a": [{}]}, {}, NOW), "its own pod does not count"
    terminating = {"metadata": {"name": "a-old", "deletionTimestamp": "2025-01-01T00:00:00Z"}}
    assert device_held_by_group("a", {"a": [{}, terminating]}, {}, NOW), "its own old replica, rolled out"
    assert device_held_by_group("a", {"a": [{}, terminating]}, {}, NOW, shared=False), "an exclusive model too"
    assert not device_held_by_group("a", {"a": [{}], "b": [{}]}, {}, NOW, shared=False), "others only in a group"
    recent_gone = NOW - timedelta(seconds=2)
    assert device_held_by_group("a", {"a": [{}]}, {"a": recent_gone}, NOW), (
        "its old replica went 2 s ago: the new pod waits out the scheduler's back-off")
    assert not device_held_by_group("a", {"a": []}, {"a": recent_gone}, NOW), "no new pod"
    assert not device_held_by_group("a", {"a": [{}]}, {"a": NOW - timedelta(seconds=11)}, NOW)
    recent = NOW - timedelta(seconds=DEVICE_SETTLE - 1)
    assert device_held_by_group("a", {"a": [{}], "b": []}, {"b": recent}, NOW)
    settled = NOW - timedelta(seconds=DEVICE_SETTLE)
    assert not device_held_by_group("a", {"a": [{}], "b": []}, {"b": settled}, NOW)


def test_a_stored_status_shows_only_pod_failures() -> None:
    def status(phase: str, reason: str) -> ModelStatus:
        return ModelStatus.model_validate({"phase": phase, "message": "why", "conditions": [
            {"type": "Ready", "status": "False", "reason": reason, "lastTransitionTime": "2026-03-01T12:00:00Z"}]})
    assert shown_failure(status("Failed", "Unschedulable")) == ("Unschedulable", "why")
    assert shown_failure(status("Failed", "ValidationFailed")) is None
    assert shown_failure(status("Loading", "StartingBackend")) is None


def ended(reason: str, message: str = "", *, now: bool = False, name: str = "model") -> Body:
    """A container whose (last) run terminated with ``reason``/``message``."""
    terminated = {"terminated": {"reason": reason, "exitCode": 137 if reason == "OOMKilled" else 1,
                                 **({"message": message} if message else {})}}
    state = terminated if now else {"running": {}}
    return {"name": name, "ready": False, "restartCount": 1, "state": state, "lastState": {} if now else terminated}


def test_an_oom_kill_or_the_backends_out_of_memory_message_is_an_out_of_memory_sign() -> None:
    killed = out_of_memory_sign(pod(containers=[ended("OOMKilled")]))
    assert killed is not None and (killed.pod, killed.detail) == ("m-1", "container model OOMKilled, exit code 137")
    said = out_of_memory_sign(pod(containers=[ended("Error", "ggml_backend_cuda_buffer_type_alloc_buffer: "
                                                             "failed to allocate buffer", now=True)]))
    assert said is not None and said.detail == ("container model Error, exit code 1: ggml_backend_cuda_buffer_type_"
                                                "alloc_buffer: failed to allocate buffer")


def test_other_terminations_init_containers_and_deleted_pods_are_not() -> None:
    assert out_of_memory_sign(pod(containers=[ended("Error", "unknown argument: --bogus")])) is None
    assert out_of_memory_sign(pod(containers=[], init=[ended("OOMKilled", name="flash-loader")])) is None
    deleted = pod(containers=[ended("OOMKilled")])
    deleted["metadata"]["deletionTimestamp"] = "2026-03-01T12:00:00Z"
    assert out_of_memory_sign(deleted) is None and out_of_memory_sign(None) is None
