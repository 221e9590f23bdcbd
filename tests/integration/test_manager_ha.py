"""Two managers with leader election against a real kube-apiserver: only the Lease holder acts; a clean
stop hands over; a manager whose Lease is taken exits 1 (its pod restarts)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from lightkube.resources.coordination_v1 import Lease
from lightkube.types import PatchType

from support.manager_harness import cluster, kube_testbed, manager_config, start_manager

pytestmark = pytest.mark.integration
__all__ = ["kube_testbed"]
FAST = {"leader_elect": True, "lease_duration": 3, "renew_every": 0.5}


async def test_only_the_leader_acts_and_a_standby_takes_over(kube_testbed: Any) -> None:
    async with cluster(kube_testbed) as c:
        first = await start_manager(manager_config(c, identity="mgr-a", **FAST))
        second = await start_manager(manager_config(c, identity="mgr-b", **FAST))
        try:
            assert first.manager.leading and not second.manager.leading
            assert await second.readyz() == 200, "a standby that reaches the API server is ready"
            await c.create_model("m1")
            await c.phase_is("m1", "Idle")
            assert second.manager.queue.processed == 0 and second.manager.reconciler.applier.applies == 0

            assert await first.close() == 0  # releases the Lease
            await c.wait_for(lambda: _leading(second), timeout=10, what="standby takes over")
            await c.create_model("m2")
            await c.phase_is("m2", "Idle")
            assert second.manager.queue.processed > 0
            lease = (await c.client.get(Lease, "flexinfer-manager", namespace=c.namespace)).to_dict()
            assert lease["spec"]["holderIdentity"] == "mgr-b"
        finally:
            if not second.task.done():
                await second.close()


async def _leading(running: Any) -> bool:
    return bool(running.manager.leading and running.manager.ready())


# Known leak, not yet fixed at its cause: now and then the kopf thread's watch connections (one per watched
# kind) are garbage-collected unclosed after kopf is stopped this soon after it started its watches.
@pytest.mark.filterwarnings("ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore:Exception ignored in. <function _SelectorTransport.__del__"
                            ":pytest.PytestUnraisableExceptionWarning")
async def test_losing_the_lease_stops_the_manager_with_exit_code_1(kube_testbed: Any) -> None:
    async with cluster(kube_testbed) as c:
        running = await start_manager(manager_config(c, identity="mgr-a", **FAST))
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        await c.client.patch(Lease, "flexinfer-manager", {"spec": {
            "holderIdentity": "intruder", "leaseDurationSeconds": 3600, "renewTime": now}},
            namespace=c.namespace, patch_type=PatchType.MERGE)
        assert await asyncio.wait_for(running.task, 20) == 1
