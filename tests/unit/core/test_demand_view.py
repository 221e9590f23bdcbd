"""Folding the proxies' ModelDemand reports into the Model the manager's decisions read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from flexinfer.api.conventions import WAITING_SINCE_ANNOTATION
from flexinfer.api.model import Model
from flexinfer.api.modeldemand import ModelDemand
from flexinfer.core.demand_view import demand_view, with_demand
from flexinfer.core.election import waiting_since_of
from flexinfer.core.model_status.plan import busy_proxies

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def ago(seconds: float) -> str:
    return (NOW - timedelta(seconds=seconds)).isoformat()


def report(proxy: str, renewed: float | None, **models: dict[str, Any]) -> ModelDemand:
    spec: dict[str, Any] = {"proxy": proxy, "models": models}
    if renewed is not None:
        spec["renewTime"] = ago(renewed)
    return ModelDemand.model_validate({"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDemand",
                                       "metadata": {"name": proxy}, "spec": spec})


def model(**status: Any) -> Model:
    return Model.model_validate({"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model", "metadata": {"name": "m"},
                                 "spec": {"backend": "vllm", "source": "HF://o/m"}, "status": status})


def test_newest_demand_oldest_live_wait_and_fresh_in_flight_reports() -> None:
    reports = [
        report("a", 5, m={"lastActiveTime": ago(50), "waitingSince": ago(400), "inFlightAt": ago(3)}),
        report("b", 5, m={"lastActiveTime": ago(10), "waitingSince": ago(100), "inFlightAt": ago(45)}),
        report("dead", 300, m={"lastActiveTime": ago(1), "waitingSince": ago(900), "inFlightAt": ago(1)}),
        report("other", 1, n={"lastActiveTime": ago(0)}),
    ]
    view = demand_view(reports, "m", NOW, 30.0)
    assert view.last_active == NOW - timedelta(seconds=1)
    assert view.waiting_since == NOW - timedelta(seconds=400), "the dead replica's wait is ignored"
    assert [p for p, _ in view.busy] == ["a"], "stale in-flight stamps and dead replicas are not busy"


def test_with_demand_projects_status_and_annotations_the_decisions_read() -> None:
    view = demand_view([report("a", 1, m={"lastActiveTime": ago(5), "waitingSince": ago(60),
                                         "inFlightAt": ago(2)})], "m", NOW, 30.0)
    seen = with_demand(model(lastActiveTime=ago(100)), view)
    assert seen.status.last_active_time == NOW - timedelta(seconds=5)
    assert waiting_since_of(seen) == NOW - timedelta(seconds=60)
    assert busy_proxies(seen.metadata.annotations, NOW, 30.0) == ["a"]


def test_older_values_stored_on_the_model_are_kept() -> None:
    """A Go or pre-ModelDemand proxy wrote the Model itself: the older wait / newer demand stays in force."""
    legacy = model(lastActiveTime=ago(1))
    legacy = legacy.model_copy(update={"metadata": legacy.metadata.model_copy(
        update={"annotations": {WAITING_SINCE_ANNOTATION: ago(600)}})})
    view = demand_view([report("a", 1, m={"lastActiveTime": ago(5), "waitingSince": ago(60)})], "m", NOW, 30.0)
    seen = with_demand(legacy, view)
    assert seen.status.last_active_time == NOW - timedelta(seconds=1)
    assert waiting_since_of(seen) == NOW - timedelta(seconds=600)
    assert with_demand(legacy, demand_view([], "m", NOW, 30.0)) is legacy
