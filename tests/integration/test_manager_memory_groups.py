"""A shared group on a GPU profile with ``features.multiModel`` packs its members by memory — against a real
kube-apiserver (Deployments are marked ready through their status subresource, pods written as a kubelet would):
members that fit together are all Active and scaled up at once; one that does not fit evicts the cheapest idle
member and starts once it is gone; one larger than the whole budget fails at once; the status shows each member's
need (and ``kubectl get mdl`` its column) and ``/metrics`` the group's. A member whose server is OOM-killed at
start gets the group's evictable members evicted and one retry in a new pod; a second out-of-memory fails it."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from lightkube.resources.core_v1 import Pod

from flexinfer.core.election import ElectionPolicy
from flexinfer.core.gpu_profiles import GPUProfile
from flexinfer.core.model_status.plan import ManagerPolicy
from support.kube_testbed import KubeTestbed
from support.kubelet_script import model_pod, pod_restarting
from support.manager_harness import (
    Cluster,
    cluster,
    kube_testbed,
    manager_config,
    metric_value,
    rfc3339,
    start_manager,
)

pytestmark = pytest.mark.integration
__all__ = ["kube_testbed"]
MIB = 1024 * 1024
POLICY = ManagerPolicy(election=ElectionPolicy(min_hold=0.0),
                       gpu_profiles=(GPUProfile("gfx1100", 3000, multi_model=True, vendor="amd"),))


def member(need: int, priority: int = 100) -> dict[str, Any]:
    return {"backend": "llamacpp", "source": "file:///models/tiny.gguf",
            "gpu": {"vendor": "amd", "shared": "gpu0", "priority": priority, "vramEstimateMB": need}}


TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


async def printed(testbed: KubeTestbed, namespace: str) -> dict[str, dict[str, Any]]:
    """``kubectl get mdl`` as the apiserver prints it (a Table request): Model name → column name → cell."""
    url = f"{testbed.server}/apis/ai.flexinfer/v1alpha2/namespaces/{namespace}/models"
    headers = {"Authorization": f"Bearer {testbed.token}", "Accept": TABLE}
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers, ssl=False) as reply:
        assert reply.status == 200, await reply.text()
        table = await reply.json()
    assert table["kind"] == "Table", table
    names = [column["name"] for column in table["columnDefinitions"]]
    rows = [dict(zip(names, row["cells"], strict=True)) for row in table["rows"]]
    return {row["Name"]: row for row in rows}


async def ask(c: Cluster, name: str) -> None:
    """What the proxy reports when a request for ``name`` arrives and waits."""
    now = rfc3339()
    await c.report(name, lastActiveTime=now, waitingSince=now)


async def serve(c: Cluster, name: str) -> None:
    """The model's pod turns Ready and the proxy forwards its waiting requests."""
    await c.replicas_are(name, 1)
    await c.set_deployment_status(name, replicas=1, readyReplicas=1, availableReplicas=1)
    await c.phase_is(name, "Ready")
    await c.report(name, waitingSince=None)


async def test_members_that_fit_run_together_and_one_that_does_not_evicts_by_cost(kube_testbed: Any) -> None:
    async with cluster(kube_testbed) as c:
        running = await start_manager(manager_config(c, policy=POLICY))
        try:
            for name, priority in (("a", 100), ("b", 100), ("c", 150), ("d", 100)):
                await c.create_model(name, **member(1000, priority))
            await c.create_model("big", **member(4000))
            big = await c.phase_is("big", "Failed")
            ready = next(x for x in big["conditions"] if x["type"] == "Ready")
            expected = (f"model {c.namespace}/big needs 4000 MiB (declared) but GPU group {c.namespace}/gpu0 has a "
                        f"memory budget of 3000 MiB")
            assert (ready["reason"], big["message"]) == ("VRAMInsufficient", expected)

            for name in ("a", "b", "c"):
                await ask(c, name)
            for name in ("a", "b", "c"):  # all three scaled up at once: none waits for another
                await c.replicas_are(name, 1)
            for name in ("a", "b", "c"):
                await serve(c, name)
                shared = (await c.status(name))["sharedGroup"]
                assert (shared["state"], shared["memoryNeedMiB"], shared["memoryNeedSource"],
                        shared["memoryBudgetMiB"]) == ("Active", 1000, "declared", 3000)
            table = await printed(kube_testbed, c.namespace)
            assert {n: (row["NeedMiB"], row["NeedSource"]) for n, row in table.items()} == {
                "a": (1000, "declared"), "b": (1000, "declared"), "c": (1000, "declared"),
                "d": (1000, "declared"), "big": (4000, "declared")}
            text = await running.metric_is("flexinfer_sharedgroup_memory_used_bytes", 3000 * MIB, group="gpu0")
            assert metric_value(text, "flexinfer_sharedgroup_memory_budget_bytes", group="gpu0") == 3000 * MIB
            assert metric_value(text, "flexinfer_model_memory_need_bytes", model="big", source="declared") == 4000 * MIB
            assert metric_value(text, "flexinfer_sharedgroup_preemptions_total", group="gpu0") == 0

            await c.report("a", "proxy-busy", inFlightAt=rfc3339())  # a serves; b and c are idle
            await ask(c, "d")
            b = await c.phase_is("b", "Preempted")
            assert b["sharedGroup"]["preemptedBy"] == "d", "idle before busy, then the lower priority (b < c)"
            assert f"to make room for {c.namespace}/d (needs 1000 MiB (declared); 0 of 3000 MiB free)" in b["message"]
            await c.replicas_are("b", 0)
            await serve(c, "d")
            assert [await c.replicas(n) for n in ("a", "c", "d")] == [1, 1, 1]
            assert (await c.status("d"))["sharedGroup"]["state"] == "Active"
            assert (await c.status("a"))["phase"] == "Ready" and (await c.status("c"))["phase"] == "Ready"
            text = await running.metric_is("flexinfer_sharedgroup_evictions_total", 1, group="gpu0",
                                           reason="make_room")
            assert metric_value(text, "flexinfer_sharedgroup_preemptions_total", **{"from": "b", "to": "d"}) == 1
            assert metric_value(text, "flexinfer_model_swap_duration_seconds_count", model="d") == 1
        finally:
            assert await running.close() == 0


