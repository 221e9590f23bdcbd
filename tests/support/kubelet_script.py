"""What the scheduler and a kubelet would write about a model's pod, for the testbed (which runs neither).

Used by the manager's integration tests that need a pod's own transitions (tests/integration/
test_manager_restart.py, test_manager_ready_time.py, test_manager_memory_groups.py): ``model_pod`` creates the
pod the model's Deployment would own (not Ready yet), ``pod_ready`` writes its ``Ready`` condition turning True
at a given time (and returns the wall-clock moments just before and after the write), ``pod_restarting`` writes
what a kubelet reports after the model server's container was OOM-killed and is being restarted.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from lightkube import ApiError
from lightkube.resources.core_v1 import Pod, ServiceAccount
from lightkube.types import PatchType

from support.manager_harness import Cluster

Body = dict[str, Any]


def whole_second(moment: datetime) -> str:
    """A condition timestamp as the API stores it: whole seconds."""
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


async def model_pod(c: Cluster, model: str, suffix: str = "q2w8e") -> str:
    """Create ``model``'s pod (labelled as the rendered Deployment labels it), running but not Ready; ``suffix``
    tells apart the pods a ReplicaSet creates one after the other."""
    name = f"{model}-7d9c4-{suffix}"
    try:  # no service-account controller runs in the testbed; the admission plugin still wants the account
        await c.client.create(ServiceAccount.from_dict({"metadata": {"name": "default", "namespace": c.namespace}}))
    except ApiError as error:
        if error.status.code != 409:
            raise
    await c.client.create(Pod.from_dict({
        "metadata": {"name": name, "namespace": c.namespace, "labels": {
            "app.kubernetes.io/managed-by": "flexinfer", "flexinfer.ai/model": model}},
        "spec": {"automountServiceAccountToken": False, "containers": [{"name": "model", "image": "llama"}]},
    }))
    await _status(c, name, {"phase": "Running", "conditions": [_ready(False, datetime.now(UTC))],
                            "containerStatuses": [_container(False, 0, {"running": {"startedAt": _now()}})]})
    return name


async def pod_ready(c: Cluster, name: str, restarts: int = 0) -> tuple[datetime, datetime]:
    """The pod's ``Ready`` condition turns True now (its second as ``lastTransitionTime``); returns the wall-clock
    moments just before and just after the write."""
    before = datetime.now(UTC)
    await _status(c, name, {"conditions": [_ready(True, before)], "containerStatuses": [
        _container(True, restarts, {"running": {"startedAt": _now()}})]})
    return before, datetime.now(UTC)


async def pod_restarting(c: Cluster, name: str, restarts: int = 1) -> None:
    """The model container was OOM-killed and the kubelet restarted it: running, not Ready."""
    await _status(c, name, {"conditions": [_ready(False, datetime.now(UTC))], "containerStatuses": [_container(
        False, restarts, {"running": {"startedAt": _now()}},
        {"terminated": {"reason": "OOMKilled", "exitCode": 137, "startedAt": _now(), "finishedAt": _now()}})]})


def _ready(ready: bool, since: datetime) -> Body:
    return {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": whole_second(since)}


def _container(ready: bool, restarts: int, state: Body, last: Body | None = None) -> Body:
    return {"name": "model", "ready": ready, "restartCount": restarts, "image": "llama", "imageID": "",
            "state": state, "lastState": last or {}}


def _now() -> str:
    return whole_second(datetime.now(UTC))


async def _status(c: Cluster, name: str, status: Body) -> None:
    await c.client.patch(Pod.Status, name, {"status": status}, namespace=c.namespace, patch_type=PatchType.MERGE)
