"""The hand-over of a shared group's GPU between pods: the winner's pod is created once the loser's pods are gone.

With one Deployment per Model, the members of a group each request the device. Scaling the winner up while the
loser's pod still terminates leaves the winner's pod Pending (``Insufficient amd.com/gpu``), and the scheduler
then retries it only after its unschedulable back-off (seconds to a minute), long after the device was free. So
a member that is about to be scaled up from zero waits, at zero replicas, while a member that does not hold the
GPU in this election still has a pod that is not finished: the manager's pod watch wakes the unit when that pod
is deleted, and the pass that follows scales the winner up onto a free device. A loser's pod whose containers
have all exited is ``reapable``: the kubelet deletes such an object only at its next status sync (up to 10 s
later), so the manager deletes it itself with grace period 0. Pure; used by ``flexinfer.core.unit_plan``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

Json = dict[str, Any]

_FINISHED = frozenset({"Succeeded", "Failed"})
"""Pod phases whose containers have all stopped: such a pod no longer holds its resources."""


def holds_device(pod: Mapping[str, Any]) -> bool:
    """The pod still counts against the node's devices: not finished (a terminating pod still counts)."""
    return ((pod.get("status") or {}).get("phase") or "Pending") not in _FINISHED


def releasing(name: str, active: Collection[str], pods: Mapping[str, Sequence[Json]]) -> str | None:
    """The first member other than ``name``, not in the ``active`` set, whose pods still hold the device; ``None``
    when there is none (``name`` may be scaled up)."""
    for other in sorted(pods):
        if other != name and other not in active and any(holds_device(p) for p in pods[other]):
            return other
    return None


def finished(pod: Json) -> bool:
    """The pod is being deleted and every one of its containers has exited: nothing in it holds the device any
    more, only the kubelet's clean-up (volumes, sandbox, its status sync: up to 10 s) keeps the object."""
    status = pod.get("status") or {}
    containers = [*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())]
    return (bool((pod.get("metadata") or {}).get("deletionTimestamp")) and bool(containers)
            and all("terminated" in (c.get("state") or {}) for c in containers))


def reapable(waiting_for: Collection[str], pods: Mapping[str, Sequence[Json]]) -> tuple[tuple[str, str], ...]:
    """(namespace, name) of the pods of the members a winner waits for that are ``finished``: the manager deletes
    them at once (grace period 0), so the scheduler frees the device for the winner's pod without waiting for the
    kubelet."""
    metas = [p.get("metadata") or {} for member in sorted(waiting_for) for p in pods.get(member, ()) if finished(p)]
    return tuple((str(m.get("namespace") or ""), str(m.get("name") or "")) for m in metas)
