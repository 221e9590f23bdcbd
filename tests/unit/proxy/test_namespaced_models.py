"""The proxy edge with one model name in two namespaces, over the real local catalog: a request is resolved
once to a key and only that key reaches the activator; an ambiguous bare name is a 409 naming the candidates;
``/v1/models`` lists both models distinguishably; the metrics keep them apart."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from flexinfer.api.key import ModelKey
from flexinfer.api.model import Model
from flexinfer.local.catalog import ManifestCatalog
from flexinfer.observability.metrics import ProxyMetrics
from support.fake_openai import FakeOpenAI
from support.local_processes import make_model

if TYPE_CHECKING:
    from conftest import ProxyFactory, StubActivator

CHAT = "/v1/chat/completions"
DEFAULT, TEAM_B = ModelKey("default", "chat"), ModelKey("team-b", "chat")


def in_namespace(model: Model, namespace: str) -> Model:
    return model.model_copy(update={"metadata": model.metadata.model_copy(update={"namespace": namespace})})


@dataclass
class Edge:
    url: str
    activator: StubActivator
    registry: CollectorRegistry
    session: aiohttp.ClientSession

    async def post(self, path: str, body: dict[str, object], **headers: str) -> tuple[int, dict[str, object]]:
        async with self.session.post(self.url + path, json=body, headers=headers) as response:
            return response.status, await response.json()


@pytest.fixture
async def edge(make_proxy: ProxyFactory) -> Edge:
    chat = make_model("chat", "file:///chat", {"servedModelName": "chat-upstream"})
    models = [chat, in_namespace(chat, "team-b"), make_model("solo", "file:///solo")]
    registry = CollectorRegistry()
    proxy = await make_proxy(catalog=ManifestCatalog(models), registry=registry,
                             metrics=ProxyMetrics(registry, [m.key for m in models]))
    return Edge(proxy.url, proxy.activator, registry, proxy.session)


async def test_an_ambiguous_bare_name_is_409_naming_the_candidates_and_activates_nothing(edge: Edge) -> None:
    status, body = await edge.post(CHAT, {"model": "chat", "messages": []})
    assert status == 409
    error = body["error"]
    assert isinstance(error, dict)
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "model_ambiguous", "model")
    assert "'default/chat', 'team-b/chat'" in str(error["message"])
    assert edge.activator.keys == []
    labels = {"model": "", "namespace": "", "status": "error"}
    assert edge.registry.get_sample_value("flexinfer_proxy_requests_total", labels) == 1


async def test_every_way_of_naming_a_key_reaches_that_model_only(edge: Edge, fake: FakeOpenAI) -> None:
    assert (await edge.post(CHAT, {"model": "team-b/chat", "messages": []}))[0] == 200
    assert fake.requests[-1].body is not None and fake.requests[-1].body["model"] == "chat-upstream"
    assert (await edge.post(CHAT, {"model": "ignored", "messages": []}, **{"X-Model-ID": "default/chat"}))[0] == 200
    assert (await edge.post("/model/team-b/chat" + CHAT, {"messages": []}))[0] == 200
    assert fake.requests[-1].path == CHAT
    assert (await edge.post("/model/solo" + CHAT, {"messages": []}))[0] == 200
    assert edge.activator.keys == [TEAM_B, DEFAULT, TEAM_B, ModelKey("default", "solo")]
    assert all(isinstance(k, ModelKey) for k in edge.activator.keys)
    team_b = {"model": "chat", "namespace": "team-b", "status": "success"}
    assert edge.registry.get_sample_value("flexinfer_proxy_requests_total", team_b) == 2
    assert edge.registry.get_sample_value("flexinfer_proxy_requests_total", {**team_b, "namespace": "default"}) == 1


async def test_models_list_shows_a_shared_name_as_namespace_slash_name(edge: Edge) -> None:
    async with edge.session.get(edge.url + "/v1/models") as response:
        listed = (await response.json())["data"]
    assert [m["id"] for m in listed] == ["default/chat", "solo", "team-b/chat"]
    assert [m["metadata"]["key"] for m in listed] == ["default/chat", "default/solo", "team-b/chat"]
    assert listed[2]["metadata"]["namespace"] == "team-b"
