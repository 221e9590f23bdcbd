"""The dispatcher's side of groups that pack by memory (flexinfer.runtime.dispatcher): the engine's estimates run
in a worker thread before the arbiter first sees a model (at start and on replace), a measurement reported by
the engine replaces them, members that fit run side by side, and the snapshot and ``memory_report`` show the
figures."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from flexinfer.api.model import Model
from flexinfer.core.arbiter.policy import ArbiterPolicy
from flexinfer.runtime.dispatcher import Dispatcher
from support.recording_engine import FakeClock, RecordingEngine, key

POLICY = ArbiterPolicy(max_wait=30, min_hold=0, drain_timeout=20, cold_start_timeout=60,
                       group_budgets={"g": 1000.0})


def member(name: str, group: str = "g", vram: int | None = None) -> Model:
    gpu: dict[str, Any] = {"vendor": "amd", "shared": group}
    if vram is not None:
        gpu["vramEstimateMB"] = vram
    return Model.model_validate({"metadata": {"name": name}, "spec": {
        "backend": "llamacpp", "source": f"file:///m/{name}.gguf", "gpu": gpu, "config": {"parallel": 4}}})


class Estimates:
    """An ``estimate`` callable that records the models it was asked about and on which thread."""

    def __init__(self, figures: dict[str, float]) -> None:
        self.figures, self.asked, self.threads = figures, [], set()

    def __call__(self, model: Model) -> float | None:
        self.asked.append(model.name)
        self.threads.add(threading.get_ident())
        if model.name == "broken":
            raise ValueError("not a GGUF")
        return self.figures.get(model.name)


def needs(d: Dispatcher) -> dict[str, tuple[float | None, str | None]]:
    return {s.name: (s.need_mib, s.need_source) for s in d.snapshot()}


async def test_estimates_run_off_the_loop_only_for_members_of_a_budgeted_group_without_a_declared_need(
        engine: RecordingEngine, clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    estimate = Estimates({"a": 400.0, "other": 50.0})
    models = [member("a"), member("b", vram=300), member("other", group="h"), member("broken")]
    caplog.set_level(logging.WARNING, logger="flexinfer.runtime.dispatcher")
    async with Dispatcher(engine, models, policy=POLICY, clock=clock, auto_tick=False, estimate=estimate) as d:
        await d.tick()
        assert sorted(estimate.asked) == ["a", "broken"] and threading.get_ident() not in estimate.threads
        assert needs(d) == {"a": (400.0, "estimated"), "b": (300.0, "declared"), "other": (None, None),
                            "broken": (1000.0, "unknown")}
        assert "model default/broken: no memory estimate (not a GGUF)" in caplog.text
        await d.replace_models([*models, member("c")])
        assert estimate.asked[2:] == ["a", "broken", "c"], "a reload estimates the members again (the files may differ)"
        assert needs(d)["c"] == (1000.0, "unknown")  # no figure for it: the whole budget


async def test_members_that_fit_run_side_by_side_and_the_measured_figure_replaces_the_estimate(
        engine: RecordingEngine, clock: FakeClock) -> None:
    engine.memory = {"default/a": 250.0, "default/b": 350.0}
    estimate = Estimates({"a": 400.0, "b": 400.0})
    async with Dispatcher(engine, [member("a"), member("b")], policy=POLICY, clock=clock, auto_tick=False,
                          estimate=estimate) as d:
        for name in ("a", "b", "a", "b"):
            grant = await d.acquire(key(name), timeout=5)
            grant.release()
        assert [call for call in engine.calls if call[0] in ("start", "stop")] == [
            ("start", "default/a"), ("start", "default/b")]
        assert needs(d) == {"a": (250.0, "measured"), "b": (350.0, "measured")}
        assert d.memory_report() == [{"group": "default/g", "budget_mib": 1000.0, "used_mib": 600.0,
                                      "reserved_mib": 0.0, "models": ["default/a", "default/b"],
                                      "evictions": {"make_room": 0, "out_of_memory": 0}}]