async def test_without_a_multi_model_profile_the_group_runs_one_model_at_a_time(kube_testbed: Any) -> None:
    policy = ManagerPolicy(election=ElectionPolicy(min_hold=0.0),
                           gpu_profiles=(GPUProfile("gfx1100", 3000, multi_model=False),))
    async with cluster(kube_testbed) as c:
        running = await start_manager(manager_config(c, policy=policy))
        try:
            await c.create_model("a", **member(1000))
            await c.create_model("b", **member(1000))
            await ask(c, "a")
            await serve(c, "a")
            await ask(c, "b")
            await c.phase_is("a", "Preempted")
            await c.replicas_are("a", 0)
            await c.replicas_are("b", 1)
            assert "memoryNeedMiB" not in (await c.status("b"))["sharedGroup"]
            assert "flexinfer_sharedgroup_memory_budget_bytes{" not in await running.metrics()
        finally:
            assert await running.close() == 0


async def test_a_member_out_of_memory_at_start_evicts_the_group_and_retries_once(kube_testbed: Any) -> None:
    async with cluster(kube_testbed) as c:
        running = await start_manager(manager_config(c, policy=POLICY))
        try:
            pinned = member(500)
            pinned["serverless"] = {"minReplicas": 1}
            await c.create_model("pinned", **pinned)
            await c.create_model("idle", **member(1000))
            await c.create_model("x", **member(1000))
            await serve(c, "pinned")
            await ask(c, "idle")
            await serve(c, "idle")

            await ask(c, "x")
            await c.replicas_are("x", 1)  # 2500 of 3000 MiB: it fits beside both
            first = await model_pod(c, "x", "first")
            await pod_restarting(c, first)  # the kubelet: OOM-killed, restarted in place
            idle = await c.phase_is("idle", "Preempted")
            assert idle["sharedGroup"]["preemptedBy"] == "x"
            assert (f"evicted from GPU group {c.namespace}/gpu0: model {c.namespace}/x ran out of memory starting "
                    f"beside it (retrying once)") in idle["message"]
            await c.replicas_are("x", 0)  # the retry is a new pod, once the evicted member is gone
            await c.replicas_are("idle", 0)
            async def recorded() -> dict[str, Any] | None:
                return (await c.status("x"))["sharedGroup"].get("outOfMemory")
            record = await c.wait_for(recorded, what="x's out-of-memory record")
            assert (record["pod"], record.get("failure", "")) == (first, "")
            assert (await c.status("pinned"))["phase"] == "Ready" and await c.replicas("pinned") == 1
            await running.metric_is("flexinfer_sharedgroup_evictions_total", 1, group="gpu0", reason="out_of_memory")

            await c.client.delete(Pod, first, namespace=c.namespace, grace_period=0)  # the ReplicaSet's part
            await c.replicas_are("x", 1)
            second = await model_pod(c, "x", "second")
            await pod_restarting(c, second)
            x = await c.phase_is("x", "Failed")
            ready = next(cond for cond in x["conditions"] if cond["type"] == "Ready")
            expected = (f"out of memory starting model {c.namespace}/x: it needs 1000 MiB (declared), GPU group "
                        f"{c.namespace}/gpu0 has a budget of 3000 MiB (500 MiB held by other models); container "
                        f"model OOMKilled, exit code 137")
            assert (ready["reason"], x["message"]) == ("OutOfMemory", expected)
            await c.replicas_are("x", 0)
            assert x["sharedGroup"]["outOfMemory"]["failure"] == expected
            assert (await c.status("pinned"))["phase"] == "Ready"
            async def warned() -> bool:
                return any(e["reason"] == "OutOfMemory" and e["type"] == "Warning" for e in await c.events("x"))
            await c.wait_for(warned, what="a Warning event OutOfMemory for x")
            text = await running.metrics()
            assert metric_value(text, "flexinfer_sharedgroup_evictions_total", group="gpu0",
                                reason="out_of_memory") == 1
        finally:
            assert await running.close() == 0
