"""The activity log behind the status page: activations with stage offsets (from each row's origin, never
negative, even when requests queued before the decision), the duration ring, errors."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from flexinfer.core.lifecycle_clock import Activation
from flexinfer.runtime.activity import ActivityLog, ErrorLogHandler
from flexinfer.runtime.observer import ActivationRecord
from support.resource_builders import make_model


def record(name: str, kind: str, start: float, end: float, result: str = "success",
           preempted: str | None = None) -> ActivationRecord:
    model = make_model(name, gpu={"shared": "g"})
    stages = (("drain", start, start + 1.0), ("server_start", start + 1.0, end))
    return ActivationRecord(model, kind, start, end, stages, (), result,
                            make_model(preempted) if preempted else None)


def test_activations_are_newest_first_with_stage_offsets_and_wall_times() -> None:
    activity = ActivityLog(clock=lambda: 100.0, wall=lambda: 1_000_000.0)
    activity.activation(record("a", "cold_start", 90.0, 92.0))
    activity.activation(record("b", "swap", 95.0, 98.5, preempted="a"))
    snap = activity.snapshot()
    newest = snap["activations"][0]
    assert newest["model"] == "default/b" and newest["kind"] == "swap" and newest["preempted"] == "default/a"
    assert newest["group"] == "g" and newest["seconds"] == 3.5
    assert newest["started_at"] == 1_000_000.0 - 5.0
    assert newest["stages"] == [{"stage": "drain", "start": 0.0, "end": 1.0},
                                {"stage": "server_start", "start": 1.0, "end": 3.5}]
    assert newest["decision"] == 0.0
    assert snap["durations"] == [{"kind": "cold_start", "seconds": 2.0}, {"kind": "swap", "seconds": 3.5}]


def queued_swap(demand_since: float, decided_at: float, ready_at: float) -> ActivationRecord:
    """A swap whose first request waited from ``demand_since`` (the lifecycle clock's own spans: queue, drain
    until decision + 1 s, then server_start and health)."""
    clock = Activation("default/b", decided_at, kind="swap", preempted="default/a", demand_since=demand_since)
    clock.start(decided_at + 1.0)
    clock.mark("server_start", decided_at + 1.0)
    clock.mark("health", ready_at - 1.0)
    spans = tuple((s.stage, s.start, s.end) for s in clock.finish(ready_at).stages)
    return ActivationRecord(make_model("b", gpu={"shared": "g"}), "swap", decided_at, ready_at, spans, (),
                            preempted=make_model("a"))


def test_a_queued_activation_row_starts_at_its_first_waiting_request() -> None:
    activity = ActivityLog(clock=lambda: 100.0, wall=lambda: 1_000_000.0)
    activity.activation(queued_swap(demand_since=93.5, decided_at=95.0, ready_at=98.5))
    row = activity.snapshot()["activations"][0]
    assert row["stages"] == [{"stage": "queue", "start": 0.0, "end": 1.5},
                             {"stage": "drain", "start": 1.5, "end": 2.5},
                             {"stage": "server_start", "start": 2.5, "end": 4.0},
                             {"stage": "health", "start": 4.0, "end": 5.0}]
    assert row["decision"] == 1.5
    assert row["seconds"] == 3.5 and row["started_at"] == 1_000_000.0 - 5.0  # decision → Ready, as before
    assert activity.snapshot()["durations"] == [{"kind": "swap", "seconds": 3.5}]


def test_no_stage_offset_is_negative_and_every_row_starts_at_zero() -> None:
    activity = ActivityLog()
    for waited in (0.0, 0.000_001, 0.25, 7.0, 65.0):
        activity.activation(queued_swap(demand_since=1_000.0 - waited, decided_at=1_000.0, ready_at=1_003.0))
    rows: list[dict[str, Any]] = json.loads(json.dumps(activity.snapshot()["activations"]))  # as the page reads it
    assert [row["decision"] for row in rows] == [65.0, 7.0, 0.25, 0.000_001, 0.0]
    for row in rows:
        starts = [s["start"] for s in row["stages"]]
        assert min(starts) == 0.0, row
        assert all(0.0 <= s["start"] <= s["end"] for s in row["stages"]), row
        assert row["decision"] + row["seconds"] == pytest.approx(max(s["end"] for s in row["stages"])), row


def test_a_failed_activation_is_an_error_and_not_a_latency_sample() -> None:
    activity = ActivityLog(wall=lambda: 5.0)
    activity.activation(record("a", "cold_start", 0.0, 4.0, result="failure"))
    activity.phase_changed(make_model("a"), "Loading", "Failed")
    activity.phase_changed(make_model("a"), "Failed", "Failed")
    snap = activity.snapshot()
    assert snap["durations"] == []
    assert [e["message"] for e in snap["errors"]] == ["phase Loading -> Failed", "cold start failed after 4.0s"]


def test_rings_are_bounded() -> None:
    activity = ActivityLog(max_activations=2, max_durations=3, max_errors=1)
    for i in range(5):
        activity.activation(record(f"m{i}", "cold_start", 0.0, float(i + 1)))
        activity.error("x", f"e{i}")
    snap = activity.snapshot()
    assert [a["model"] for a in snap["activations"]] == ["default/m4", "default/m3"]
    assert [d["seconds"] for d in snap["durations"]] == [3.0, 4.0, 5.0]
    assert [e["message"] for e in snap["errors"]] == ["e4"]


def test_the_log_handler_copies_warnings_with_their_logger_and_time() -> None:
    activity = ActivityLog()
    logger = logging.getLogger("flexinfer.test_activity")
    handler = ErrorLogHandler(activity)
    logger.addHandler(handler)
    try:
        logger.info("not copied")
        logger.warning("model %s crashed", "a")
    finally:
        logger.removeHandler(handler)
    errors = activity.snapshot()["errors"]
    assert len(errors) == 1
    assert errors[0]["source"] == "flexinfer.test_activity" and errors[0]["message"] == "model a crashed"
