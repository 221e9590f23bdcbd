"""The status page of ``flexinfer proxy`` against a real kube-apiserver: behind the proxy's bearer auth, models
with group and phase from the Models' status, the activation a request waited for, a clean "not available
in cluster mode" for model server logs, and the memory of a group that packs by memory from its members'
status. The test plays the manager (it patches the Model's status)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from lightkube import AsyncClient, KubeConfig
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.core_v1 import Namespace
from lightkube.types import PatchType

from flexinfer.assembly.proxy import ClusterProxy, start_proxy
from support.fake_openai import FakeOpenAI
from support.kube_testbed import KubeTestbed
from support.polling import poll_until, wait_until

pytestmark = pytest.mark.integration

Model = create_namespaced_resource("ai.flexinfer", "v1alpha2", "Model", "models")
NS = "status-page"
TOKEN = "page-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeTestbed]:
    with KubeTestbed(tmp_path_factory.mktemp("kube") / "bed") as bed:
        yield bed.install_crds()


@pytest.fixture
async def setup(testbed: KubeTestbed) -> AsyncIterator[tuple[AsyncClient, ClusterProxy, str]]:
    client = AsyncClient(KubeConfig.from_file(str(testbed.kubeconfig)))
    await client.create(Namespace(metadata={"name": NS}))
    upstream = aiohttp.web.AppRunner(FakeOpenAI().app())
    await upstream.setup()
    site = aiohttp.web.TCPSite(upstream, "127.0.0.1", 0)
    await site.start()
    upstream_url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    env = {"POD_NAMESPACE": NS, "FLEXINFER_PROXY_ENDPOINT_OVERRIDE": "true", "PROXY_SHUTDOWN_DRAIN_DELAY": "0",
           "PROXY_COLD_START_TIMEOUT": "30s", "FLEXINFER_SWAP_MAX_WAIT": "20s", "FLEXINFER_OTEL_ENABLED": "false",
           "KUBECONFIG": str(testbed.kubeconfig), "PROXY_AUTH_ENABLED": "true", "PROXY_AUTH_TOKEN": TOKEN}
    proxy = await start_proxy(host="127.0.0.1", port=0, env=env)
    try:
        yield client, proxy, upstream_url
    finally:
        await proxy.close()
        await upstream.cleanup()
        await client.close()


async def patch_status(client: AsyncClient, name: str, status: dict[str, Any]) -> None:
    await client.patch(Model.Status, name, {"status": status}, namespace=NS, patch_type=PatchType.MERGE)


async def test_cluster_status_page(setup: tuple[AsyncClient, ClusterProxy, str], tmp_path: Path) -> None:
    client, proxy, upstream_url = setup
    await client.create(Model(metadata={"name": "m", "namespace": NS, "annotations": {
        "flexinfer.ai/endpoint-override": upstream_url}},
        spec={"backend": "vllm", "source": "HF://org/m", "gpu": {"vendor": "amd", "shared": "g0"}}))
    await patch_status(client, "m", {"phase": "Idle"})
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{proxy.url}/ui") as page:
            assert page.status == 200 and "FlexInfer status" in await page.text()
        async with http.get(f"{proxy.url}/ui/api/status") as refused:
            assert refused.status == 401

        async def status() -> dict[str, Any]:
            async with http.get(f"{proxy.url}/ui/api/status", headers=AUTH) as response:
                assert response.status == 200
                return dict(await response.json())

        async def model_seen() -> dict[str, Any] | None:
            body = await status()
            return body if [(m["key"], m["group"]) for m in body["models"]] == [(f"{NS}/m", "g0")] else None

        body = await poll_until(model_seen, timeout=10, what="the Model on the page")
        assert body["mode"] == "cluster" and body["logs_available"] is False and body["groups"] == {"g0": None}

        request = asyncio.create_task(http.post(f"{proxy.url}/v1/chat/completions", headers=AUTH,
                                                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
        await poll_until(lambda: _queued(status), timeout=10, what="the waiting request")
        await patch_status(client, "m", {"phase": "Ready", "endpoint": f"http://m.{NS}.svc:8000"})
        response = await asyncio.wait_for(request, 10)
        assert response.status == 200
        response.release()

        async def activated() -> dict[str, Any] | None:
            body = await status()
            return body if body["activations"] and body["groups"] == {"g0": f"{NS}/m"} else None

        body = await poll_until(activated, timeout=10, what="the activation on the page")
        activation = body["activations"][0]
        assert activation["model"] == f"{NS}/m" and activation["kind"] == "cold_start"
        assert activation["result"] == "success" and activation["seconds"] > 0
        assert body["durations"] == [{"kind": "cold_start", "seconds": activation["seconds"]}]

        async with http.get(f"{proxy.url}/ui/api/logs/{NS}/m", headers=AUTH) as logs:
            assert logs.status == 404
            error = (await logs.json())["error"]
            assert error["code"] == "logs_unavailable" and "cluster mode" in error["message"]

        for name, phase, state in (("big", "Ready", "Active"), ("small", "Loading", "Active"), ("gone", "Preempted",
                                                                                              "Preempted")):
            await client.create(Model(metadata={"name": name, "namespace": NS}, spec={
                "backend": "llamacpp", "source": "file:///models/tiny.gguf", "gpu": {"vendor": "amd", "shared": "g1"}}))
            await patch_status(client, name, {"phase": phase, "sharedGroup": {
                "groupName": "g1", "state": state, "memoryNeedMiB": 1000 if name == "big" else 500,
                "memoryNeedSource": "declared", "memoryBudgetMiB": 3000}})

        async def memory() -> list[dict[str, Any]] | None:
            groups: list[dict[str, Any]] = (await status())["memory_groups"]
            return groups if groups and groups[0]["models"] == [f"{NS}/big", f"{NS}/small"] else None

        groups = await poll_until(memory, timeout=10, what="the group's memory on the page")
        assert groups == [{"group": f"{NS}/g1", "budget_mib": 3000, "used_mib": 1000, "reserved_mib": 500,
                           "models": [f"{NS}/big", f"{NS}/small"]}], "g0 (one model at a time) has no bar"
        expected = {f"{NS}/m": None, f"{NS}/big": {"mib": 1000, "source": "declared"},
                    f"{NS}/small": {"mib": 500, "source": "declared"}, f"{NS}/gone": {"mib": 500, "source": "declared"}}

        async def needs() -> dict[str, Any] | None:  # the bar is drawn before the last status write reaches the page
            shown = {m["key"]: m["need"] for m in (await status())["models"]}
            return shown if shown == expected else None

        await poll_until(needs, timeout=10, what="each model's need on the page")
    label, used_fraction = await asyncio.to_thread(memory_bar, proxy.url, tmp_path)
    assert label == f"{NS}/g1: 1000 MiB used, 500 MiB loading, of 2.9 GiB (2 running)", label
    assert abs(used_fraction - 1000 / 3000) < 0.02


def memory_bar(url: str, workdir: Path) -> tuple[str, float]:
    """The group's memory bar as a real headless Chromium draws it (the token in the page's session storage): its
    label and the fraction of the bar its used part fills."""
    from selenium.webdriver.common.by import By

    from support.browser import headless_chromium, keep_screenshot

    item = f'#memory li[data-group="{NS}/g1"]'
    with headless_chromium(workdir) as driver:
        driver.get(f"{url}/ui")
        driver.execute_script("sessionStorage.setItem('flexinfer-token', arguments[0])", TOKEN)
        driver.get(f"{url}/ui")
        label = wait_until(lambda: next((e.text for e in driver.find_elements(By.CSS_SELECTOR, f"{item} .memory-label")
                                         if e.text), None), 30, "the group's memory bar")
        bar = driver.find_element(By.CSS_SELECTOR, f"{item} .membar")
        used = driver.find_element(By.CSS_SELECTOR, f"{item} .used")
        keep_screenshot(driver, workdir, "cluster-memory-groups.png")
        return label, used.size["width"] / bar.size["width"]


async def _queued(status: Any) -> bool:
    body = await status()
    return any(m["queue_depth"] for m in body["models"])
