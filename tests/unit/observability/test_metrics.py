"""Tests for flexinfer.observability.metrics: exact samples for scripted lifecycles (through the real
dispatcher and arbiter), bounded labels, series removal, and ``promtool check metrics`` on the exposition."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, generate_latest

from flexinfer.core.arbiter.policy import ArbiterPolicy
from flexinfer.core.lifecycle_clock import STAGE_NAMES
from flexinfer.observability.metrics import REQUEST_STATUSES, LifecycleMetrics, ProxyMetrics
from flexinfer.runtime.dispatcher import Dispatcher
from support.prometheus import check_metrics
from support.recording_engine import FakeClock, RecordingEngine, key, make_model

LAT = {"model": "a", "namespace": "default", "backend": "llamacpp"}


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


async def scripted_swap(registry: CollectorRegistry) -> LifecycleMetrics:
    """b holds the GPU; a request for a (higher priority) swaps it in; a is Ready 35 s after the decision."""
    clock, engine = FakeClock(0.0), RecordingEngine(stages=())
    metrics = LifecycleMetrics(registry)
    a, b = make_model("a", group="g", priority=200), make_model("b", group="g", priority=100)
    async with Dispatcher(engine, [a, b], clock=clock, auto_tick=False, observer=metrics) as d:
        (await d.acquire(key("b"))).release()
        clock.advance(100)
        engine.hold(a.key)
        pending = asyncio.ensure_future(d.acquire(key("a")))
        await engine.wait_call("start", a.key)
        clock.advance(35)
        engine.open(a.key)
        (await pending).release()
        await d.wait_for(lambda: d.snapshot()[0].in_flight == 0, 5)
    return metrics


async def test_swap_timeline_exact_samples() -> None:
    registry = CollectorRegistry()
    await scripted_swap(registry)
    swap = {**LAT, "group": "g"}
    assert value(registry, "flexinfer_model_swap_duration_seconds_count", **swap) == 1
    assert value(registry, "flexinfer_model_swap_duration_seconds_sum", **swap) == 35
    assert value(registry, "flexinfer_model_swap_duration_seconds_bucket", **swap, le="34.0") == 0
    assert value(registry, "flexinfer_model_swap_duration_seconds_bucket", **swap, le="55.0") == 1
    cold = {**LAT, "cache_strategy": "Memory"}
    assert value(registry, "flexinfer_model_cold_start_duration_seconds_sum", **cold) == 35
    assert value(registry, "flexinfer_model_phase", model="a", namespace="default", phase="Idle") == 1
    assert value(registry, "flexinfer_model_phase", model="a", namespace="default", phase="Ready") == 0
    assert value(registry, "flexinfer_sharedgroup_preemptions_total", group="g", namespace="default",
                 **{"from": "b", "to": "a"}) == 1
    assert value(registry, "flexinfer_model_transitions_total", model="b", namespace="default",
                 reason="reconcile", **{"from": "Ready", "to": "Preempted"}) == 1
    assert value(registry, "flexinfer_sharedgroup_state", group="g", model="b", namespace="default",
                 state="Preempted") == 1
    assert value(registry, "flexinfer_model_startup_stage_duration_seconds_sum", **LAT, stage="drain") == 0
    assert value(registry, "flexinfer_model_startup_stage_duration_seconds_sum", **LAT, stage="server_start") == 35


async def test_a_pinned_models_crash_restart_is_a_cold_start_sample_from_the_crash_with_its_stages() -> None:
    """minReplicas 1, Ready; at t=100 its server is OOM-killed; the arbiter restarts it after its 5 s backoff
    and it is Ready 3 s into that start: one more cold-start sample of 8 s (Go records the same from the Ready
    condition's flip), whose stages add up to it (the backoff is server_start). It used to be 3 s."""
    registry, clock, engine = CollectorRegistry(), FakeClock(0.0), RecordingEngine()
    metrics = LifecycleMetrics(registry)
    model = make_model("a", minReplicas=1)
    async with Dispatcher(engine, [model], clock=clock, auto_tick=False, observer=metrics,
                          policy=ArbiterPolicy(restart_backoff=5)) as d:
        await d.wait_for(lambda: d.phase(model.key) == "Ready", 5)
        clock.advance(100)
        engine.hold(model.key)
        engine.crash(model.key)
        await d.wait_for(lambda: d.phase(model.key) == "Failed", 5)
        clock.advance(5)
        await d.tick()
        await engine.wait_call("start", model.key, times=2)
        await d.tick()  # the stages the engine reported as it started are applied at t=105
        clock.advance(3)
        engine.open(model.key)
        await d.wait_for(lambda: d.phase(model.key) == "Ready", 5)
    cold = {**LAT, "cache_strategy": "SharedPVC"}
    assert value(registry, "flexinfer_model_cold_start_duration_seconds_count", **cold) == 2
    assert value(registry, "flexinfer_model_cold_start_duration_seconds_sum", **cold) == 8
    stage_sums = {stage: value(registry, "flexinfer_model_startup_stage_duration_seconds_sum", **LAT, stage=stage)
                  for stage in ("server_start", "staging", "health")}
    assert stage_sums == {"server_start": 5, "staging": 0, "health": 3}
    assert value(registry, "flexinfer_model_startup_stage_duration_seconds_count", **LAT, stage="health") == 2
    assert value(registry, "flexinfer_model_transitions_total", model="a", namespace="default", reason="reconcile",
                 **{"from": "Ready", "to": "Failed"}) == 1


def test_stage_labels_bounded_and_forget_removes_series() -> None:
    registry = CollectorRegistry()
    metrics = LifecycleMetrics(registry)
    model = make_model("a")
    metrics.stage(model, "made_up", 1.0)
    metrics.stage(model, "staging", 2.0)
    metrics.phase_changed(model, "Idle", "Pending")
    metrics.cold_start(model, 3.0)
    text = generate_latest(registry).decode()
    assert "made_up" not in text and 'stage="staging"' in text
    metrics.forgotten(model)
    assert 'model="a"' not in generate_latest(registry).decode()


def test_reconcile_metrics() -> None:
    registry = CollectorRegistry()
    metrics = LifecycleMetrics(registry)
    metrics.reconcile_duration("model", 0.2)
    metrics.reconcile_error("model")
    assert value(registry, "flexinfer_reconcile_duration_seconds_bucket", controller="model", le="0.25") == 1
    assert value(registry, "flexinfer_reconcile_errors_total", controller="model") == 1


def test_proxy_metrics_label_only_declared_models() -> None:
    registry = CollectorRegistry()
    proxy = ProxyMetrics(registry, ["default/a"])
    a = {"model": "a", "namespace": "default"}
    assert value(registry, "flexinfer_proxy_requests_total", **a, status="success") == 0
    proxy.request_finished("default/a", "success", 0.3)
    proxy.request_finished("default/nope", "error", 0.1)
    proxy.request_finished(None, "weird-status", 0.1)
    assert value(registry, "flexinfer_proxy_requests_total", model="", namespace="", status="error") == 2
    proxy.wait_started("default/a")
    assert value(registry, "flexinfer_proxy_queue_depth", **a) == 1
    proxy.wait_finished("default/a", 4.0, "granted")
    proxy.activation_finished("default/a", 4.0, "granted")
    proxy.wait_started("default/a")
    proxy.wait_finished("default/a", 2.0, "rejected")
    proxy.activation_finished("default/a", 2.0, "cancelled")
    assert value(registry, "flexinfer_proxy_queue_depth", **a) == 0
    assert value(registry, "flexinfer_proxy_queue_rejected_total", **a) == 1
    assert value(registry, "flexinfer_proxy_activation_duration_seconds_sum", **a, result="success") == 4
    assert value(registry, "flexinfer_proxy_queue_wait_duration_seconds_count", **a) == 2
    proxy.declare_models(["default/b"])
    assert 'model="a"' not in generate_latest(registry).decode()


def test_proxy_metrics_keep_one_name_in_two_namespaces_apart() -> None:
    registry = CollectorRegistry()
    proxy = ProxyMetrics(registry, ["default/chat", "team-b/chat"])
    proxy.request_finished("team-b/chat", "success", 0.2)
    proxy.connection_opened("default/chat")
    assert value(registry, "flexinfer_proxy_requests_total", model="chat", namespace="team-b", status="success") == 1
    assert value(registry, "flexinfer_proxy_requests_total", model="chat", namespace="default", status="success") == 0
    assert value(registry, "flexinfer_proxy_active_connections", model="chat", namespace="default") == 1
    assert value(registry, "flexinfer_proxy_active_connections", model="chat", namespace="team-b") == 0
    proxy.declare_models(["default/chat"])
    text = generate_latest(registry).decode()
    assert 'namespace="team-b"' not in text and 'model="chat",namespace="default"' in text


async def test_exposition_passes_promtool() -> None:
    registry = CollectorRegistry()
    metrics = await scripted_swap(registry)
    metrics.reconcile_duration("model", 0.1)
    metrics.reconcile_error("model")
    proxy = ProxyMetrics(registry, ["a", "b"])
    proxy.request_finished("a", "success", 0.5)
    proxy.connection_opened("a")
    proxy.wait_started("b")
    proxy.wait_finished("b", 1.0, "timeout")
    proxy.activation_finished("b", 1.0, "timeout")
    proxy.rate_limited("a", "model")
    proxy.shutdown("completed", 2.0)
    result = check_metrics(generate_latest(registry))
    assert result.ok, (result.error, result.findings)


def series(registry: CollectorRegistry, fragment: str) -> list[str]:
    """Exposition lines (no comments) that contain ``fragment``."""
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if fragment in line and not line.startswith("#")]


