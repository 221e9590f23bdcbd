"""Failures of a model server's pod that will not pass by waiting: the rule that turns them into phase ``Failed``.

A cold start that cannot succeed must not hold its callers for their whole budget. ``pod_failure`` reads the
newest pod of a Model and names a failure when the pod shows one of these (docs/design/kubernetes.md,
"Failures"):

- ``Unschedulable`` (``PodScheduled=False``, no node bound) — unless the group's own swap explains it: the pod
  lacks only an extended resource it asks for (``Insufficient amd.com/gpu``) while another member of its shared
  group still holds the device or released it a moment ago (``gpu_wait_expected``). That is every swap: the
  winner's pod waits Pending until the loser's pod is gone, and its waiters must keep waiting;
- ``ImagePullBackOff``, ``ErrImageNeverPull``, ``InvalidImageName``: the pull failed and the kubelet now backs off
  (a first ``ErrImagePull`` is transient: a registry hiccup is retried at once);
- ``CrashLoopBackOff`` after ``CRASHES_BEFORE_FAILED`` (2) crashes of one container: one crash followed by a
  successful restart (e.g. a server that started while the outgoing model still held the GPU memory) is a
  transient; the second crash in a row is not;
- ``CreateContainerConfigError``: a referenced Secret or ConfigMap key is missing.

The failure's ``message`` names the cause (``<reason>: <detail>``): the status ``message``, the ``Ready``
condition, the Warning event and the proxy's 503 all show it. For a crash, ``crash_cause`` picks the line of
the crashed container's previous log that says why (the manager reads it: ``PodFailure.log_container``).
``out_of_memory_sign`` says whether the server container ended for lack of memory (a group that packs by memory
then evicts and retries: ``flexinfer.core.oom_retry``). ``shown_failure`` reads a failure back from a stored
status; ``device_held_by_group`` says whether a swap or a rollout explains a pod waiting for the device. Pure; called by
``flexinfer.core.unit_plan`` once per member and pass.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Final

from flexinfer.api.model import ModelStatus
from flexinfer.core import phases
from flexinfer.core.memory_need import out_of_memory
from flexinfer.core.model_status.build import short_message

CRASHES_BEFORE_FAILED: Final = 2
"""Restarts of one container, in CrashLoopBackOff, that make the pod Failed (one crash may be transient)."""
IMAGE_FAILURES: Final = frozenset({"ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName"})
CONFIG_FAILURES: Final = frozenset({"CreateContainerConfigError"})
CRASH_LOOP: Final = "CrashLoopBackOff"
OOM_KILLED: Final = "OOMKilled"
"""The kubelet's reason for a container the kernel killed for lack of memory."""
UNSCHEDULABLE: Final = "Unschedulable"
REASONS: Final = frozenset({*IMAGE_FAILURES, *CONFIG_FAILURES, CRASH_LOOP, UNSCHEDULABLE})
"""Every ``Ready`` condition reason a pod failure can write."""
DEVICE_SETTLE: Final = 10.0
"""Seconds after a group member's last pod is gone during which another member's pod that lacks the device
(``Insufficient amd.com/gpu``) still counts as waiting for the swap: the scheduler binds it right after the
deletion, but the manager may see the deletion first."""
_INSUFFICIENT: Final = re.compile(r"Insufficient ([A-Za-z0-9][A-Za-z0-9.\-_/]*[A-Za-z0-9])")


@dataclass(frozen=True)
class PodFailure:
    """Why the pod cannot become Ready: ``reason`` (a Kubernetes reason) and ``message`` (``<reason>: <detail>``)."""

    reason: str
    message: str
    log_container: str | None = None
    """A crashed container whose previous log may say why (``crash_cause``)."""
    summary: str = ""
    """For a crash: which container crashed how often (kept when ``with_cause`` adds the log's line)."""

    def with_cause(self, cause: str | None, shown: tuple[str, str] | None = None) -> PodFailure:
        """The failure with the crashed container's own last words in place of its exit code; without them (an
        unreadable log), the message already ``shown`` for the same reason is kept rather than replaced."""
        if cause:
            return replace(self, message=short_message(f"{self.reason}: {self.summary}: {cause}"),
                           log_container=None)
        if shown is not None and shown[0] == self.reason:
            return replace(self, message=shown[1], log_container=None)
        return self


