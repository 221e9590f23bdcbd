"""The dispatcher's lifecycle lines (``flexinfer.lifecycle``) name the real cause of every stop and the error
and backoff of every failure, taken from the phase change itself (no read-back of the dispatcher's state)."""

from __future__ import annotations

import logging

import pytest

from flexinfer.api.model import Model
from flexinfer.core.arbiter.policy import ArbiterPolicy
from flexinfer.observability.lifecycle_log import LifecycleLog
from flexinfer.runtime.dispatcher import Dispatcher
from support.recording_engine import FakeClock, RecordingEngine, key, make_model

POLICY = ArbiterPolicy(max_wait=30, min_hold=0, drain_timeout=20, cold_start_timeout=60, restart_backoff=5)


def stops(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.__dict__["model"], r.__dict__["reason"]) for r in caplog.records if r.__dict__.get("event") == "stopped"]


@pytest.fixture
def lines(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="flexinfer.lifecycle")
    return caplog


async def test_each_stop_names_its_cause(lines: pytest.LogCaptureFixture) -> None:
    engine, clock = RecordingEngine(), FakeClock()
    models = [make_model("a", group="g", priority=100), make_model("b", group="g", priority=200),
              make_model("idle", idleTimeout="10s"), make_model("c")]
    async with Dispatcher(engine, models, policy=POLICY, clock=clock, auto_tick=False,
                          observer=LifecycleLog(clock)) as d:
        assert await d.preload(key("a"), wait=True, timeout=5) == "Ready"
        (await d.acquire(key("b"))).release()  # b outranks a in group g: a is preempted
        await d.unload(key("b"))
        await engine.wait_call("stop", "default/b")
        (await d.acquire(key("idle"))).release()
        await d.tick()  # the release is handled at this time: the idle timeout counts from here
        clock.advance(11)
        await d.tick()
        await engine.wait_call("stop", "default/idle")
        assert await d.preload(key("c"), wait=True, timeout=5) == "Ready"
        await d.replace_models(models[:3])
        await engine.wait_call("stop", "default/c")
        assert await d.preload(key("a"), wait=True, timeout=5) == "Ready"
    assert stops(lines) == [("default/a", "preempted by default/b"), ("default/b", "unloaded"),
                            ("default/idle", "idle timeout"), ("default/c", "removed from the manifests"),
                            ("default/a", "shutdown")]


async def test_a_failed_start_logs_the_error_and_the_backoff(lines: pytest.LogCaptureFixture) -> None:
    engine, clock = RecordingEngine(), FakeClock()
    engine.fail_next("default/a", "weights missing\nsecond line")
    async with Dispatcher(engine, [make_model("a")], policy=POLICY, clock=clock, auto_tick=False,
                          observer=LifecycleLog(clock)) as d:
        assert await d.preload(key("a"), wait=True, timeout=5) == "Failed"
    failed = [r for r in lines.records if r.__dict__.get("event") == "start_failed"]
    assert [r.getMessage() for r in failed] == [
        "model default/a: server failed to start: weights missing; next start allowed in 5.0s (backoff)"]
    assert failed[0].levelname == "WARNING" and failed[0].__dict__["backoff_s"] == 5.0


async def test_an_eviction_from_a_group_that_packs_by_memory_says_what_it_made_room_for(
        lines: pytest.LogCaptureFixture) -> None:
    engine, clock = RecordingEngine(), FakeClock()
    models = [Model.model_validate({"metadata": {"name": name}, "spec": {
        "backend": "llamacpp", "source": f"file:///m/{name}.gguf", "config": {"parallel": 4},
        "gpu": {"vendor": "amd", "shared": "g", "vramEstimateMB": 700}}}) for name in ("a", "b")]
    policy = ArbiterPolicy(min_hold=0, drain_timeout=20, group_budgets={"g": 1000.0})
    async with Dispatcher(engine, models, policy=policy, clock=clock, auto_tick=False,
                          observer=LifecycleLog(clock)) as d:
        (await d.acquire(key("a"))).release()
        (await d.acquire(key("b"))).release()
    assert stops(lines)[0] == ("default/a", "evicted from GPU group default/g to make room for default/b (needs "
                                            "700 MiB (declared); 300 of 1000 MiB free)")