def test_a_declared_model_has_every_counter_and_histogram_series_at_zero() -> None:
    registry = CollectorRegistry()
    metrics = LifecycleMetrics(registry)
    a, b, solo = make_model("a", group="g"), make_model("b", group="g"), make_model("solo")
    for model in (a, b, solo):
        metrics.declared(model)
    metrics.declared(a)  # idempotent
    assert value(registry, "flexinfer_model_cold_start_duration_seconds_count", **LAT, cache_strategy="Memory") == 0
    assert value(registry, "flexinfer_model_swap_duration_seconds_count", **LAT, group="g") == 0
    for stage in STAGE_NAMES:
        assert value(registry, "flexinfer_model_startup_stage_duration_seconds_count", **LAT, stage=stage) == 0
    assert value(registry, "flexinfer_model_transitions_total", model="a", namespace="default", reason="reconcile",
                 **{"from": "Loading", "to": "Ready"}) == 0
    for loser, winner in (("a", "b"), ("b", "a")):
        assert value(registry, "flexinfer_sharedgroup_preemptions_total", group="g", namespace="default",
                     **{"from": loser, "to": winner}) == 0
    assert not series(registry, 'flexinfer_model_swap_duration_seconds_count{backend="llamacpp",group="",model="solo"')
    assert not series(registry, 'from="solo"') and not series(registry, 'to="solo"')