def _containers(pod: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], bool]]:
    status = pod.get("status") or {}
    return ([(c, True) for c in status.get("initContainerStatuses") or []]
            + [(c, False) for c in status.get("containerStatuses") or []])


def _container_failure(container: Mapping[str, Any], init: bool) -> PodFailure | None:
    name = str(container.get("name") or "container")
    what = f"init container {name}" if init else f"container {name}"
    waiting = (container.get("state") or {}).get("waiting") or {}
    reason, detail = str(waiting.get("reason") or ""), str(waiting.get("message") or "").strip()
    if reason in IMAGE_FAILURES or reason in CONFIG_FAILURES:
        return PodFailure(reason, short_message(f"{reason}: {what}: {detail or reason}"))
    restarts = int(container.get("restartCount") or 0)
    if reason != CRASH_LOOP or restarts < CRASHES_BEFORE_FAILED:
        return None
    last = (container.get("lastState") or {}).get("terminated") or {}
    how = ", ".join(part for part in (str(last.get("reason") or ""),
                                      f"exit code {last['exitCode']}" if "exitCode" in last else "") if part)
    said = str(last.get("message") or "").strip()
    summary = f"{what} crashed {restarts} times"
    text = f"{CRASH_LOOP}: {summary}" + (f" ({how})" if how else "") + (f": {said}" if said else "")
    return PodFailure(CRASH_LOOP, short_message(text), log_container=name, summary=summary)


def _requested_resources(pod: Mapping[str, Any]) -> set[str]:
    """Extended resources (``vendor/name``) the pod's containers ask for."""
    spec = pod.get("spec") or {}
    names: set[str] = set()
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        resources = container.get("resources") or {}
        for table in (resources.get("limits") or {}, resources.get("requests") or {}):
            names.update(key for key in table if "/" in key)
    return names


def waits_for_a_device(pod: Mapping[str, Any], message: str) -> bool:
    """The scheduler's ``message`` says a node lacks an extended resource this pod asks for (a GPU)."""
    return bool(set(_INSUFFICIENT.findall(message)) & _requested_resources(pod))


def _unschedulable(pod: Mapping[str, Any], gpu_wait_expected: bool) -> PodFailure | None:
    if (pod.get("spec") or {}).get("nodeName"):
        return None  # bound: the condition is stale until the kubelet reports
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if (condition.get("type"), condition.get("status"), condition.get("reason")) != (
                "PodScheduled", "False", UNSCHEDULABLE):
            continue
        message = str(condition.get("message") or "").strip()
        if gpu_wait_expected and waits_for_a_device(pod, message):
            return None
        return PodFailure(UNSCHEDULABLE, short_message(f"{UNSCHEDULABLE}: {message or 'no node fits the pod'}"))
    return None


def _retrying(pod: Mapping[str, Any], reason: str) -> bool:
    """The kubelet is retrying what failed with ``reason``: pulling the image again (``ErrImagePull``), or running a
    container that crashed ``CRASHES_BEFORE_FAILED`` times again (not Ready yet)."""
    for container, _ in _containers(pod):
        waiting = (container.get("state") or {}).get("waiting") or {}
        if reason in IMAGE_FAILURES and waiting.get("reason") == "ErrImagePull":
            return True
        if (reason == CRASH_LOOP and int(container.get("restartCount") or 0) >= CRASHES_BEFORE_FAILED
                and not container.get("ready") and "terminated" not in (container.get("state") or {})):
            return True
    return False


