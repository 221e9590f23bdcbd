"""The activity log behind the status page: activations with stage offsets, the duration ring, errors."""

from __future__ import annotations

import logging

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
    assert snap["durations"] == [{"kind": "cold_start", "seconds": 2.0}, {"kind": "swap", "seconds": 3.5}]


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