def test_forgetting_a_model_removes_its_series_and_the_pairs_it_is_part_of() -> None:
    registry = CollectorRegistry()
    metrics = LifecycleMetrics(registry)
    a, b = make_model("a", group="g"), make_model("b", group="g")
    metrics.declared(a)
    metrics.declared(b)
    metrics.preempted(a, b.name)
    metrics.forgotten(b)
    assert not series(registry, 'model="b"')
    assert not series(registry, '"b"'), "a preemption series naming b survived"
    assert value(registry, "flexinfer_model_swap_duration_seconds_count", **LAT, group="g") == 0
    metrics.declared(make_model("c", group="g"))
    assert value(registry, "flexinfer_sharedgroup_preemptions_total", group="g", namespace="default",
                 **{"from": "c", "to": "a"}) == 0


async def test_the_local_engine_declares_models_before_any_event_and_forgets_removed_ones() -> None:
    registry = CollectorRegistry()
    metrics = LifecycleMetrics(registry)
    a, b = make_model("a", group="g"), make_model("b", group="g")
    async with Dispatcher(RecordingEngine(stages=()), [a, b], clock=FakeClock(0.0), auto_tick=False,
                          observer=metrics) as d:
        await d.tick()
        assert value(registry, "flexinfer_model_swap_duration_seconds_count", **LAT, group="g") == 0
        assert value(registry, "flexinfer_sharedgroup_preemptions_total", group="g", namespace="default",
                     **{"from": "b", "to": "a"}) == 0
        await d.replace_models([a, make_model("c", group="g")])
        assert not series(registry, '"b"')
        assert value(registry, "flexinfer_model_swap_duration_seconds_count", model="c", namespace="default",
                     backend="llamacpp", group="g") == 0


