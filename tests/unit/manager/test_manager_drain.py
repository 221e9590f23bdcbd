"""The manager's swap drain reads the proxies' reports afresh after writing a preemption: an in-flight
report that landed after the watch cache was read (but before the Preempted write) keeps the replica; a
failed read falls back to the watch cache."""

from __future__ import annotations

import contextlib
import copy
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from flexinfer.api.conventions import WAITING_SINCE_ANNOTATION
from flexinfer.cluster_proxy.demand import rfc3339
from flexinfer.core.controller_defaults import ControllerDefaults
from flexinfer.core.election import ElectionPolicy
from flexinfer.core.model_status.plan import ManagerPolicy
from flexinfer.manager.client import KubeApi
from flexinfer.manager.reconciler import Reconciler, Step
from flexinfer.manager.store import Store, Unit
from support.resource_builders import model_doc

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
POLICY = ManagerPolicy(election=ElectionPolicy(max_wait=2.0))
GROUP = Unit("ns", "g", True)
Body = dict[str, Any]


class Sink:
    def __getattr__(self, _name: str) -> Any:
        return lambda *_a, **_k: None


class Api:
    """The calls ``_preempt`` makes: the status write answers the stored body with the patch merged in."""

    def __init__(self, store: Store, reports: list[Body] | None) -> None:
        self.store, self.reports, self.listed = store, reports, 0

    async def patch_model_status(self, namespace: str, name: str, patch: Body) -> Body:
        parsed = self.store.model(namespace, name)
        assert parsed is not None
        body = copy.deepcopy(parsed.body)
        body["status"] = {**(body.get("status") or {}), **patch}
        body["metadata"]["resourceVersion"] = str(int(body["metadata"].get("resourceVersion") or 1) + 1)
        return body

    async def post_event(self, *_: Any) -> None:
        return None

    async def list_demands(self, namespace: str) -> list[Body] | None:
        self.listed += 1
        return self.reports


def report(proxy: str, **models: Body) -> Body:
    return {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDemand",
            "metadata": {"name": proxy, "namespace": "ns"},
            "spec": {"proxy": proxy, "renewTime": rfc3339(NOW), "models": models}}


def member(store: Store, name: str, priority: int, **status: Any) -> None:
    doc = model_doc(name, "ns", gpu={"shared": "g", "priority": priority})
    if name == "low":
        doc["metadata"]["annotations"] = {WAITING_SINCE_ANNOTATION: rfc3339(NOW - timedelta(seconds=3))}
    doc["metadata"]["resourceVersion"] = "1"
    doc["status"] = status
    store.put("Model", doc)


async def preempt_high(reports: list[Body] | None, cached: tuple[Body, ...] = ()) -> tuple[Step, Api]:
    """``high`` Ready and Active, ``low`` starving: this pass preempts ``high``."""
    store = Store()
    member(store, "high", 200, phase="Ready", lastActiveTime=rfc3339(NOW - timedelta(seconds=1)),
           sharedGroup={"state": "Active", "groupName": "g"})
    member(store, "low", 100)
    store.put("Deployment", {"apiVersion": "apps/v1", "kind": "Deployment",
                             "metadata": {"name": "high", "namespace": "ns", "resourceVersion": "1"},
                             "spec": {"replicas": 1}, "status": {"replicas": 1, "readyReplicas": 1}})
    for body in cached:
        store.put("ModelDemand", body)
    api = Api(store, reports)
    subject = Reconciler(cast(KubeApi, api), store, ControllerDefaults(), POLICY, sink=Sink(),  # type: ignore[arg-type]
                         scope=lambda *_: contextlib.nullcontext(), wake=lambda *_: None)  # type: ignore[arg-type,return-value]
    models = [p.model for p in store.unit_models(GROUP) if p.model is not None]
    step = next(s for s in subject._plan(GROUP, models, NOW) if s.inputs.model.name == "high")
    assert step.plan.preempt_now and step.plan.replicas == 0 and not step.inputs.busy
    after, _ = await subject._preempt(step, NOW)
    return after, api


async def test_a_report_read_afresh_after_the_preemption_keeps_the_replica() -> None:
    late = report("proxy-x", high={"inFlightAt": rfc3339(NOW - timedelta(seconds=1))})
    step, api = await preempt_high([late])
    assert api.listed == 1
    assert step.inputs.busy and step.plan.replicas == 1 and step.plan.draining_until is not None


async def test_without_reports_the_preempted_member_is_scaled_down() -> None:
    step, _ = await preempt_high([])
    assert not step.inputs.busy and step.plan.replicas == 0


@pytest.mark.parametrize("renewed", [True, False], ids=["live", "dead-proxy"])
async def test_a_failed_read_falls_back_to_the_watch_cache(renewed: bool) -> None:
    cached = report("proxy-y", high={"inFlightAt": rfc3339(NOW - timedelta(seconds=1))})
    if not renewed:
        cached["spec"]["renewTime"] = rfc3339(NOW - timedelta(minutes=5))
    step, _ = await preempt_high(None, (cached,))
    assert step.inputs.busy is renewed and step.plan.replicas == (1 if renewed else 0)
