"""A crash restart is a cold-start sample in the Kubernetes engine too (issue #25, item 2): against the real
testbed apiserver, a Ready model (``serverless.enabled: false``, so its replica is kept) whose server is
OOM-killed and restarted by the kubelet goes Ready → Loading → Ready. The manager must open a restart
activation in ``status.activation`` when it sees the model go, and at Ready again observe one more
``flexinfer_model_cold_start_duration_seconds`` sample — from that moment to the moment its watch delivered the
pod's Ready transition — with stage samples that add up to it. It used to observe nothing: the p95 left out
every OOM kill. The testbed runs no kubelet; the test writes what one would (``support.kubelet_script``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from support.kubelet_script import model_pod, pod_ready, pod_restarting
from support.manager_harness import Cluster, RunningManager, cluster, kube_testbed, manager_config, start_manager
from support.polling import poll_until

pytestmark = pytest.mark.integration
__all__ = ["kube_testbed"]

COLD = "flexinfer_model_cold_start_duration_seconds"
STAGE = "flexinfer_model_startup_stage_duration_seconds"


def sums(text: str, name: str, model: str) -> dict[str, float]:
    """``{stage or "": value}`` of ``name``'s samples for ``model`` in Prometheus text."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{") and f'model="{model}"' in line:
            stage = line.split('stage="', 1)[1].split('"', 1)[0] if 'stage="' in line else ""
            out[stage] = float(line.rsplit(" ", 1)[1])
    return out


async def ready_seen(running: RunningManager, c: Cluster, pod: str) -> datetime:
    """When the manager's watch delivered the pod's Ready transition (once its store has it)."""
    async def probe() -> datetime | None:
        return running.manager.store.ready_seen("Pod", c.namespace, pod)
    return await poll_until(probe, 15.0, f"the manager's watch to see {pod} turn Ready")


async def restart_activation(c: Cluster, name: str) -> datetime:
    async def probe() -> str | None:
        status = await c.status(name)
        activation = status.get("activation") or {}
        return activation.get("decidedAt") if status.get("phase") == "Loading" else None
    return datetime.fromisoformat(await c.wait_for(probe, what=f"{name} Loading with a restart activation"))


async def test_an_oom_killed_server_restarted_with_its_replica_kept_is_one_more_cold_start_sample(
        kube_testbed: Any) -> None:
    async with cluster(kube_testbed) as c:
        running = await start_manager(manager_config(c))
        try:
            await c.create_model("solo", serverless={"enabled": False})
            await c.replicas_are("solo", 1)
            pod = await model_pod(c, "solo")
            await pod_ready(c, pod)
            await c.set_deployment_status("solo", replicas=1, readyReplicas=1, availableReplicas=1)
            await c.phase_is("solo", "Ready")
            first = await running.metric_is(f"{COLD}_count", 1, model="solo")
            assert not (await c.status("solo")).get("activation")

            crashed = datetime.now(UTC)
            await pod_restarting(c, pod)
            await c.set_deployment_status("solo", replicas=1, readyReplicas=0, availableReplicas=0,
                                          unavailableReplicas=1)
            decided = await restart_activation(c, "solo")
            assert decided >= crashed, "the restart is decided when the manager sees the model go, not before"
            assert await c.replicas("solo") == 1, "the replica is kept: the kubelet restarts the server"

            before, _ = await pod_ready(c, pod, restarts=1)
            watched = await ready_seen(running, c, pod)
            assert watched >= before
            await c.set_deployment_status("solo", replicas=1, readyReplicas=1, availableReplicas=1,
                                          unavailableReplicas=0)
            await c.phase_is("solo", "Ready")
            text = await running.metric_is(f"{COLD}_count", 2, model="solo")
        finally:
            assert await running.close() == 0

    before_sums, after_sums = sums(first, f"{STAGE}_sum", "solo"), sums(text, f"{STAGE}_sum", "solo")
    restart = sums(text, f"{COLD}_sum", "solo")[""] - sums(first, f"{COLD}_sum", "solo")[""]
    expected = (watched - decided).total_seconds()
    assert restart == pytest.approx(expected, abs=1e-3), f"recorded {restart} s, restart → watched Ready {expected} s"
    stages = {stage: value - before_sums.get(stage, 0.0) for stage, value in after_sums.items()}
    assert sum(stages.values()) == pytest.approx(restart, abs=1e-3), stages
    assert stages["server_start"] > 0, stages
    assert sums(text, f"{STAGE}_count", "solo")["server_start"] == 2, "one server_start sample per activation"
