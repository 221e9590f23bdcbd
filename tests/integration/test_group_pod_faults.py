"""Group-pod mode under faults (issue #28), against a real kube-apiserver with the manager in-process and a real
``flexinfer serve`` started with the group Deployment's own command standing in for the group pod's container
(``support.group_pod.StandIn``; tiny llama.cpp members, and the fake model server where a fault is scripted).

- ``MemoryShared`` with a GPU profile's budget: the rendered ``--group-memory`` flag packs two members that fit
  together, both Ready at once in the one pod, and the manager counts their cold starts and no swap. (The members
  run on the default runtime profile, ``gfx1100``, so a ``gfx1100`` profile with ``multiModel`` gives the group its
  budget; without one the pod would be told ``auto``, the GPU's own memory, which a CPU host cannot answer.)
- The group pod killed mid-stream (``serve`` and both members' servers, SIGKILLed at once as a container's end
  does): the client's stream ends with an error within seconds, nothing of the pod is left running, the manager drops
  ``sharedGroup.groupEndpoint`` within its miss window, and a new pod (new name and uid) is linked again and serves.
- A member that crash-loops inside the pod: its requests get an OpenAI-style error body from the pod, its Model is
  Failed with the server's own words and a Warning event, and the healthy member still answers.
- The manager killed mid-swap: a new manager finds the pod's truth (the winner Ready, the loser Preempted), links
  to the same pod without restarting it, and counts the swap (not the cold start the first manager counted).
- The in-cluster proxy: with the group pod at zero, a request through the proxy brings it up and completes there.

Nothing the manager logs carries a traceback.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Pod

from flexinfer.assembly.proxy import start_proxy
from flexinfer.core.gpu_profiles import GPUProfile
from flexinfer.core.model_status.plan import ManagerPolicy
from flexinfer.manager.group_pod_link import MISSES, POLL_RUNNING
from support.group_pod import StandIn, admin, alive, chat, group_object_name, member, pod
from support.kube_testbed import KubeTestbed
from support.llama_server import needs_llama_server
from support.local_serve import fake_server_command, histogram_count
from support.manager_harness import TEST_POLICY, Cluster, RunningManager, cluster, kube_testbed, manager_config
from support.manager_harness import start_manager as start_running_manager
from support.polling import eventually
from support.tiny_gguf import write_tiny_gguf

pytestmark = [pytest.mark.integration, needs_llama_server]
__all__ = ["kube_testbed", "pod"]
GROUP = "faults"
NAME = group_object_name(GROUP)
Body = dict[str, Any]
IDLE = {"serverless": {"idleTimeout": "60s"}}
"""Members stay wanted through a test (scale-to-zero is not what these cases are about)."""
STREAM_END_BOUND = 5.0
"""Seconds within which a client's stream must end once the pod is gone (it must not hang)."""
PROFILES = (GPUProfile("gfx1100", 3000, multi_model=True, vendor="amd"),)
"""The members' architecture (their default runtime profile) packs by memory within 3000 MiB."""
WRITE_SLACK = 1.5
"""The reconcile pass and status write after the link gives up on the pod."""


def policy(strategy: str = "TimeSliced", **fields: Any) -> ManagerPolicy:
    return replace(TEST_POLICY, group_strategies=((GROUP, strategy),), **fields)


@pytest.fixture
def manager_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="flexinfer")
    caplog.set_level(logging.INFO, logger="kopf")
    return caplog


def no_traceback(log: pytest.LogCaptureFixture) -> None:
    """Nothing the manager (or kopf under it) logged carries a traceback (and the manager's lines were seen)."""
    assert any(r.name == "flexinfer.manager" for r in log.records)
    bad = [r for r in log.records if r.name.startswith(("flexinfer", "kopf"))
           and (r.exc_info is not None or "Traceback" in r.getMessage())]
    assert not bad, [f"{r.name}: {r.getMessage()}" for r in bad]


def llama(tmp_path: Path, name: str, seed: int) -> Body:
    return member(GROUP, write_tiny_gguf(tmp_path / name / "model.gguf", seed=seed), **IDLE)


