"""A group pod's members get their status written at once when the pod answers: a member whose requests wait
for the pod's endpoint is not published after the others (``GroupPods.reconcile``, against a recording API and a
stand-in pod that answers the admin status)."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime
from typing import Any, cast

from aiohttp import web
from aiohttp.test_utils import TestServer

from flexinfer.core.controller_defaults import ControllerDefaults
from flexinfer.core.model_status.plan import ManagerPolicy
from flexinfer.manager.client import KubeApi
from flexinfer.manager.reconciler import Reconciler
from flexinfer.manager.store import Store, Unit
from flexinfer.runtime.observer import NullObserver
from support.recording_kube import RecordingKubeApi
from support.resource_builders import model_doc

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
POLICY = ManagerPolicy(group_strategies=(("g", "TimeSliced"),))
MEMBERS = ("a", "b", "c")
UNIT = Unit("ns", "g", group=True)
Body = dict[str, Any]


class GroupApi(RecordingKubeApi):
    """The recording API with the token Secret the group pod needs; status patches wait for each other at
    ``barrier`` (a pass that writes them one after the other never gets past the first)."""

    def __init__(self, store: Store, barrier: asyncio.Barrier | None = None) -> None:
        super().__init__(store)
        self.barrier = barrier

    async def secret_value(self, _namespace: str, _name: str, _key: str) -> str | None:
        return "token"

    async def patch_model_status(self, namespace: str, name: str, patch: Body) -> Body:
        if self.barrier is not None:
            async with asyncio.timeout(5):
                await self.barrier.wait()
        return await super().patch_model_status(namespace, name, patch)


def group_pod(port: int) -> Body:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "flexinfer-group-g-1", "namespace": "ns", "uid": "pod-1",
                         "creationTimestamp": "2026-12-05T11:59:00Z",
                         "labels": {"flexinfer.ai/model": "flexinfer-group-g", "flexinfer.ai/group-pod": "g"}},
            "spec": {"containers": [{"name": "flexinfer", "ports": [{"name": "http", "containerPort": port}]}]},
            "status": {"phase": "Running", "podIP": "127.0.0.1"}}


async def test_the_members_statuses_are_written_together_once_the_pod_answers() -> None:
    async def status(_request: web.Request) -> web.Response:
        return web.json_response({"models": [{"key": f"ns/{name}", "phase": "Idle"} for name in MEMBERS],
                                  "config": {"revision": "r0"}})

    async def lifecycle(_request: web.Request) -> web.Response:
        return web.json_response({"events": [], "next": 0})

    async def accepted(_request: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/admin/status", status)
    app.router.add_get("/admin/lifecycle", lifecycle)
    app.router.add_put("/admin/manifests", accepted)
    async with TestServer(app, host="127.0.0.1") as server:
        store, answered = Store(), asyncio.Event()
        for name in MEMBERS:
            doc = model_doc(name, "ns", uid=f"uid-{name}", backend="llamacpp", source=f"file:///opt/{name}.gguf",
                            image="registry.local/flexinfer-llamacpp:1", gpu={"shared": "g"})
            doc["metadata"].update(resourceVersion="1", generation=1, creationTimestamp="2026-12-05T11:00:00Z")
            store.put("Model", doc)
        store.put("Pod", group_pod(server.port or 0))
        api = GroupApi(store)
        reconciler = Reconciler(cast(KubeApi, api), store, ControllerDefaults(), POLICY, sink=NullObserver(),
                                scope=lambda *_: contextlib.nullcontext(),  # type: ignore[arg-type,return-value]
                                wake=lambda _unit, _when: answered.set(), clock=lambda: NOW)
        try:
            await reconciler.reconcile(UNIT)  # starts asking the pod; nothing is written before it answers
            assert not [call for call in api.calls if call[0] == "status"]
            await answered.wait()
            api.barrier = asyncio.Barrier(len(MEMBERS))
            await reconciler.reconcile(UNIT)
            assert sorted(call[1] for call in api.calls if call[0] == "status") == sorted(MEMBERS)
        finally:
            await reconciler.group_pods.close()