def pod_failure(pod: Mapping[str, Any] | None, *, gpu_wait_expected: bool = False,
                previous: tuple[str, str] | None = None) -> PodFailure | None:
    """The failure the newest ``pod`` shows (see the module docstring); ``None`` while it may still start.
    ``gpu_wait_expected``: another member of the shared group holds (or just released) the device.
    ``previous`` (reason, message): the failure the Model's status shows now; it stays while the kubelet
    retries the same thing (an image pull after its back-off, a crashed container restarted), so the phase does
    not flip to Loading and back with every retry: only Ready (or a different failure) ends it."""
    if pod is None or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    for container, init in _containers(pod):
        failure = _container_failure(container, init)
        if failure is not None:
            return failure
    failure = _unschedulable(pod, gpu_wait_expected)
    if failure is None and previous is not None and _retrying(pod, previous[0]):
        return PodFailure(*previous)
    return failure


@dataclass(frozen=True)
class OutOfMemorySign:
    """A model server's container of ``pod`` that ended for lack of memory, and how (``detail``)."""

    pod: str
    detail: str


def out_of_memory_sign(pod: Mapping[str, Any] | None) -> OutOfMemorySign | None:
    """The newest ``pod``'s server container ran out of memory: it terminated (now, or in its last run) with the
    kubelet's ``OOMKilled`` (the kernel's OOM kill), or with a reason or termination message the backend's
    out-of-memory error matches (``flexinfer.core.memory_need.out_of_memory``). Init containers do not count (the
    flash-loader's copy is not the model's memory). ``None`` for a pod being deleted."""
    if pod is None or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    for container, init in _containers(pod):
        if init:
            continue
        for state in (container.get("state") or {}, container.get("lastState") or {}):
            ended = state.get("terminated") or {}
            reason, said = str(ended.get("reason") or ""), str(ended.get("message") or "").strip()
            if reason == OOM_KILLED or (ended and out_of_memory(f"{reason} {said}")):
                code = f", exit code {ended['exitCode']}" if "exitCode" in ended else ""
                text = f"container {container.get('name') or 'container'} {reason or 'terminated'}{code}"
                name = str((pod.get("metadata") or {}).get("name") or "")
                return OutOfMemorySign(name, short_message(f"{text}: {said}" if said else text))
    return None


def crash_cause(lines: Sequence[str]) -> str | None:
    """The line of a crashed server's log that says why: the last line that is not blank (a Python traceback ends
    with the exception, llama.cpp and vLLM print their error last)."""
    for line in reversed(lines):
        text = line.strip()
        if text:
            return text
    return None


def shown_failure(status: ModelStatus) -> tuple[str, str] | None:
    """The pod failure a stored status shows, as (reason, message); ``None`` when it shows none."""
    ready = phases.find_condition(status.conditions, phases.COND_READY)
    if status.phase != phases.FAILED or ready is None or ready.reason not in REASONS:
        return None
    return ready.reason, status.message or ready.message or ready.reason


def device_held_by_group(name: str, pods: Mapping[str, Sequence[Any]], gone_at: Mapping[str, datetime],
                         now: datetime, *, shared: bool = True) -> bool:
    """A pod waiting for the device is expected to: its own old replica still holds it or went less than
    ``DEVICE_SETTLE`` ago (a rollout, ``maxSurge: 0``: the new pod waits for the old one's device, then out the
    scheduler's back-off), or, in a ``shared`` group, another member still has a pod (``pods`` by member: it holds
    the device or is releasing it) or its last pod went less than ``DEVICE_SETTLE`` ago (``gone_at``: when a pod of
    each member was last deleted)."""
    def recent(member: str) -> bool:
        gone = gone_at.get(member)
        return gone is not None and now - gone < timedelta(seconds=DEVICE_SETTLE)

    own = pods.get(name, ())
    if any((p.get("metadata") or {}).get("deletionTimestamp") for p in own) or (own and recent(name)):
        return True
    return shared and any(pods.get(other) or recent(other) for other in {*pods, *gone_at} if other != name)


def device_settles_at(gone_at: Mapping[str, datetime], now: datetime) -> datetime | None:
    """The next instant a released device stops counting as held (``DEVICE_SETTLE`` after its pod went)."""
    ends = [gone + timedelta(seconds=DEVICE_SETTLE) for gone in gone_at.values()]
    return min((end for end in ends if end > now), default=None)