def fake(tmp_path: Path, name: str, *args: str) -> Body:
    """A member whose server is the fake model server (``args``: its script), declaring a small need (its weights
    are no GGUF file to estimate one from; an unknown need counts as the whole budget)."""
    weights = tmp_path / name / "weights.bin"
    weights.parent.mkdir(parents=True, exist_ok=True)
    weights.write_bytes(b"w")
    return member(GROUP, weights, config={"command": fake_server_command("--model-name", name, *args)},
                  gpu={"shared": GROUP, "vramEstimateMB": 100}, **IDLE)


async def manager_for(c: Cluster, managed: ManagerPolicy) -> RunningManager:
    return await start_running_manager(manager_config(c, policy=managed))


async def linked(c: Cluster, url: str, *names: str, timeout: float = 20.0) -> None:
    """Every member in ``names`` is forwarded to the pod at ``url``."""
    async def probe() -> bool:
        for name in names:
            if (await c.status(name)).get("sharedGroup", {}).get("groupEndpoint") != url:
                return False
        return True
    await c.wait_for(probe, timeout, f"{names} forwarded to {url}")


async def up(c: Cluster, pod: StandIn, tmp_path: Path, *names: str) -> str:
    """Demand for ``names``; the manager scales the group pod up; the stand-in runs; returns its URL."""
    for name in names:
        await c.demand(name)
    await c.replicas_are(NAME, 1)
    run = await pod.start(c, tmp_path)
    await linked(c, run.url, *names)
    return run.url


async def test_memory_shared_members_that_fit_are_ready_together_in_the_pod(
        kube_testbed: KubeTestbed, tmp_path: Path, pod: StandIn, manager_log: pytest.LogCaptureFixture) -> None:
    async with cluster(kube_testbed) as c:
        manager = await manager_for(c, policy("MemoryShared", gpu_profiles=PROFILES))
        try:
            await c.create_model("a", **llama(tmp_path, "a", 0))
            await c.create_model("b", **llama(tmp_path, "b", 1))
            url = await up(c, pod, tmp_path, "a", "b")
            assert pod.current.args[pod.current.args.index("--group-memory") + 1] == f"{c.namespace}/{GROUP}=3000Mi"
            await chat(url, "a")
            await chat(url, "b")  # fits next to a: no swap

            async def both_ready() -> list[Body] | None:
                statuses = [await c.status(n) for n in ("a", "b")]
                return statuses if all(s.get("phase") == "Ready" for s in statuses) else None
            statuses = await c.wait_for(both_ready, what="a and b Ready at once")
            assert all(s["sharedGroup"]["strategy"] == "MemoryShared" for s in statuses)
            assert all(s["sharedGroup"]["groupEndpoint"] == url for s in statuses)
            _, inside = await admin(url, pod.current.token)
            assert {m["key"]: m["phase"] for m in inside["models"]} == {f"{c.namespace}/a": "Ready",
                                                                      f"{c.namespace}/b": "Ready"}
            metrics = await manager.metric_is("flexinfer_model_cold_start_duration_seconds_count", 1, model="b")
            assert histogram_count(metrics, "flexinfer_model_cold_start_duration_seconds", model="a") == 1
            assert histogram_count(metrics, "flexinfer_model_swap_duration_seconds") == 0
            assert (await c.status("a"))["phase"] == "Ready"  # still: b's start did not evict it
        finally:
            assert await manager.close() == 0
    no_traceback(manager_log)


async def read_stream(reply: aiohttp.ClientResponse) -> tuple[str, bytes]:
    """Read what is left of an event stream: ``("done", body)`` when it ended cleanly, ``("error", body)`` when
    the connection broke off."""
    body = b""
    try:
        async for chunk in reply.content.iter_any():
            body += chunk
    except aiohttp.ClientPayloadError:
        return "error", body
    return "done", body


