"""A member of a group that packs by memory is measured from its model server's own log once it is Ready —
against a real kube-apiserver, with the log of a real ``llama-server`` started with the arguments the manager
rendered into the member's Deployment. The testbed has no kubelet to serve ``pods/log``, so a scripted log source
stands in for it (as in test_manager_loading_log.py) and hands out that real server's output.

The member's need goes from ``unknown`` (the whole budget) to ``measured``; another member that did not fit beside
it then joins without evicting it; the log is read once per server run; a restarted manager reads the figure from
the status and does not read again; a spec change drops the figure."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from lightkube.types import PatchType

from flexinfer.core.election import ElectionPolicy
from flexinfer.core.gpu_profiles import GPUProfile
from flexinfer.core.measured_memory import MEASURE_LOG_LINES
from flexinfer.core.model_status.plan import ManagerPolicy
from flexinfer.core.server_memory import parse_memory
from flexinfer.manager.client import ModelResource
from support.kubelet_script import model_pod, pod_ready
from support.llama_server import LLAMA_SERVER, needs_llama_server
from support.manager_harness import (
    Cluster,
    RunningManager,
    cluster,
    kube_testbed,
    manager_config,
    rfc3339,
    start_manager,
)
from support.polling import poll_until
from support.tiny_gguf import write_tiny_gguf

pytestmark = [pytest.mark.integration, needs_llama_server]
__all__ = ["kube_testbed"]
BUDGET_MIB = 100
POLICY = ManagerPolicy(election=ElectionPolicy(min_hold=0.0),
                       gpu_profiles=(GPUProfile("cpu", BUDGET_MIB, multi_model=True),))


def member(**gpu: Any) -> dict[str, Any]:
    return {"backend": "llamacpp", "source": "file:///models/tiny.gguf", "config": {"runtimeProfile": "cpu"},
            "gpu": {"shared": "gpu0", **gpu}}


class ScriptedLog:
    """The kubelet's ``pods/log`` for the testbed: hands out ``lines`` and records every read."""

    def __init__(self, lines: Sequence[str]) -> None:
        self.lines = list(lines)
        self.reads: list[tuple[str, str, int]] = []

    def install(self, running: RunningManager) -> None:
        async def tail(namespace: str, pod: str, container: str, lines: int, previous: bool = False) -> list[str]:
            self.reads.append((pod, container, lines))
            return self.lines[-lines:]
        running.manager.api.pod_log_tail = tail  # type: ignore[method-assign]


async def server_log(args: list[str], tmp_path: Path) -> list[str]:
    """The output of a real llama-server run with the Deployment's ``args`` (this machine's weights and a free
    loopback port) until it serves."""
    weights = write_tiny_gguf(tmp_path / "tiny.gguf")
    local = list(args)
    for flag, value in (("--model", str(weights)), ("--host", "127.0.0.1"), ("--port", "0")):
        local[local.index(flag) + 1] = value
    log = tmp_path / "server.log"
    with log.open("w") as out:
        proc = await asyncio.create_subprocess_exec(str(LLAMA_SERVER), *local, stdout=out, stderr=out)

    async def served() -> list[str] | None:
        assert proc.returncode is None, log.read_text()[-2000:]
        lines = log.read_text(errors="replace").splitlines()
        return lines if any("listening on" in line for line in lines) else None
    try:
        return await poll_until(served, 60, "llama-server to serve")
    finally:
        proc.kill()
        await proc.wait()


async def shared(c: Cluster, name: str) -> dict[str, Any]:
    return dict((await c.status(name)).get("sharedGroup") or {})


async def serve(c: Cluster, name: str, suffix: str) -> str:
    """The member's pod runs and turns Ready (as the kubelet would report it); the proxy's request went through."""
    await c.replicas_are(name, 1)
    pod = await model_pod(c, name, suffix)
    await pod_ready(c, pod)
    await c.set_deployment_status(name, replicas=1, readyReplicas=1, availableReplicas=1)
    await c.phase_is(name, "Ready")
    await c.report(name, waitingSince=None)
    return pod


async def test_a_ready_member_is_measured_from_its_log_once_and_the_figure_outlives_the_manager(
        kube_testbed: Any, tmp_path: Path) -> None:
    async with cluster(kube_testbed) as c:
        running = await start_manager(manager_config(c, policy=POLICY))
        log = ScriptedLog([])
        log.install(running)
        try:
            await c.create_model("a", **member())
            await c.create_model("b", **member(vramEstimateMB=60))
            now = rfc3339()
            await c.report("a", lastActiveTime=now, waitingSince=now)
            await c.replicas_are("a", 1)
            deployment = await c.deployment("a")
            assert deployment is not None
            args = next(x for x in deployment["spec"]["template"]["spec"]["containers"] if x["name"] == "model")["args"]
            log.lines = await server_log(args, tmp_path)
            expected = parse_memory(log.lines)
            assert expected is not None and expected.complete, "the rendered arguments make llama-server log them"
            assert (await shared(c, "a"))["memoryNeedSource"] == "unknown"

            pod = await serve(c, "a", "q2w8e")

            async def measured() -> dict[str, Any] | None:
                group = await shared(c, "a")
                return group if group.get("memoryNeedSource") == "measured" else None
            group = await c.wait_for(measured, what="a's need measured from its log")
            assert group["memoryNeedMiB"] == pytest.approx(expected.total_mib, abs=0.01)
            assert group["memoryMeasured"]["observedGeneration"] == 1
            assert group["memoryMeasured"]["serverRun"] == f"{pod}#0"  # the pod and its restart count
            assert log.reads == [(pod, "model", MEASURE_LOG_LINES)]

            now = rfc3339()  # b (60 MiB) fits beside a's measured figure, not beside the whole budget
            await c.report("b", lastActiveTime=now, waitingSince=now)
            await serve(c, "b", "x7k2p")
            assert (await c.status("a"))["phase"] == "Ready", "a was not evicted to make room for b"
            assert [r[0] for r in log.reads].count(pod) == 1, "one read per server run, not one per pass"
        finally:
            assert await running.close() == 0

        restarted = await start_manager(manager_config(c, policy=POLICY))
        fresh = ScriptedLog(log.lines)
        fresh.install(restarted)
        try:
            await c.client.patch(ModelResource, "b", {"spec": {"gpu": {"priority": 120}}}, namespace=c.namespace,
                                 patch_type=PatchType.MERGE)

            async def b_reconciled() -> bool:
                status = await c.status("b")
                return status.get("observedGeneration") == 2
            await c.wait_for(b_reconciled, what="a pass over the group by the restarted manager")
            assert (await shared(c, "a"))["memoryNeedSource"] == "measured", "the figure is read from the status"
            assert not [r for r in fresh.reads if r[0] == pod], "a's run was measured: its log is not read again"

            fresh.lines = []  # the new generation's log cannot be read: no figure for it
            await c.client.patch(ModelResource, "a", {"spec": {"config": {"args": ["--ctx-size", "256"]}}},
                                 namespace=c.namespace, patch_type=PatchType.MERGE)

            async def dropped() -> dict[str, Any] | None:
                group = await shared(c, "a")
                record = group.get("memoryMeasured") or {}
                return group if record.get("observedGeneration") == 2 else None
            group = await c.wait_for(dropped, what="a's figure dropped after its spec changed")
            assert "needMiB" not in group["memoryMeasured"] and group["memoryNeedSource"] == "unknown"
            assert [r[0] for r in fresh.reads].count(pod) == 1, "the new generation's server run read once"
        finally:
            assert await restarted.close() == 0
