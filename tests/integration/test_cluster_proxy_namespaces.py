"""An all-namespaces ``flexinfer proxy`` against a real kube-apiserver with ``default/chat`` and ``team-b/chat``.

The test plays the manager for both namespaces (as in ``test_cluster_proxy``): each Model gets its own fake
OpenAI upstream through the test-only endpoint override, so the test sees which Model every request reached.
Requests go through the official ``openai`` client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest
from lightkube import AsyncClient, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Namespace

from flexinfer.assembly.proxy import ClusterProxy, start_proxy
from integration.test_cluster_proxy import Manager, Upstream, activate, chat, openai_client, proxy_env, testbed
from support.kube_testbed import KubeTestbed
from support.polling import eventually

pytestmark = pytest.mark.integration
NAMESPACES = ("default", "team-b")
__all__ = ["testbed"]  # the module-scoped apiserver fixture, shared with test_cluster_proxy's helpers


@pytest.fixture
async def two_chats(testbed: KubeTestbed
                    ) -> AsyncIterator[tuple[ClusterProxy, dict[str, Manager], dict[str, Upstream]]]:
    client = AsyncClient(KubeConfig.from_file(str(testbed.kubeconfig)))
    try:
        await client.create(Namespace(metadata={"name": "team-b"}))
    except ApiError as exc:
        if exc.status.code != 409:
            raise
    managers = {ns: Manager(client, ns) for ns in NAMESPACES}
    upstreams = {ns: await Upstream().start() for ns in NAMESPACES}
    env = {**proxy_env(testbed, "default"), "FLEXINFER_PROXY_ALL_NAMESPACES": "true"}
    proxy = await start_proxy(host="127.0.0.1", port=0, env=env)
    try:
        for manager in managers.values():
            await manager.create("chat")
        await eventually(lambda: all(proxy.side.store.get(f"{ns}/chat") for ns in NAMESPACES), timeout=10)
        yield proxy, managers, upstreams
    finally:
        await proxy.close()
        for upstream in upstreams.values():
            await upstream.close()
        await client.close()


async def test_each_namespace_is_reached_by_its_key_and_the_bare_name_is_a_409(
        two_chats: tuple[ClusterProxy, dict[str, Manager], dict[str, Upstream]]) -> None:
    proxy, managers, upstreams = two_chats
    with pytest.raises(openai.ConflictError) as ambiguous:
        await chat(proxy, "chat")
    body = ambiguous.value.body
    assert isinstance(body, dict) and body["code"] == "model_ambiguous"
    assert "'default/chat', 'team-b/chat'" in body["message"]

    request = asyncio.create_task(chat(proxy, "team-b/chat"))
    await activate(managers["team-b"], upstreams["team-b"], "chat")
    assert (await asyncio.wait_for(request, 10)).startswith("tok0")
    assert "lastActiveTime" not in ((await managers["default"].get("chat")).get("status") or {}), \
        "demand reached the other namespace's Model"
    assert upstreams["team-b"].fake.requests[-1].body["model"] == "chat"  # type: ignore[index]  # served name

    request = asyncio.create_task(chat(proxy, "default/chat"))
    await activate(managers["default"], upstreams["default"], "chat")
    assert (await asyncio.wait_for(request, 10)).startswith("tok0")

    async with openai_client(proxy) as client:
        await client.chat.completions.create(model="ignored", messages=[{"role": "user", "content": "hi"}],
                                             extra_headers={"X-Model-ID": "team-b/chat"})
        listed = sorted([m.id async for m in client.models.list()])
    async with openai.AsyncOpenAI(base_url=f"{proxy.url}/model/team-b/chat/v1", api_key="unused",
                                  max_retries=0, timeout=30) as by_path:
        await by_path.chat.completions.create(model="ignored", messages=[{"role": "user", "content": "hi"}])
    assert [len(upstreams[ns].arrivals) for ns in NAMESPACES] == [1, 3]
    assert listed == ["default/chat", "team-b/chat"]

    async with aiohttp.ClientSession() as session, session.get(f"{proxy.url}/metrics") as page:
        text = await page.text()
    assert 'flexinfer_proxy_requests_total{model="chat",namespace="team-b",status="success"} 3.0' in text
    assert 'flexinfer_proxy_requests_total{model="chat",namespace="default",status="success"} 1.0' in text
