"""The admin API handlers (status, logs, load, unload, pushed manifests, lifecycle events) over a scripted control
surface and a real ``ManifestReloader``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from flexinfer.api.model import Model
from flexinfer.api.modelcache import ModelCache
from flexinfer.core.manifest_revision import manifest_revision
from flexinfer.core.server_memory import ServerMemory
from flexinfer.local.admin import MAX_MANIFEST_BYTES, AdminApi
from flexinfer.local.catalog import ManifestCatalog
from flexinfer.local.lifecycle_events import LifecycleEvents
from flexinfer.local.logs import LogStore
from flexinfer.local.reloading import ManifestReloader
from flexinfer.runtime.dispatcher import ModelState
from flexinfer.runtime.ports import Endpoint
from support.local_processes import make_model

GROUP: dict[str, object] = {"group": "default/g", "budget_mib": 64.0, "used_mib": 2.22, "reserved_mib": 0.0,
                            "models": ["default/alpha"], "evictions": {"make_room": 0, "out_of_memory": 0}}


class Control:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, bool]] = []

    def snapshot(self) -> list[ModelState]:
        return [ModelState("default/alpha", "alpha", "default", "g", 100, "Ready", 2, 1,
                           Endpoint("http://127.0.0.1:5000"), 3.5, need_mib=2.22, need_source="measured")]

    async def preload(self, model: str, wait: bool = False, timeout: float | None = None) -> str:
        self.calls.append(("load", model, wait))
        return "Ready"

    async def unload(self, model: str) -> None:
        self.calls.append(("unload", model, False))


async def client(token: str = "", reloader: ManifestReloader | None = None,
                 events: LifecycleEvents | None = None) -> tuple[TestClient, Control]:
    control, logs = Control(), LogStore()
    logs.get("default/alpha").write("one\ntwo\nthree\n")
    api = AdminApi(control, ManifestCatalog([make_model("alpha", "file:///a")]), logs,
                   pid=lambda key: 1234, token=token,
                   memory=lambda key: ServerMemory(0.46, 0.25, 1.51, 0.0, (("host", 2.22),), complete=True),
                   groups=lambda: [GROUP], config=reloader.status.as_json if reloader else None,
                   push=reloader.push if reloader else None, lifecycle=events)
    app = web.Application()
    app.router.add_routes(api.routes())
    test_client = TestClient(TestServer(app))
    await test_client.start_server()
    return test_client, control


async def test_status_and_logs() -> None:
    http, _ = await client()
    try:
        status = await (await http.get("/admin/status")).json()
        assert status["models"] == [{
            "key": "default/alpha", "name": "alpha", "namespace": "default", "group": "g", "priority": 100,
            "phase": "Ready", "queue_depth": 2, "in_flight": 1, "endpoint": "http://127.0.0.1:5000",
            "last_swap_age": 3.5, "draining": False, "pid": 1234, "last_error": None, "ready_for": None,
            "retry_in": None, "memory": {"model_mib": 0.46, "kv_mib": 0.25, "compute_mib": 1.51, "other_mib": 0.0,
                                         "total_mib": 2.22, "devices": {"host": 2.22}, "complete": True},
            "need": {"mib": 2.22, "source": "measured"}}]
        assert status["groups"] == [GROUP]
        logs = await (await http.get("/admin/logs/alpha", params={"tail": "2"})).json()
        assert logs == {"model": "default/alpha", "lines": ["two", "three"], "started": True}
        assert (await http.get("/admin/logs/default/alpha")).status == 200
        assert (await http.get("/admin/logs/alpha", params={"tail": "-1"})).status == 400
    finally:
        await http.close()


async def test_log_window_continues_and_checks_its_numbers() -> None:
    http, _ = await client()
    try:
        first = await (await http.get("/admin/models/alpha/logs", params={"tail": "2", "since": "60"})).json()
        assert first == {"model": "default/alpha", "lines": ["two", "three"], "next": 3, "started": True}
        after = await (await http.get("/admin/models/default/alpha/logs", params={"after": "1"})).json()
        assert after["lines"] == ["two", "three"] and after["next"] == 3
        for name, value in (("after", "-1"), ("since", "ten"), ("tail", "x"), ("since", "inf")):
            answer = await http.get("/admin/models/alpha/logs", params={name: value})
            assert answer.status == 400 and (await answer.json())["error"]["param"] == name
    finally:
        await http.close()


async def test_load_and_unload() -> None:
    http, control = await client()
    try:
        assert await (await http.post("/admin/models/alpha/load?wait=true")).json() == \
            {"model": "default/alpha", "phase": "Ready"}
        assert (await http.post("/admin/models/alpha/unload")).status == 200
        assert control.calls == [("load", "default/alpha", True), ("unload", "default/alpha", False)]
    finally:
        await http.close()


async def test_unknown_model_and_token() -> None:
    http, _ = await client(token="s3cret")
    try:
        denied = await http.get("/admin/status")
        assert denied.status == 401 and (await denied.json())["error"]["code"] == "invalid_api_key"
        missing = await http.get("/admin/logs/ghost", headers={"Authorization": "Bearer s3cret"})
        assert missing.status == 404 and (await missing.json())["error"]["code"] == "model_not_found"
        headers = {"Authorization": "Bearer s3cret"}
        assert (await http.get("/admin/status", headers=headers)).status == 200
    finally:
        await http.close()


def manifests(*names: str, **config: object) -> bytes:
    return yaml.safe_dump_all([{"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model", "metadata": {"name": n},
                                "spec": {"backend": "llamacpp", "source": "file:///w", "config": dict(config)}}
                               for n in names], sort_keys=False).encode()


async def test_pushed_manifests_are_applied_or_rejected_with_every_problem(tmp_path: Path) -> None:
    applied: list[list[str]] = []

    async def apply(models: list[Model], caches: list[ModelCache]) -> None:
        applied.append([m.name for m in models])

    reloader = ManifestReloader([tmp_path], [], apply, installed=None, base_dir=tmp_path)
    http, _ = await client(reloader=reloader)
    try:
        text = manifests("alpha", "beta")
        accepted = await http.put("/admin/manifests", data=text)
        config = await accepted.json()
        assert accepted.status == 200 and applied == [["alpha", "beta"]]
        assert (config["result"], config["trigger"], config["models"]) == ("applied", "push", 2)
        assert config["revision"] == manifest_revision(text)
        status = await (await http.get("/admin/status")).json()
        assert status["config"] == config

        rejected = await http.put("/admin/manifests", data=manifests("alpha", "beta", startupTimeout="soon"))
        body = await rejected.json()
        assert rejected.status == 422 and applied == [["alpha", "beta"]]
        assert body["error"]["type"] == "invalid_request_error" and body["error"]["code"] == "invalid_manifests"
        assert [e.split(": ", 1)[0] for e in body["errors"]] == ["pushed:9:5", "pushed:19:5"]
        assert body["error"]["message"] == f"{body['errors'][0]} (and 1 more problem(s), listed in errors)"
        assert (await (await http.get("/admin/status")).json())["config"]["revision"] == manifest_revision(text)

        same = await http.put("/admin/manifests", data=text)
        assert same.status == 200 and (await same.json())["result"] == "unchanged" and len(applied) == 1
        empty = await http.put("/admin/manifests", data=b"")
        assert empty.status == 422
        assert (await empty.json())["error"]["message"] == "no Model manifests found in the pushed manifests"
        too_large = await http.put("/admin/manifests", data=b"#" * (MAX_MANIFEST_BYTES + 1))
        assert too_large.status == 413 and (await too_large.json())["error"]["code"] == "request_too_large"

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: the limit holds while reading
            for _ in range(5):
                yield b"#" * (1024 * 1024)

        streamed = await http.put("/admin/manifests", data=chunks())
        assert streamed.status == 413 and reloader.status.reloads == 4, "the oversized bodies were never checked"
    finally:
        await http.close()


async def test_lifecycle_events_are_polled_after_a_number() -> None:
    events = LifecycleEvents()
    events.cold_start(make_model("alpha", "file:///a"), 1.25)
    events.swap(make_model("beta", "file:///b"), 0.5)
    http, _ = await client(events=events)
    try:
        every = await (await http.get("/admin/lifecycle")).json()
        assert every["next"] == 2 and not every["lost"]
        assert [(e["seq"], e["model"], e["kind"], e["seconds"]) for e in every["events"]] == [
            (1, "default/alpha", "cold_start", 1.25), (2, "default/beta", "swap", 0.5)]
        assert all(e["at"].endswith("Z") for e in every["events"])
        after = await (await http.get("/admin/lifecycle", params={"after": "1"})).json()
        assert [e["seq"] for e in after["events"]] == [2]
        for value in ("-1", "x", "1.5", "inf"):
            answer = await http.get("/admin/lifecycle", params={"after": value})
            error = (await answer.json())["error"]
            assert answer.status == 400 and error["param"] == "after" and "after must be" in error["message"]
    finally:
        await http.close()


async def test_the_token_guards_the_new_routes_too(tmp_path: Path) -> None:
    async def apply(models: list[Model], caches: list[ModelCache]) -> None:
        return None

    reloader = ManifestReloader([tmp_path], [], apply, installed=None, base_dir=tmp_path)
    http, _ = await client(token="adm1n", reloader=reloader, events=LifecycleEvents())
    try:
        for method, path in (("PUT", "/admin/manifests"), ("GET", "/admin/lifecycle")):
            denied = await http.request(method, path, data=manifests("alpha"), headers={"Authorization": "Bearer x"})
            assert denied.status == 401 and (await denied.json())["error"]["code"] == "invalid_api_key"
        assert reloader.status.reloads == 0, "a refused push is never checked"
        allowed = await http.put("/admin/manifests", data=manifests("alpha"), headers={"Authorization": "Bearer adm1n"})
        assert allowed.status == 200
    finally:
        await http.close()
