"""The memory metrics of groups that pack by memory (flexinfer.observability.memory_metrics) over a real
dispatcher and registry: budget, used and reserved bytes per group, evictions by reason from zero, each model's
need with its source; the exposition passes ``promtool check metrics``."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, generate_latest

from flexinfer.api.model import Model
from flexinfer.core.arbiter.policy import ArbiterPolicy
from flexinfer.observability.memory_metrics import MemoryMetrics
from flexinfer.runtime.dispatcher import Dispatcher
from support.prometheus import check_metrics
from support.recording_engine import FakeClock, RecordingEngine, key

MIB = 1024 * 1024


def member(name: str, vram: int) -> Model:
    return Model.model_validate({"metadata": {"name": name}, "spec": {
        "backend": "llamacpp", "source": f"file:///m/{name}.gguf",
        "gpu": {"vendor": "amd", "shared": "g", "vramEstimateMB": vram}, "config": {"parallel": 4}}})


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


async def test_group_memory_evictions_and_needs_are_exposed_and_pass_promtool() -> None:
    engine, clock = RecordingEngine(), FakeClock()
    engine.memory = {"default/a": 500.0}
    policy = ArbiterPolicy(min_hold=0, drain_timeout=5, group_budgets={"g": 1000.0})
    registry = CollectorRegistry()
    async with Dispatcher(engine, [member("a", 600), member("b", 400), member("c", 700)], policy=policy,
                          clock=clock, auto_tick=False) as d:
        MemoryMetrics(d.memory_report, d.snapshot).register(registry)
        assert sample(registry, "flexinfer_sharedgroup_evictions_total", group="g", namespace="default",
                      reason="make_room") == 0
        engine.hold("default/b")
        (await d.acquire(key("a"), timeout=5)).release()
        started_b = asyncio.ensure_future(d.acquire(key("b"), timeout=5))
        await engine.wait_call("start", "default/b")
        await d.tick()
        group = {"group": "g", "namespace": "default"}
        assert sample(registry, "flexinfer_sharedgroup_memory_budget_bytes", **group) == 1000 * MIB
        assert sample(registry, "flexinfer_sharedgroup_memory_used_bytes", **group) == 500 * MIB
        assert sample(registry, "flexinfer_sharedgroup_memory_reserved_bytes", **group) == 400 * MIB
        engine.open("default/b")
        (await started_b).release()
        (await d.acquire(key("c"), timeout=5)).release()  # 700 MiB: both residents go
        assert sample(registry, "flexinfer_sharedgroup_evictions_total", reason="make_room", **group) == 2
        assert sample(registry, "flexinfer_model_memory_need_bytes", model="a", namespace="default",
                      source="measured") == 500 * MIB
        assert sample(registry, "flexinfer_model_memory_need_bytes", model="c", namespace="default",
                      source="declared") == 700 * MIB
        result = check_metrics(generate_latest(registry))
        assert result.ok and not result.findings, (result.error, result.findings)
