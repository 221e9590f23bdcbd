"""``Reconciler.reconcile`` executes one plan per pass against a recording API: the member's manifests are
applied before the log the plan names is read, the lines refine the status written, and the unit's timer is
armed for the next log read; an invalid Model gets its Failed status and one Warning event."""

from __future__ import annotations

import contextlib
import copy
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from flexinfer.cluster_proxy.demand import rfc3339
from flexinfer.core.controller_defaults import ControllerDefaults
from flexinfer.core.model_status.plan import ManagerPolicy
from flexinfer.manager.client import KubeApi
from flexinfer.manager.reconciler import Reconciler
from flexinfer.manager.store import Store, Unit
from support.recording_kube import RecordingKubeApi
from support.resource_builders import model_doc

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
POLICY = ManagerPolicy(log_poll_interval=10.0)
Body = dict[str, Any]


class Sink:
    def __getattr__(self, _name: str) -> Any:
        return lambda *_a, **_k: None


def subject(store: Store, api: RecordingKubeApi, wakes: list[tuple[Unit, datetime]]) -> Reconciler:
    return Reconciler(cast(KubeApi, api), store, ControllerDefaults(), POLICY, sink=Sink(),  # type: ignore[arg-type]
                      scope=lambda *_: contextlib.nullcontext(),  # type: ignore[arg-type,return-value]
                      wake=lambda unit, when: wakes.append((unit, when)), clock=lambda: NOW)


def loading(store: Store) -> None:
    doc = model_doc("m", "ns")
    doc["metadata"]["resourceVersion"] = "1"
    doc["status"] = {"phase": "Loading", "lastActiveTime": rfc3339(NOW)}
    store.put("Model", doc)
    store.put("Deployment", {"apiVersion": "apps/v1", "kind": "Deployment",
                             "metadata": {"name": "m", "namespace": "ns", "resourceVersion": "2"},
                             "spec": {"replicas": 1}, "status": {"replicas": 1, "unavailableReplicas": 1}})
    store.put("Pod", {"metadata": {"name": "m-abc", "namespace": "ns", "labels": {"flexinfer.ai/model": "m"},
                                   "creationTimestamp": rfc3339(NOW)},
                      "status": {"containerStatuses": [{"name": "model", "ready": False, "state": {"running": {}}}]}})


async def test_a_loading_server_is_applied_then_its_log_read_and_the_refined_status_written() -> None:
    store, wakes = Store(), cast(list[tuple[Unit, datetime]], [])
    loading(store)
    api = RecordingKubeApi(store, log=["INFO:     Uvicorn running on http://0.0.0.0:8000"])
    await subject(store, api, wakes).reconcile(Unit("ns", "m"))
    assert [c[0] for c in api.calls] == ["apply", "apply", "log", "status"]
    assert api.calls[2] == ("log", "m-abc", "model")
    parsed = store.model("ns", "m")
    assert parsed is not None and parsed.model is not None
    assert (parsed.model.status.phase, parsed.model.status.loading_substage) == ("Loading", "HealthCheckPending")
    assert wakes == [(Unit("ns", "m"), NOW + timedelta(seconds=10))]


async def test_an_invalid_model_is_failed_once_with_one_warning() -> None:
    store, wakes = Store(), cast(list[tuple[Unit, datetime]], [])
    doc = model_doc("bad", "ns", source="nope://x")
    doc["metadata"]["resourceVersion"] = "1"
    store.put("Model", copy.deepcopy(doc))
    api = RecordingKubeApi(store)
    reconciler = subject(store, api, wakes)
    for _ in range(2):
        await reconciler.reconcile(Unit("ns", "bad"))
    assert api.calls == [("status", "bad", "Failed"), ("event", "Warning", "ValidationFailed")]
    assert wakes == []


async def test_a_crash_loop_is_written_with_its_logged_cause_and_announced_once() -> None:
    store, wakes = Store(), cast(list[tuple[Unit, datetime]], [])
    loading(store)
    store.put("Pod", {"metadata": {"name": "m-abc", "namespace": "ns", "labels": {"flexinfer.ai/model": "m"},
                                   "creationTimestamp": rfc3339(NOW)},
                      "status": {"containerStatuses": [{
                          "name": "model", "ready": False, "restartCount": 2,
                          "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s"}},
                          "lastState": {"terminated": {"reason": "Error", "exitCode": 1}}}]}})
    api = RecordingKubeApi(store, log=["llama_load_model_from_file: failed to load model", ""])
    reconciler = subject(store, api, wakes)
    for _ in range(2):
        await reconciler.reconcile(Unit("ns", "m"))
    assert api.calls[:5] == [("apply", "Deployment", "m", "1"), ("apply", "Service", "m", ""),
                             ("previous-log", "m-abc", "model"), ("status", "m", "Failed"),
                             ("event", "Warning", "CrashLoopBackOff")]
    assert ("event", "Warning", "CrashLoopBackOff") not in api.calls[5:], "announced once"
    parsed = store.model("ns", "m")
    assert parsed is not None and parsed.model is not None
    assert parsed.model.status.message == ("CrashLoopBackOff: container model crashed 2 times: "
                                           "llama_load_model_from_file: failed to load model")


def serving_pod(store: Store, port: int) -> None:
    """``m``'s pod as the kubelet first reports it: running, with an address, its readiness probe not yet run."""
    store.put("Pod", {
        "metadata": {"name": "m-abc", "namespace": "ns", "labels": {"flexinfer.ai/model": "m"},
                     "creationTimestamp": rfc3339(NOW), "resourceVersion": "3"},
        "spec": {"containers": [{"name": "model", "ports": [{"name": "http", "containerPort": port}],
                                 "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}}}]},
        "status": {"podIP": "127.0.0.1", "containerStatuses": [
            {"name": "model", "ready": False, "restartCount": 0, "state": {"running": {"startedAt": rfc3339(NOW)}}}]}})


@pytest.mark.parametrize(("answer", "phase"), [(200, "Ready"), (503, "Loading")], ids=["listening", "loading"])
async def test_the_pass_that_first_asks_a_listening_server_writes_ready_in_one_status_write(
        answer: int, phase: str) -> None:
    asked: list[str] = []

    async def health(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.Response(status=answer)

    app = web.Application()
    app.router.add_get("/health", health)
    async with TestServer(app, host="127.0.0.1") as server:
        store, wakes = Store(), cast(list[tuple[Unit, datetime]], [])
        loading(store)
        serving_pod(store, server.port or 0)
        api = RecordingKubeApi(store, log=["main: server is listening on http://0.0.0.0:8080"])
        reconciler = subject(store, api, wakes)
        try:
            await reconciler.reconcile(Unit("ns", "m"))
        finally:
            await reconciler.prober.close()
    assert asked[:1] == ["/health"], "the pass asked the server itself"
    assert len([c for c in api.calls if c[0] == "status"]) == 1
    parsed = store.model("ns", "m")
    assert parsed is not None and parsed.model is not None and parsed.model.status.phase == phase