@pytest.mark.timeout(180)
async def test_the_group_pod_killed_mid_stream_ends_the_stream_and_the_group_relinks_to_the_new_pod(
        kube_testbed: KubeTestbed, tmp_path: Path, pod: StandIn, manager_log: pytest.LogCaptureFixture) -> None:
    async with cluster(kube_testbed) as c:
        manager = await manager_for(c, policy("MemoryShared", gpu_profiles=PROFILES))  # a keeps running beside s
        try:
            await c.create_model("a", **llama(tmp_path, "a", 0))
            await c.create_model("s", **fake(tmp_path, "s", "--chunks", "600", "--chunk-interval", "0.05"))
            url = await up(c, pod, tmp_path, "a", "s")
            first = pod.current
            await chat(url, "a")  # its llama-server runs in the pod too
            body = {"model": "s", "messages": [{"role": "user", "content": "hi"}], "stream": True}
            async with aiohttp.ClientSession() as http, http.post(f"{url}/v1/chat/completions", json=body) as reply:
                assert reply.status == 200, await reply.text()
                async with asyncio.timeout(30):  # past the pod's ``: loading`` comments: the stream runs
                    while not (await reply.content.readuntil(b"\n\n")).startswith(b"data: "):
                        pass
                tree = pod.kill()
                killed = time.monotonic()
                async with asyncio.timeout(STREAM_END_BOUND):
                    ended, rest = await read_stream(reply)
                took = time.monotonic() - killed
            assert ended == "error" and b"[DONE]" not in rest, (ended, rest[-200:])
            print(f"\nstream ended {took:.2f}s after the kill")
            assert len(tree) >= 2  # both members' servers were in the pod's process tree
            await eventually(lambda: not any(alive(pid) for pid in tree), 5.0)  # none left behind

            async def dropped() -> bool:
                statuses = [await c.status(n) for n in ("a", "s")]
                return all("groupEndpoint" not in s.get("sharedGroup", {}) for s in statuses)
            await c.wait_for(dropped, MISSES * POLL_RUNNING + WRITE_SLACK + 5.0, "groupEndpoint dropped")
            dropped_after = time.monotonic() - killed
            print(f"groupEndpoint dropped {dropped_after:.2f}s after the kill "
                  f"(miss window {MISSES * POLL_RUNNING:.1f}s)")
            assert dropped_after <= MISSES * POLL_RUNNING + WRITE_SLACK + POLL_RUNNING

            await pod.delete_pod(c)  # the ReplicaSet replaces the pod: a new name and uid
            await c.demand("a")
            second = await pod.start(c, tmp_path)
            assert second.url != first.url and second.pod != first.pod
            await linked(c, second.url, "a", "s")
            await chat(second.url, "a")
            await c.phase_is("a", "Ready")
        finally:
            assert await manager.close() == 0
    no_traceback(manager_log)


async def test_a_member_crash_looping_in_the_pod_fails_alone_with_the_servers_words(
        kube_testbed: KubeTestbed, tmp_path: Path, pod: StandIn, manager_log: pytest.LogCaptureFixture) -> None:
    async with cluster(kube_testbed) as c:
        manager = await manager_for(c, policy())
        try:
            await c.create_model("h", **llama(tmp_path, "h", 0))
            await c.create_model("x", **fake(tmp_path, "x", "--crash-at-start"))
            url = await up(c, pod, tmp_path, "h", "x")
            for attempt in range(2):  # the first start and the next one: each request ends with an error
                status, answer = await failing_chat(url, "x")
                print(f"\nrequest {attempt} to the crashing member: {status} {answer['error']['message'][:160]}")

            failed = await c.phase_is("x", "Failed", timeout=30)
            assert "crashing at start as scripted" in failed["message"], failed["message"]

            async def warned() -> list[Body]:
                return [e for e in await c.events("x") if e["type"] == "Warning"
                        and "crashing at start as scripted" in e["message"]]
            await c.wait_for(warned, what="a Warning event with the server's words")
            await chat(url, "h")  # the healthy member still answers
            await c.phase_is("h", "Ready")
        finally:
            assert await manager.close() == 0
    no_traceback(manager_log)


async def failing_chat(url: str, model: str) -> tuple[int, Body]:
    """A chat request that must end (bounded) with a server-side OpenAI-style error body."""
    request = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    async with asyncio.timeout(60), aiohttp.ClientSession() as http, \
            http.post(f"{url}/v1/chat/completions", json=request) as reply:
        status, answer = reply.status, await reply.json()
    assert status >= 500 and set(answer) == {"error"}, (status, answer)
    assert {"message", "type", "code"} <= set(answer["error"]), answer
    return status, answer


async def member_phase(url: str, token: str, key: str) -> str | None:
    _, status = await admin(url, token)
    return next((m["phase"] for m in status["models"] if m["key"] == key), None)


