"""The in-cluster status page's memory rows (flexinfer.cluster_proxy.memory_groups): one per group with a budget
and per namespace, from the members' status: Ready needs used, Active starting ones reserved, others left out."""

from __future__ import annotations

from typing import Any

from flexinfer.api.model import Model
from flexinfer.cluster_proxy.memory_groups import memory_groups
from support.resource_builders import make_model


def member(name: str, phase: str, state: str, need: float, *, namespace: str = "a", group: str = "gpu0",
           budget: float | None = 3000) -> Model:
    model = make_model(name, namespace, gpu={"vendor": "amd", "shared": group})
    shared: dict[str, Any] = {"groupName": group, "state": state, "memoryNeedMiB": need,
                              "memoryNeedSource": "declared"}
    if budget is not None:
        shared["memoryBudgetMiB"] = budget
    return model.model_copy(update={"status": model.status.model_validate({"phase": phase, "sharedGroup": shared})})


def test_rows_per_group_and_namespace_from_the_members_status() -> None:
    rows = memory_groups([
        member("ready", "Ready", "Active", 1000), member("loading", "Loading", "Active", 500),
        member("evicted", "Preempted", "Preempted", 700), member("queued", "Idle", "Queued", 400),
        member("other", "Ready", "Active", 200, namespace="b"),
        member("alone", "Ready", "Active", 100, group="solo", budget=None),
    ])
    assert rows == [
        {"group": "a/gpu0", "budget_mib": 3000, "used_mib": 1000, "reserved_mib": 500,
         "models": ["a/loading", "a/ready"]},
        {"group": "b/gpu0", "budget_mib": 3000, "used_mib": 200, "reserved_mib": 0, "models": ["b/other"]},
    ]


def test_no_group_with_a_budget_no_rows() -> None:
    assert memory_groups([member("alone", "Ready", "Active", 100, budget=None), make_model("plain")]) == []