def test_proxy_declares_every_bounded_series_at_zero_and_drops_them_with_the_model() -> None:
    registry = CollectorRegistry()
    proxy = ProxyMetrics(registry, ["default/a"])
    for status in REQUEST_STATUSES:
        assert value(registry, "flexinfer_proxy_requests_total", model="a", namespace="default", status=status) == 0
    for result in ("success", "failure"):
        assert value(registry, "flexinfer_proxy_activation_duration_seconds_count", model="a", namespace="default",
                     result=result) == 0
    for scope in ("model", "global"):
        assert value(registry, "flexinfer_proxy_rate_limited_total", model="a", namespace="default", scope=scope) == 0
    for name in ("flexinfer_proxy_request_duration_seconds_count", "flexinfer_proxy_queue_wait_duration_seconds_count",
                 "flexinfer_proxy_queued_requests_total", "flexinfer_proxy_queue_rejected_total",
                 "flexinfer_proxy_queue_depth", "flexinfer_proxy_active_connections"):
        assert value(registry, name, model="a", namespace="default") == 0, name
    assert value(registry, "flexinfer_proxy_requests_total", model="", namespace="", status="error") == 0
    a = {"model": "a", "namespace": "default"}
    assert value(registry, "flexinfer_proxy_request_duration_seconds_bucket", **a, le="600.0") == 0
    proxy.declare_models([])
    assert not series(registry, 'model="a"')


def test_request_duration_buckets_fit_llm_requests() -> None:
    """A 44 s chat and a 9-minute stream land in finite buckets that tell them apart (not all in ``+Inf``)."""
    registry = CollectorRegistry()
    proxy = ProxyMetrics(registry, ["default/a"])
    proxy.request_finished("default/a", "success", 44.0)
    proxy.request_finished("default/a", "success", 540.0)
    bucket = "flexinfer_proxy_request_duration_seconds_bucket"
    assert value(registry, bucket, model="a", namespace="default", le="30.0") == 0
    assert value(registry, bucket, model="a", namespace="default", le="60.0") == 1
    assert value(registry, bucket, model="a", namespace="default", le="450.0") == 1
    assert value(registry, bucket, model="a", namespace="default", le="600.0") == 2


async def test_the_event_loop_task_gauge_counts_the_tasks_of_the_proxys_loop() -> None:
    registry = CollectorRegistry()
    ProxyMetrics(registry, [])
    before = registry.get_sample_value("flexinfer_proxy_event_loop_tasks")
    release = asyncio.Event()
    extra = [asyncio.ensure_future(release.wait()) for _ in range(3)]
    assert registry.get_sample_value("flexinfer_proxy_event_loop_tasks") == before + 3
    release.set()
    await asyncio.gather(*extra)
    assert registry.get_sample_value("flexinfer_proxy_event_loop_tasks") == before


def test_the_event_loop_task_gauge_is_zero_without_a_loop() -> None:
    registry = CollectorRegistry()
    ProxyMetrics(registry, [])
    assert registry.get_sample_value("flexinfer_proxy_event_loop_tasks") == 0
