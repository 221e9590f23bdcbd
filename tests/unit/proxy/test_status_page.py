"""The status page routes: static assets without a token, JSON behind the proxy's bearer auth, group
holders, the cluster merge of catalog and dispatcher state, and the log tail (local only)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from flexinfer.proxy.app import error_middleware
from flexinfer.proxy.auth import BearerAuth
from flexinfer.proxy.status_page import StatusPage, catalog_states, group_holders, install
from flexinfer.runtime.activity import ActivityLog
from flexinfer.runtime.dispatcher import ModelState
from flexinfer.runtime.ports import ModelView


def state(name: str, phase: str, group: str | None = "g", queue: int = 0) -> ModelState:
    return ModelState(key=f"default/{name}", name=name, namespace="default", group=group, priority=100,
                      phase=phase, queue_depth=queue, in_flight=0, endpoint=None, last_swap_age=None)


STATES = [state("a", "Preempted"), state("b", "Ready", queue=2), state("solo", "Idle", group=None)]


@pytest.fixture
async def client_for() -> AsyncIterator[Callable[[StatusPage], object]]:
    clients: list[TestClient] = []

    async def make(page: StatusPage) -> TestClient:
        app = web.Application(middlewares=[error_middleware])
        install(app, page)
        client = TestClient(TestServer(app))
        await client.start_server()
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


def page(token: str | None = None, logs: bool = True) -> StatusPage:
    lines = {"default/a": ["one", "two", "three"]}
    return StatusPage(lambda: STATES, ActivityLog(), BearerAuth(token), "local",
                      logs=(lambda key, n: lines.get(key, [])[-n:]) if logs else None)


async def test_assets_are_served_without_a_token(client_for) -> None:
    client = await client_for(page(token="s3cret"))
    for path, kind in (("/ui", "text/html"), ("/ui/static/app.js", "text/javascript"),
                       ("/ui/static/style.css", "text/css")):
        response = await client.get(path)
        assert response.status == 200 and response.content_type == kind, path
    assert "/ui/static/app.js" in await (await client.get("/ui")).text()
    missing = await client.get("/ui/static/../admin.py")
    assert missing.status == 404


async def test_status_needs_the_token_when_auth_is_on(client_for) -> None:
    client = await client_for(page(token="s3cret"))
    refused = await client.get("/ui/api/status")
    assert refused.status == 401
    assert "bearer token" in (await refused.json())["error"]["message"]
    allowed = await client.get("/ui/api/status", headers={"Authorization": "Bearer s3cret"})
    assert allowed.status == 200


async def test_status_lists_models_groups_and_activity(client_for) -> None:
    client = await client_for(page())
    body = await (await client.get("/ui/api/status")).json()
    assert body["mode"] == "local" and body["logs_available"] is True
    assert [(m["key"], m["phase"], m["queue_depth"]) for m in body["models"]] == [
        ("default/a", "Preempted", 0), ("default/b", "Ready", 2), ("default/solo", "Idle", 0)]
    assert body["groups"] == {"g": "default/b"}
    assert body["activations"] == [] and body["durations"] == [] and body["errors"] == []
    assert body["memory_groups"] == [] and body["models"][0]["need"] is None


async def test_status_shows_the_memory_of_groups_that_pack_by_memory(client_for) -> None:
    group = {"group": "default/g", "budget_mib": 1024.0, "used_mib": 300.0, "reserved_mib": 200.0,
             "models": ["default/b"], "evictions": {"make_room": 1, "out_of_memory": 0}}
    measured = ModelState(key="default/b", name="b", namespace="default", group="g", priority=100, phase="Ready",
                          queue_depth=0, in_flight=0, endpoint=None, last_swap_age=None, need_mib=300.0,
                          need_source="measured")
    client = await client_for(StatusPage(lambda: [measured], ActivityLog(), BearerAuth(None), "local",
                                         memory=lambda: [group]))
    body = await (await client.get("/ui/api/status")).json()
    assert body["memory_groups"] == [group] and body["models"][0]["need"] == {"mib": 300.0, "source": "measured"}


def test_a_group_without_a_loading_or_ready_member_is_free() -> None:
    assert group_holders([state("a", "Preempted"), state("b", "Idle")]) == {"g": None}
    assert group_holders([state("a", "Idle"), state("b", "Loading")]) == {"g": "default/b"}
    assert group_holders([state("a", "Ready"), state("b", "Loading")]) == {"g": "default/a, default/b"}


async def test_log_tail_and_its_errors(client_for) -> None:
    client = await client_for(page())
    body = await (await client.get("/ui/api/logs/default/a?tail=2")).json()
    assert body == {"model": "default/a", "lines": ["two", "three"]}
    unknown = await client.get("/ui/api/logs/default/nope")
    assert unknown.status == 404 and (await unknown.json())["error"]["code"] == "model_not_found"
    bad = await client.get("/ui/api/logs/default/a?tail=lots")
    assert bad.status == 400 and (await bad.json())["error"]["param"] == "tail"


async def test_cluster_mode_says_logs_are_unavailable(client_for) -> None:
    client = await client_for(page(logs=False))
    assert (await (await client.get("/ui/api/status")).json())["logs_available"] is False
    response = await client.get("/ui/api/logs/default/a")
    assert response.status == 404
    error = (await response.json())["error"]
    assert error["code"] == "logs_unavailable" and "cluster mode" in error["message"]


def test_cluster_states_take_group_and_phase_from_the_catalog() -> None:
    class Catalog:
        def resolve(self, name: str) -> ModelView | None:
            return None

        def models(self) -> list[ModelView]:
            return [ModelView("b", "ml", "llamacpp", "b", "Ready", group="gpu0"),
                    ModelView("a", "ml", "llamacpp", "a", "Preempted", group="gpu0")]

    dispatcher = [ModelState(key="ml/b", name="b", namespace="ml", group=None, priority=100, phase="Loading",
                             queue_depth=3, in_flight=1, endpoint=None, last_swap_age=None)]
    rows = catalog_states(Catalog(), lambda: dispatcher)()
    assert [(s.key, s.group, s.phase, s.queue_depth, s.in_flight) for s in rows] == [
        ("ml/a", "gpu0", "Preempted", 0, 0), ("ml/b", "gpu0", "Ready", 3, 1)]