@pytest.mark.timeout(180)
async def test_a_manager_killed_mid_swap_is_replaced_by_one_that_finds_the_pods_truth(
        kube_testbed: KubeTestbed, tmp_path: Path, pod: StandIn, manager_log: pytest.LogCaptureFixture) -> None:
    async with cluster(kube_testbed) as c:
        manager = await manager_for(c, policy())
        await c.create_model("a", **llama(tmp_path, "a", 0))
        await c.create_model("b", **fake(tmp_path, "b", "--startup-delay", "5"))  # a swap that takes seconds
        try:
            url = await up(c, pod, tmp_path, "a", "b")
            run = pod.current
            await chat(url, "a")
            await c.phase_is("a", "Ready")
            generation = (await c.client.get(Deployment, NAME, namespace=c.namespace)).metadata.generation
            uid = (await c.client.get(Pod, run.pod, namespace=c.namespace)).metadata.uid
            swap = asyncio.create_task(chat(url, "b"))

            async def swapping() -> bool:
                return await member_phase(url, run.token, f"{c.namespace}/b") in ("Pending", "Loading")
            await c.wait_for(swapping, what="the pod swapping a for b")
        finally:
            assert await manager.close() == 0  # mid-swap: b is still loading in the pod
        replacement = await manager_for(c, policy())
        assert not swap.done()  # the swap ends under the new manager
        try:
            async with asyncio.timeout(60):
                await swap  # the client's request completes: the pod did not restart
            await c.phase_is("b", "Ready")
            await c.phase_is("a", "Preempted")
            await linked(c, url, "a", "b")
            assert run.serve.proc.poll() is None and len(pod.runs) == 1
            assert (await c.client.get(Pod, run.pod, namespace=c.namespace)).metadata.uid == uid
            assert (await c.client.get(Deployment, NAME, namespace=c.namespace)).metadata.generation == generation
            metrics = await replacement.metric_is("flexinfer_model_swap_duration_seconds_count", 1, model="b")
            # a's cold start ended under the first manager, which counted it: not counted again
            assert histogram_count(metrics, "flexinfer_model_cold_start_duration_seconds", model="a") == 0
        finally:
            assert await replacement.close() == 0
    no_traceback(manager_log)


@pytest.mark.timeout(180)
async def test_a_request_through_the_proxy_brings_the_group_pod_up_from_zero_and_completes_there(
        kube_testbed: KubeTestbed, tmp_path: Path, pod: StandIn, manager_log: pytest.LogCaptureFixture) -> None:
    async with cluster(kube_testbed) as c:
        manager = await manager_for(c, policy())
        proxy = await start_proxy(host="127.0.0.1", port=0, env={
            "POD_NAMESPACE": c.namespace, "POD_NAME": "proxy-0", "PROXY_SHUTDOWN_DRAIN_DELAY": "0",
            "PROXY_COLD_START_TIMEOUT": "60s", "FLEXINFER_OTEL_ENABLED": "false", "KUBECONFIG": str(c.kubeconfig)})
        try:
            await c.create_model("a", **llama(tmp_path, "a", 0))
            await c.create_model("b", **llama(tmp_path, "b", 1))
            await c.phase_is("a", "Idle")
            assert await c.replicas(NAME) == 0
            started = time.monotonic()
            request = asyncio.create_task(chat(proxy.url, "a"))
            await c.replicas_are(NAME, 1, timeout=20)  # the proxy's demand woke the group
            assert not request.done()  # held in the proxy while the pod starts
            run = await pod.start(c, tmp_path)
            async with asyncio.timeout(60):
                answer = await request
            print(f"\ncold start of the group pod through the proxy: {time.monotonic() - started:.2f}s")
            assert answer["model"] == "a"
            assert (await c.status("a"))["sharedGroup"]["groupEndpoint"] == run.url
            await c.phase_is("a", "Ready")
            metrics = await manager.metric_is("flexinfer_model_cold_start_duration_seconds_count", 1, model="a")
            assert histogram_count(metrics, "flexinfer_model_swap_duration_seconds") == 0
        finally:
            await proxy.close()
            assert await manager.close() == 0
    no_traceback(manager_log)
