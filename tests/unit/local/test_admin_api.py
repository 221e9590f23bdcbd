"""The admin API handlers (status, logs, load, unload) over a scripted control surface."""

from __future__ import annotations

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from flexinfer.core.server_memory import ServerMemory
from flexinfer.local.admin import AdminApi
from flexinfer.local.catalog import ManifestCatalog
from flexinfer.local.logs import LogStore
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


async def client(token: str = "") -> tuple[TestClient, Control]:
    control, logs = Control(), LogStore()
    logs.get("default/alpha").write("one\ntwo\nthree\n")
    api = AdminApi(control, ManifestCatalog([make_model("alpha", "file:///a")]), logs,
                   pid=lambda key: 1234, token=token,
                   memory=lambda key: ServerMemory(0.46, 0.25, 1.51, 0.0, (("host", 2.22),), complete=True),
                   groups=lambda: [GROUP])
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
