"""The manager's memory report (flexinfer.manager.memory_report) behind the memory collector: a group's figures
from its last election, evictions counted from zero, members' needs, a group forgotten when it stops packing; the
exposition (a group without a limit included) passes ``promtool check metrics``."""

from __future__ import annotations

import math
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, generate_latest

from flexinfer.core.active_set import elect_active_set
from flexinfer.core.election import Election, ElectionPolicy, Member, elect
from flexinfer.core.memory_need import MemoryNeed
from flexinfer.manager.memory_report import MemoryReport
from flexinfer.observability.memory_metrics import MemoryMetrics
from support.prometheus import check_metrics

NOW = datetime(2025, 1, 1, tzinfo=UTC)
MIB = 1024 * 1024


def packed(budget: float) -> Election:
    members = [Member("a", phase="Ready", state="Active", ready_since=NOW), Member("b", min_replicas=1)]
    needs = {"a": MemoryNeed(1000, "declared"), "b": MemoryNeed(budget if budget < math.inf else 0, "unknown")}
    return elect_active_set(members, NOW, ElectionPolicy(), group="ns/g", budget_mib=budget, needs=needs)


def test_the_report_follows_the_last_election_and_counts_evictions() -> None:
    report, registry = MemoryReport(), CollectorRegistry()
    MemoryMetrics(report.groups, report.needs).register(registry)
    report.record("ns", "g", packed(3000.0))
    report.evicted("ns", "g")
    labels = {"group": "g", "namespace": "ns"}
    assert registry.get_sample_value("flexinfer_sharedgroup_memory_budget_bytes", labels) == 3000 * MIB
    assert registry.get_sample_value("flexinfer_sharedgroup_memory_used_bytes", labels) == 1000 * MIB
    assert registry.get_sample_value("flexinfer_sharedgroup_evictions_total", {**labels, "reason": "make_room"}) == 1
    assert registry.get_sample_value("flexinfer_model_memory_need_bytes",
                                     {"model": "b", "namespace": "ns", "source": "unknown"}) == 3000 * MIB
    report.record("ns", "other", packed(math.inf))
    check_metrics(generate_latest(registry).decode())

    report.record("ns", "g", elect([Member("a")], NOW))
    assert [g["group"] for g in report.groups()] == ["ns/other"], "a group that stops packing leaves the report"
    assert {row.name for row in report.needs()} == {"a", "b"} and all(r.namespace == "ns" for r in report.needs())
