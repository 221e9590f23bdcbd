"""The manager's store: newest bodies win, units per model/group, pods and caches mapped to their models."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from flexinfer.manager import store as store_module
from flexinfer.manager.store import Store, Unit
from support.resource_builders import model_doc


def body(name: str, rv: int, **spec: Any) -> dict[str, Any]:
    doc = model_doc(name, "ns", **spec)
    doc["metadata"]["resourceVersion"] = str(rv)
    return doc


def test_models_map_to_their_group_or_themselves_and_older_bodies_are_ignored() -> None:
    store = Store()
    assert store.put("Model", body("a", 5, gpu={"shared": "g"})) == [Unit("ns", "g", True)]
    assert store.put("Model", body("b", 6)) == [Unit("ns", "b")]
    assert store.put("Model", body("a", 4)) == []
    assert [p.body["metadata"]["resourceVersion"] for p in store.unit_models(Unit("ns", "g", True))] == ["5"]


def test_moving_a_model_between_groups_reconciles_both() -> None:
    store = Store()
    store.put("Model", body("a", 1, gpu={"shared": "g1"}))
    assert store.put("Model", body("a", 2, gpu={"shared": "g2"})) == [Unit("ns", "g1", True), Unit("ns", "g2", True)]
    assert store.unit_models(Unit("ns", "g1", True)) == []


def test_invalid_models_are_kept_with_their_error() -> None:
    store = Store()
    store.put("Model", body("bad", 1, source="s3://x"))
    parsed = store.model("ns", "bad")
    assert parsed is not None and parsed.model is None and parsed.error is not None
    assert "spec.source" in str(parsed.error)


def test_deployments_and_pods_reconcile_their_model() -> None:
    store = Store()
    store.put("Model", body("a", 1))
    deployment = {"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "3"}}
    assert store.put("Deployment", deployment) == [Unit("ns", "a")]
    pod = {"metadata": {"name": "a-1", "namespace": "ns", "labels": {"flexinfer.ai/model": "a"}}}
    assert store.put("Pod", pod) == [Unit("ns", "a")]
    assert list(store.pods("ns", "a")) == [pod]
    assert store.remove("Pod", pod) == [Unit("ns", "a")] and list(store.pods("ns", "a")) == []
    assert store.put("Deployment", {"metadata": {"name": "orphan", "namespace": "ns"}}) == []


def test_the_store_remembers_when_a_pod_of_a_model_last_went() -> None:
    moments = iter([datetime(2025, 12, 31, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC),
                    datetime(2026, 1, 2, tzinfo=UTC)])
    store = Store(clock=lambda: next(moments))
    store.put("Model", body("a", 1))
    pods = [{"metadata": {"name": f"a-{i}", "namespace": "ns", "labels": {"flexinfer.ai/model": "a"}}} for i in (1, 2)]
    for pod in pods:
        store.put("Pod", pod)
    assert store.pods_gone_at("ns", "a") is None
    store.remove("Pod", pods[0])
    assert store.pods_gone_at("ns", "a") == datetime(2025, 12, 31, tzinfo=UTC), "a replica replaced"
    store.remove("Pod", pods[1])
    assert store.pods_gone_at("ns", "a") == datetime(2026, 1, 1, tzinfo=UTC)
    store.remove("Pod", pods[1])
    assert store.pods_gone_at("ns", "a") == datetime(2026, 1, 1, tzinfo=UTC), "a repeated deletion changes nothing"


def test_a_pod_the_manager_deleted_is_gone_at_once_and_its_late_events_are_ignored(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "REAPED_KEPT", 2)
    store = Store(clock=lambda: datetime(2026, 1, 1, tzinfo=UTC))
    store.put("Model", body("a", 1))
    pods = [{"metadata": {"name": f"a-{i}", "namespace": "ns", "labels": {"flexinfer.ai/model": "a"},
                          "resourceVersion": "5"}} for i in (1, 2, 3)]
    store.put("Pod", pods[0])
    store.forget_pod("ns", "a-1")
    assert list(store.pods("ns", "a")) == [] and store.pods_gone_at("ns", "a") == datetime(2026, 1, 1, tzinfo=UTC)
    assert store.put("Pod", {**pods[0], "metadata": {**pods[0]["metadata"], "resourceVersion": "6"}}) == []
    assert list(store.pods("ns", "a")) == [], "a late MODIFIED event does not bring it back"
    store.forget_pod("ns", "a-2")
    store.forget_pod("ns", "a-3")  # only the newest REAPED_KEPT names are kept
    store.put("Pod", pods[0])
    assert [p["metadata"]["name"] for p in store.pods("ns", "a")] == ["a-1"]


def test_a_deleted_pod_kept_by_finalizers_stays_in_the_store() -> None:
    store = Store()
    store.put("Model", body("a", 1))
    store.put("Pod", {"metadata": {"name": "a-1", "namespace": "ns", "labels": {"flexinfer.ai/model": "a"},
                                   "finalizers": ["example.com/audit"], "resourceVersion": "5"}})
    store.forget_pod("ns", "a-1")
    assert [p["metadata"]["name"] for p in store.pods("ns", "a")] == ["a-1"]
    assert store.pods_gone_at("ns", "a") is None


def test_a_modelcache_reconciles_the_models_it_matches() -> None:
    store = Store()
    store.put("Model", body("coder", 1, source="HF://org/coder"))
    store.put("Model", body("other", 1, source="HF://org/other"))
    cache = {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
             "metadata": {"name": "c", "namespace": "ns"}, "spec": {"source": "HF://org/coder"}}
    assert store.put("ModelCache", cache) == [Unit("ns", "coder")]
    assert [c.name for c in store.caches("ns")] == ["c"]


def test_a_stored_modelcache_with_an_unparsable_quantity_keeps_its_other_fields() -> None:
    store = Store()
    store.put("Model", body("coder", 1, source="HF://org/coder"))
    cache = {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache", "metadata": {"name": "c", "namespace": "ns"},
             "spec": {"source": "HF://org/coder",
                      "flashLoader": {"enabled": True, "concurrency": 7, "tmpfsSizeLimit": "16 gigs"}}}
    assert store.put("ModelCache", cache) == [Unit("ns", "coder")]
    (typed,) = store.caches("ns")
    assert typed.spec.flash_loader is not None
    assert (typed.spec.flash_loader.enabled, typed.spec.flash_loader.concurrency) == (True, 7)
    ((_, _, ignored),) = store.cache_problems("ns")
    assert [p.path for p in ignored] == ["spec.flashLoader.tmpfsSizeLimit"]


def test_a_stored_model_with_an_unparsable_quantity_is_kept_with_the_field_ignored() -> None:
    store = Store()
    store.put("Model", body("m", 1, cache={"strategy": "Local", "flashLoader": {"tmpfsSizeLimit": "16 gigs"}}))
    parsed = store.model("ns", "m")
    assert parsed is not None and parsed.model is not None and parsed.error is None
    assert [p.path for p in parsed.ignored] == ["spec.cache.flashLoader.tmpfsSizeLimit"]


def test_gpu_leases_reconcile_their_group() -> None:
    lease = {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "GPULease",
             "metadata": {"name": "l", "namespace": "ns"}, "spec": {"group": "g"}}
    store = Store()
    assert store.put("GPULease", lease) == [Unit("ns", "g", True)]
    assert [x.spec.group for x in store.leases("ns", "g")] == ["g"]
    assert store.leases("ns", "other") == [] and store.leases("elsewhere", "g") == []
    moved = {**lease, "spec": {"group": "h"}}
    assert store.put("GPULease", moved) == [Unit("ns", "g", True), Unit("ns", "h", True)], "left g, joined h"
    assert store.leases("ns", "g") == [] and [x.spec.group for x in store.leases("ns", "h")] == ["h"]
    assert store.remove("GPULease", moved) == [Unit("ns", "h", True)]
    assert store.leases("ns", "h") == []


def demand_body(name: str, models: dict[str, Any], renew: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"proxy": name, "models": models}
    if renew:
        spec["renewTime"] = renew
    return {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDemand",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}


def test_a_demand_report_reconciles_the_models_whose_entry_changed() -> None:
    store = Store()
    for name in ("a", "b"):
        store.put("Model", {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model",
                            "metadata": {"name": name, "namespace": "default", "resourceVersion": "1"},
                            "spec": {"backend": "vllm", "source": "HF://o/m"}})
    t = "2026-01-01T00:00:00Z"
    assert store.put("ModelDemand", demand_body("p", {"a": {"lastActiveTime": t}})) == [Unit("default", "a")]
    assert store.put("ModelDemand", demand_body("p", {"a": {"lastActiveTime": t}, "b": {"inFlightAt": t}})) == [
        Unit("default", "b")]
    assert store.put("ModelDemand", demand_body("p", {"a": {"lastActiveTime": t}, "b": {"inFlightAt": t}},
                                                renew=t)) == [Unit("default", "b")], "a renewal affects live entries"
    assert [d.spec.proxy for d in store.demands("default")] == ["p"]
    assert store.remove("ModelDemand", demand_body("p", {})) == [Unit("default", "a"), Unit("default", "b")]
    assert store.demands("default") == []
